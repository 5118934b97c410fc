"""Context parallel for Hugging Face causal LMs (models/hf.py): parabench's attention functions,
registered in transformers' attention registry under their own names and set on the split model's
config alone, so that the registry's `sdpa` and any other model in the process stay as they were
(DeepSpeed's UlyssesSPAttentionHF overrides the `sdpa` entry itself).

The model's attention modules project q, k and v of this rank's share of the sequence as always,
with rotary or learned positions from the position ids the hook passes, then call the function
their config names. all-to-all exchanges them (models/all_to_all_attention.py) and calls the
model's own implementation (sdpa, flash) on whole sequences of a share of the heads; ring hands them
to torch's ring SDPA (models/ring_attention.py). Neither is given a mask: transformers builds none for
an implementation its mask registry does not know, and both attend causally over the whole
sequence, which is a causal LM's mask on unpadded sequences. Models whose layers mask more than
that (sliding windows, chunks) are refused, as Accelerate refuses them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.distributed.device_mesh import DeviceMesh

from models.all_to_all_attention import all_to_all_attention
from models.context_parallel import ContextParallelError, UnsplittableModel, fitting_sizes
from models.hf import HFCausalLM
from models.ring_attention import ring_sdpa

ALL_TO_ALL = "parabench-all-to-all"
RING = "parabench-ring"
# The implementations that, given no mask, mask causally over the sequence they receive.
CAUSAL_WITHOUT_A_MASK = ("sdpa", "flash_attention_2", "flash_attention_3")


@dataclass(frozen=True)
class _Split:
    mesh: DeviceMesh  # the context-parallel group's
    core: Callable[..., tuple[torch.Tensor, Any]]  # the model's own attention function


# Each split model's config (held here, so that its id stays its own) and its split: an attention
# function knows the model only by the `config` of the module that calls it, from which that
# module read the function's name.
_SPLITS: dict[int, tuple[Any, _Split]] = {}


def check_hf(model: HFCausalLM, cp_size: int, attention: str, tp_size: int) -> None:
    """Refuse a model whose attention parabench cannot reach or whose mask it cannot keep, and,
    for all-to-all, heads that the group cannot share out."""
    hf, config = model.hf, model.hf.config.get_text_config()
    name = type(hf).__name__
    if not type(hf)._can_set_attn_implementation():
        raise UnsplittableModel(
            f"{name} computes its attention in its own code, not through transformers' attention registry, "
            "so context parallel cannot reach it: use fsdp or fsdp-tp for this model"
        )
    if "position_ids" not in inspect.signature(hf.forward).parameters:
        raise UnsplittableModel(
            f"{name}'s forward takes no position_ids, so each rank's share of a sequence would be embedded "
            "from position 0: use fsdp or fsdp-tp for this model"
        )
    limited = _masked_beyond_causal(config)
    if limited:
        raise UnsplittableModel(
            f"{name} has {' and '.join(limited)} layers, whose mask context parallel cannot keep "
            "(it attends causally over the whole sequence): use fsdp or fsdp-tp for this model"
        )
    core = config._attn_implementation
    if attention == "ring" and core != "sdpa":
        raise UnsplittableModel(
            f"cp_attention=ring replaces torch's SDPA, and {name} runs attn_implementation={core!r}: "
            "use cp_attention=all-to-all"
        )
    if attention == "all-to-all" and core not in CAUSAL_WITHOUT_A_MASK:
        raise UnsplittableModel(
            f"{name} runs attn_implementation={core!r}, which needs a mask to be causal: context parallel "
            f"runs one of {', '.join(CAUSAL_WITHOUT_A_MASK)}"
        )
    if attention == "all-to-all":
        _check_heads(name, config, cp_size, tp_size)


def _masked_beyond_causal(config: Any) -> list[str]:
    """The kinds of layer that mask more than causally (Accelerate's rule: `layer_types`, else a
    sliding window on every layer wherever `sliding_window` is set)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return sorted({kind for kind in layer_types if kind != "full_attention"})
    return ["sliding_attention"] if getattr(config, "sliding_window", None) else []


def _check_heads(name: str, config: Any, cp_size: int, tp_size: int) -> None:
    """Each rank of the group gets heads / cp of the query heads and of the key/value heads, or,
    with fewer key/value heads than ranks, the one its queries read, repeated."""
    heads = int(config.num_attention_heads) // tp_size
    kv_heads = max(1, int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads) // tp_size)
    fits = [d for d in fitting_sizes(heads) if kv_heads % d == 0 or d % kv_heads == 0]
    if cp_size not in fits:
        held = "each tensor-parallel rank's " if tp_size > 1 else ""
        raise ContextParallelError(
            f"cp_size={cp_size} does not share out {name}'s {held}{heads} attention heads and {kv_heads} key/value "
            f"heads (the all-to-all gives each rank whole heads): use strategy_options.cp_size="
            f"{' or '.join(map(str, fits))}, or strategy_options.cp_attention=ring"
        )


def split_hf(model: HFCausalLM, mesh: DeviceMesh, attention: str, positions: Callable[[], torch.Tensor]) -> None:
    """Set parabench's attention function on this model's config; `positions()` gives the positions
    of the share the current forward computes on, passed to the model as its position ids."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    hf = model.hf
    name = RING if attention == "ring" else ALL_TO_ALL
    AttentionInterface.register(name, _ring if attention == "ring" else _all_to_all)
    split = _Split(mesh, ALL_ATTENTION_FUNCTIONS[hf.config.get_text_config()._attn_implementation])
    for config in (hf.config, hf.config.get_text_config()):
        _SPLITS[id(config)] = (config, split)
    hf.set_attn_implementation(name)
    if hf.config.get_text_config()._attn_implementation != name:
        raise UnsplittableModel(f"{type(hf).__name__} kept its attention implementation: use fsdp or fsdp-tp for it")
    hf.register_forward_pre_hook(
        lambda module, args, kwargs: (args, {**kwargs, "position_ids": positions().unsqueeze(0)}), with_kwargs=True
    )


def _split_of(module: torch.nn.Module) -> _Split:
    held = _SPLITS.get(id(getattr(module, "config", None)))
    if held is None:
        raise RuntimeError(f"{type(module).__name__} calls context-parallel attention, but its model was not split")
    return held[1]


def _all_to_all(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """q (batch, heads, share, head_dim), k and v likewise with the key/value heads -> (batch,
    share, heads, head_dim), as transformers' attention functions return it."""
    split = _split_of(module)
    # The share's position ids: an implementation would read their offset as packed sequences,
    # while the exchanged sequences are whole and unpacked.
    kwargs.pop("position_ids", None)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if hasattr(module, "num_key_value_groups"):
            # What an implementation repeats each key/value head by (sdpa without enable_gqa): the
            # ratio on this rank, which key/value heads repeated before the exchange change.
            module.num_key_value_groups = q.size(1) // k.size(1)
        return split.core(module, q, k, v, None, **kwargs)[0]

    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return all_to_all_attention(q, k, v, split.mesh.get_group(), attend), None


def _ring(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """As _all_to_all, through torch's ring SDPA; key/value heads repeated to the query heads
    first, as transformers' sdpa does where it does not pass enable_gqa."""
    split = _split_of(module)
    groups = query.size(1) // key.size(1)
    if groups > 1:
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    y = ring_sdpa(query, key, value, split.mesh, dropout_p=dropout, scale=scaling)
    return y.transpose(1, 2).contiguous(), None
