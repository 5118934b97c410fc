"""Hugging Face transformers architectures, built from their config class with no download.

`model=hf:LlamaConfig model_kwargs.hidden_size=256 model_kwargs.num_hidden_layers=4`
builds `AutoModelForCausalLM.from_config(LlamaConfig(...))` with random weights
(`hf:llama`, a model type, works too). The wrapper keeps parabench's model
contract: `forward(inputs, targets) -> loss`, `num_params()`, `flops_per_token()`,
`transformer_blocks()`, `vocab_size` and an `activation_checkpointing` switch.

A mixture-of-experts model (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3, gpt-oss: transformers 5 holds
their experts stacked, models/routing.py) counts its active parameters (each token's top-k experts),
counts what its routers send each expert (a tally on each experts module), and, where its config
sets output_router_logits, adds router_aux_loss_coef x the model's own load-balancing loss to the
cross-entropy, as its own forward does given labels. That loss is computed for each sequence and
averaged (transformers pools the whole batch, which would make it depend on how the global batch
is split over ranks and micro-steps): every layout trains on what the one-process reference does.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.routing import RouterTally, experts_modules


class HFModelError(ValueError):
    """An `hf:` spec that cannot be built (one line, says what to do)."""


def _config_class(name: str) -> type:
    try:
        import transformers
    except ImportError as exc:
        raise HFModelError(
            f"model hf:{name} needs the transformers package ({exc}): pip install transformers"
        ) from None
    if "/" in name or name.endswith(".json"):
        where = "" if Path(name).exists() else f" (and {name} does not exist)"
        raise HFModelError(
            f"model hf:{name}: a run builds a Hugging Face model from its config class or model type (hf:LlamaConfig "
            f"or hf:llama, sizes in model_kwargs); a config.json or its folder is read by `plan` only{where}"
        )
    if name.endswith("Config"):
        cls = getattr(transformers, name, None)
        if cls is None or not isinstance(cls, type):
            raise HFModelError(
                f"model hf:{name}: transformers has no config class {name!r} (for example hf:LlamaConfig)"
            )
        return cls
    try:
        return type(transformers.AutoConfig.for_model(name))
    except ValueError:
        raise HFModelError(
            f"model hf:{name}: not a transformers config class or model type (for example hf:LlamaConfig or hf:llama)"
        ) from None


def _known_fields(cls: type) -> set[str]:
    # Every class of the hierarchy: in transformers 5.0 the common fields (dtype, ...) are
    # PretrainedConfig.__init__'s alone; later releases make every config a dataclass.
    names = set().union(*(inspect.signature(c.__init__).parameters for c in cls.__mro__ if "__init__" in vars(c)))
    names -= {"self", "args", "kwargs"}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names | set(getattr(cls, "attribute_map", {}))


def build_config(name: str, kwargs: dict[str, Any]) -> Any:
    """The config object for `hf:<name>` with `kwargs` as its sizes; a misspelt field is an error
    (a config class would keep it as a stray attribute and silently build the default size)."""
    cls = _config_class(name)
    unknown = sorted(set(kwargs) - _known_fields(cls))
    if unknown:
        raise HFModelError(f"model hf:{name}: {cls.__name__} has no field {', '.join(unknown)}; check the spelling")
    for key, value in kwargs.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key == "pad_token_id":
            continue
        if value < 0 or (value == 0 and not _may_be_zero(key)):
            raise HFModelError(f"model hf:{name}: model_kwargs.{key}={value} must be positive")
    try:
        return cls(**kwargs)
    except Exception as exc:  # the config's own validators: one line, not a traceback
        raise HFModelError(
            f"model hf:{name}: {cls.__name__} rejected {kwargs}: {str(exc).splitlines()[-1].strip()}"
        ) from None


def _may_be_zero(key: str) -> bool:
    """Whether a config field is a probability, a loss coefficient or a token id (0 is a value
    like any other: no dropout, no auxiliary loss, the first token), not a size."""
    return any(part in key for part in ("dropout", "pdrop", "_coef", "token_id", "jitter"))


class HFCausalLM(nn.Module):
    """A transformers causal LM behind parabench's contract."""

    def __init__(self, config: Any):
        super().__init__()
        from transformers import AutoModelForCausalLM

        # SDPA: flash/memory-efficient kernels on GPU, no T x T score matrix kept for backward.
        # fp32 weights whatever the config says: the strategy decides the precision.
        self.hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        # transformers 5.0 ties the head to the embedding only off the meta device, where the
        # planner builds a model for its shape: tied, the two are one tensor there too.
        self.hf.tie_weights()
        self.config = config
        self._checkpointing = False
        # What each recomputed layer keeps beside its input (models/selective_checkpointing.py); None: nothing.
        self.checkpoint_context_fn: Callable[[], Any] | None = None
        self._experts = [m for _, m in experts_modules(self.hf)]
        for experts in self._experts:
            experts.router_tally = RouterTally(experts.num_experts)
            experts.register_forward_pre_hook(_tally_routed, with_kwargs=True)

    @property
    def adds_balance_loss(self) -> bool:
        """Whether the loss includes the routers' load-balancing loss (the config's output_router_logits)."""
        return bool(self._experts) and bool(getattr(self.config, "output_router_logits", False))

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def activation_checkpointing(self) -> bool:
        return self._checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        self._checkpointing = bool(on)
        # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_*.
        if on:
            enable = getattr(self.hf, "activation_checkpointing_enable", None) or self.hf.gradient_checkpointing_enable
            kwargs: dict[str, Any] = {"use_reentrant": False}
            if self.checkpoint_context_fn is not None:
                kwargs["context_fn"] = self.checkpoint_context_fn
            enable(kwargs)
        else:
            disable = (
                getattr(self.hf, "activation_checkpointing_disable", None) or self.hf.gradient_checkpointing_disable
            )
            disable()

    def transformer_blocks(self) -> list[nn.Module]:
        """The decoder layers: transformers names their class in `_no_split_modules`."""
        block_names = set(getattr(self.hf, "_no_split_modules", None) or ())
        return [m for m in self.hf.modules() if type(m).__name__ in block_names]

    def tensor_parallel_plan(self, tp_size: int, sequence_parallel: bool) -> dict[str, str]:
        """The model's own Hugging Face plan: its config's base_model_tp_plan and the head's, as
        `from_pretrained(tp_plan="auto")` would apply them (sequence_parallel: none of these plans
        splits the sequence, so it is not used)."""
        from models.tensor_parallel import TensorParallelError, heads_check

        plan = dict(getattr(self.hf, "tp_plan", None) or getattr(self.hf, "_tp_plan", None) or {})
        if not plan:
            prefix = getattr(self.hf, "base_model_prefix", "")
            base = getattr(self.config, "base_model_tp_plan", None) or {}
            plan = {f"{prefix}.{k}" if prefix else k: v for k, v in base.items()}
        if plan:
            # The head's plan, which the causal LM class declares: transformers 5.0 leaves it out of
            # the instance's plan, later releases merge it in.
            plan = {**(getattr(type(self.hf), "_tp_plan", None) or {}), **plan}
        if not plan:
            raise TensorParallelError(
                f"{type(self.config).__name__} has no tensor-parallel plan (its base_model_tp_plan is empty): "
                "give the config a base_model_tp_plan, or use fsdp or hsdp for this model"
            )
        c = self.config
        heads = {"attention heads": int(c.num_attention_heads)}
        kv_heads = getattr(c, "num_key_value_heads", None)
        if kv_heads and int(kv_heads) != heads["attention heads"]:
            heads["key/value heads"] = int(kv_heads)
        heads_check(type(self.config).__name__, heads, tp_size)
        plan = {f"hf.{pattern}": style for pattern, style in plan.items()}
        return self._without_experts(plan) if self._experts else plan

    def _without_experts(self, plan: dict[str, str]) -> dict[str, str]:
        """A mixture-of-experts model's plan less what lies in its MoE layers (the parent of each
        experts module: router, experts, any shared expert), which stay whole on every tensor-parallel
        rank (expert parallel, ep_size, splits the experts), and less patterns for modules this model
        does not have (its config's plan names dense MLPs for layers it may not have)."""
        from models.tensor_parallel import pattern_matches

        experts = {id(m) for m in self._experts}
        names = [name for name, _ in self.named_modules()]
        layers = [name.rsplit(".", 1)[0] for name, m in self.named_modules() if id(m) in experts]

        def kept(pattern: str) -> bool:
            matched = [name for name in names if pattern_matches(pattern, name)]
            return bool(matched) and not any(n == m or n.startswith(f"{m}.") for n in matched for m in layers)

        return {pattern: style for pattern, style in plan.items() if kept(pattern)}

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Targets are already shifted by parabench's data; the loss is computed as the GPT's is.
        if not self.adds_balance_loss:
            logits = self.hf(input_ids=inputs, use_cache=False).logits
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        out = self.hf(input_ids=inputs, use_cache=False, output_router_logits=True)
        loss = F.cross_entropy(out.logits.float().view(-1, out.logits.size(-1)), targets.reshape(-1))
        return loss + self.hf.router_aux_loss_coef * self._balance_loss(out.router_logits, inputs.size(0))

    def _balance_loss(self, router_logits: tuple[torch.Tensor, ...], batch: int) -> torch.Tensor:
        """The model's own load_balancing_loss_func for each sequence, averaged over the sequences."""
        loss_of = sys.modules[type(self.hf).__module__].load_balancing_loss_func
        per_layer = [layer.view(batch, -1, layer.size(-1)) for layer in router_logits]
        experts, top_k = self.hf.num_experts, self.hf.num_experts_per_tok
        return torch.stack(
            [loss_of(tuple(layer[b] for layer in per_layer), experts, top_k) for b in range(batch)]
        ).mean()

    def _position_embeddings(self) -> list[nn.Module]:
        # Learned absolute positions (GPT-2's wpe, OPT's embed_positions): every embedding
        # table but the token one. Rotary models have none.
        token = self.hf.get_input_embeddings()
        return [m for m in self.hf.modules() if isinstance(m, nn.Embedding) and m is not token]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once though tied, less the routed experts a token does not go through;
        position embeddings left out by default."""
        n = sum(p.numel() for p in self.parameters())
        top_k = int(getattr(self.config, "num_experts_per_tok", 0) or 0)
        for experts in self._experts:
            per_expert = sum(p.numel() for p in experts.parameters(recurse=False)) // experts.num_experts
            n -= (experts.num_experts - top_k) * per_expert
        if non_embedding:
            n -= sum(p.numel() for m in self._position_embeddings() for p in m.parameters())
        return n

    def attention_shape(self) -> tuple[int, int, int]:
        """(layers, heads, head_dim) of the attention, for the 12·L·H·Q·T term."""
        c = self.config
        heads = int(c.num_attention_heads)
        head_dim = getattr(c, "head_dim", None) or int(c.hidden_size) // heads
        return int(c.num_hidden_layers), heads, int(head_dim)

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12·L·H·Q·T (PaLM appendix B), as for the zoo's GPT."""
        layers, heads, head_dim = self.attention_shape()
        return 6 * self.num_params() + 12 * layers * heads * head_dim * seq_len


def _tally_routed(experts: nn.Module, args: tuple, kwargs: dict) -> None:
    """Before an experts module runs: count the expert indices its router chose."""
    indices = args[1] if len(args) > 1 else next(v for k, v in kwargs.items() if "ind" in k)
    experts.router_tally.add(indices)


def hf_factory(name: str) -> Callable[..., nn.Module]:
    """`build(**model_kwargs)` for the zoo: config fields come from model_kwargs."""

    def build(**kwargs: Any) -> nn.Module:
        return HFCausalLM(build_config(name, kwargs))

    return build
