"""Tensor-parallel plans: which modules of a model are split over the ranks of a tensor-parallel
group, and how, applied with torch's DTensor parallel styles (`parallelize_module`).

A model gives its plan with a method `tensor_parallel_plan(tp_size, sequence_parallel)` that
returns `{module pattern: style}`, each pattern a dotted module path in which `*` matches one
name (`blocks.*.attn.c_attn`), and raises TensorParallelError where tp_size cannot split it
(heads that do not divide). parabench's GPT has its own; `hf:` models pass on their Hugging Face
plan (the config's `base_model_tp_plan` and the head's); a user's model may define the method.

The styles, by Hugging Face's names where it has one:
  colwise                nn.Linear split by output features: input replicated, output sharded
  rowwise                nn.Linear split by input features: input sharded, output all-reduced
  colwise_rep            colwise, its output gathered (also colwise_gather_output)
  rowwise_rep            rowwise from a replicated input (also rowwise_split_input)
  embedding_rowwise      nn.Embedding split by vocabulary, the lookups all-reduced
  packed_colwise_qkv     colwise over a fused q;k;v projection: each of the three split by heads
  replicate              left whole on every rank
and, for sequence parallelism (the residual stream split along the sequence between blocks):
  sequence_parallel      a norm run on this rank's share of the sequence
  sequence_gather        the module's input gathered from the sequence shards, for its split layers
  sequence_gather_local  the same, as a plain tensor, for a module left whole
  rowwise_to_sequence    rowwise, its output reduce-scattered onto the sequence shards
  sequence_scatter       the module's (replicated) output cut into sequence shards
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

import torch.nn as nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

# The q;k;v projection of a fused attention input packs three projections of equal width.
QKV_PACKS = 3
# Styles that split the sequence: a run using them needs seq_len divisible by tp_size.
SEQUENCE_STYLES = (
    "sequence_parallel",
    "sequence_gather",
    "sequence_gather_local",
    "rowwise_to_sequence",
    "sequence_scatter",
)
ALIASES = {"colwise_gather_output": "colwise_rep", "rowwise_split_input": "rowwise_rep"}
HOW_TO_GIVE_A_PLAN = (
    "give the model a method tensor_parallel_plan(tp_size, sequence_parallel) returning {module pattern: style} "
    "(docs/multi-node.md), or use fsdp or hsdp"
)


class TensorParallelError(ValueError):
    """A model that cannot be split as asked (one line, says what would)."""


def heads_check(what: str, counts: dict[str, int], tp_size: int) -> None:
    """Refuse a tp_size that does not divide each of `counts` (attention heads, key/value heads)."""
    for name, count in counts.items():
        if count % tp_size:
            fits = [d for d in range(1, count + 1) if all(c % d == 0 for c in counts.values())]
            raise TensorParallelError(
                f"tp_size={tp_size} does not divide the {count} {name} of {what}: use strategy_options.tp_size="
                f"{' or '.join(map(str, fits))} (each rank of a tensor-parallel group computes whole heads)"
            )


def plan_of(model: nn.Module, tp_size: int, sequence_parallel: bool) -> dict[str, str]:
    """The model's plan for `tp_size`, its styles checked and every pattern matching a module."""
    method = getattr(model, "tensor_parallel_plan", None)
    if not callable(method):
        raise TensorParallelError(f"model {type(model).__name__} has no tensor-parallel plan: {HOW_TO_GIVE_A_PLAN}")
    plan = {pattern: ALIASES.get(style, style) for pattern, style in method(tp_size, sequence_parallel).items()}
    if not plan:
        raise TensorParallelError(f"model {type(model).__name__}'s tensor-parallel plan is empty: {HOW_TO_GIVE_A_PLAN}")
    names = [name for name, _ in model.named_modules()]
    for pattern, style in plan.items():
        if style not in STYLE_NAMES:
            raise TensorParallelError(
                f"model {type(model).__name__}'s tensor-parallel plan splits {pattern} by style {style!r}, which "
                f"parabench does not run; its styles are {', '.join(STYLE_NAMES)}; use fsdp or hsdp for this model"
            )
        if not any(pattern_matches(pattern, name) for name in names):
            raise TensorParallelError(
                f"model {type(model).__name__}'s tensor-parallel plan names {pattern}, which matches no module of it"
            )
    return plan


def uses_sequence_parallel(plan: dict[str, str]) -> bool:
    return any(style in SEQUENCE_STYLES for style in plan.values())


def describe(plan: dict[str, str]) -> str:
    """The plan in a line: 'colwise: 6 modules, rowwise: 4 modules'."""
    counts: dict[str, int] = {}
    for style in plan.values():
        counts[style] = counts.get(style, 0) + 1
    return ", ".join(f"{style} x{n}" for style, n in counts.items())


def parallelize(model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, str]) -> None:
    """Split `model` in place over `tp_mesh` by `plan`. Every rank holds the same weights, so each
    keeps its own slice (no broadcast). Parameters tied before stay tied (the same DTensor), where
    the plan splits them alike."""
    from torch.distributed.tensor.parallel import parallelize_module

    ties = _tied_groups(model)
    styles = {pattern: _style(name) for pattern, name in plan.items()}
    parallelize_module(model, tp_mesh, {p: s for p, s in styles.items() if s is not None}, src_data_rank=None)
    _retie(model, ties)


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether a plan's `pattern` (`*` one name) names the module `name`."""
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatch(n, p) for p, n in zip(parts, names, strict=True))


def _tied_groups(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, attribute) pairs that hold one Parameter object, for each Parameter held twice or more."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for attr, p in module.named_parameters(recurse=False):
            holders.setdefault(id(p), []).append((module, attr))
    return [group for group in holders.values() if len(group) > 1]


def _retie(model: nn.Module, ties: list[list[tuple[nn.Module, str]]]) -> None:
    from torch.distributed.tensor import DTensor

    names = {id(m): name for name, m in model.named_modules()}
    for group in ties:
        first_module, first_attr = group[0]
        kept = getattr(first_module, first_attr)
        for module, attr in group[1:]:
            other = getattr(module, attr)
            if other is kept:
                continue
            layouts = [p.placements if isinstance(p, DTensor) else "whole" for p in (kept, other)]
            if layouts[0] != layouts[1]:
                raise TensorParallelError(
                    f"{names[id(first_module)]}.{first_attr} and {names[id(module)]}.{attr} are one tied parameter, "
                    f"but the tensor-parallel plan splits them differently ({layouts[0]} vs {layouts[1]}): "
                    "give both the same split, or neither"
                )
            setattr(module, attr, kept)


def _style(name: str) -> ParallelStyle | None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    if name == "colwise_rep":
        return ColwiseParallel(output_layouts=Replicate())
    if name in ("rowwise_rep", "embedding_rowwise"):
        return RowwiseParallel(input_layouts=Replicate())
    if name == "packed_colwise_qkv":
        return _packed_colwise(QKV_PACKS)
    if name == "sequence_parallel":
        return SequenceParallel()
    if name in ("sequence_gather", "sequence_gather_local"):
        # A DTensor for split layers, whose backward then reduce-scatters the input's gradient; a
        # plain tensor for a module left whole (the GPT's head, tied to an FSDP-sharded embedding).
        return PrepareModuleInput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            use_local_output=name == "sequence_gather_local",
        )
    if name == "rowwise_to_sequence":
        return RowwiseParallel(output_layouts=Shard(1))
    if name == "sequence_scatter":
        return PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),))
    assert name == "replicate", name
    return None


STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "rowwise_rep",
    "embedding_rowwise",
    "packed_colwise_qkv",
    "replicate",
    *SEQUENCE_STYLES,
)


def _packed_colwise(packs: int) -> Any:
    """ColwiseParallel over a projection that packs `packs` projections of equal width (q;k;v):
    rank r keeps the r-th slice of each, so that its heads are whole. DTensor states it as a
    strided shard; DCP cannot store that layout, which strategies/dcp_layout.py handles."""
    import torch.nn as nn
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel
    from torch.distributed.tensor.placement_types import _StridedShard

    class PackedColwiseParallel(ColwiseParallel):
        def __init__(self) -> None:
            # The output (last dim of the activations) stays in the weight's strided layout, locally q;k;v.
            super().__init__(output_layouts=_StridedShard(-1, split_factor=packs))

        def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
            placement = _StridedShard(0, split_factor=packs)
            for param_name, param in module.named_parameters():
                sharded = distribute_tensor(param, device_mesh, [placement], src_data_rank=None)
                module.register_parameter(param_name, nn.Parameter(sharded, requires_grad=param.requires_grad))

    return PackedColwiseParallel()
