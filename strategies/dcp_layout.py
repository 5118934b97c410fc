"""What a DCP checkpoint holds, whatever the layout the run trains in: fsdp, hsdp and fsdp-tp
write the same files, so that each loads the others' natively at any world size.

Two things of a run's state depend on its layout and are stored in a plain one.

Strided shards. A fused q;k;v projection split by heads (models/tensor_parallel.py, packed_colwise_qkv) gives
each rank the r-th slice of q, of k and of v: a strided shard. torch.distributed.checkpoint
writes each rank's part as one block at one offset, so it refuses such a tensor ("overlapping
chunks"). Those tensors go through the checkpoint in the plain layout (each strided shard a
contiguous one): the same global tensor, so the files are what a plain split writes and load
under any other layout; after a load they are put back in the layout the model computes in.
FSDP's own strided shards (its split of a dimension tensor parallel already split) are blocks,
which DCP stores as they are.

Optimizer parameter groups. The run's AdamW splits its groups by device mesh (fsdp-tp has two),
so a checkpoint stores them merged (groups equal in everything but their parameters are one)
and a load splits them again as the live optimizer has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _needs_plain_copy(t: Any) -> bool:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(t, DTensor):
        return False
    placements = t.placements
    for i, p in enumerate(placements):
        # A strided shard is a block when a later mesh dimension shards the same tensor dimension
        # (FSDP over tensor parallel); alone, it is not.
        if isinstance(p, _StridedShard) and not any(later.is_shard(p.dim) for later in placements[i + 1 :]):
            return True
    return False


def _relaid(t: torch.Tensor, placements: Any) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    # Every rank gathers the whole tensor and keeps its part of the other layout: one tensor at a
    # time, at checkpoint time only.
    return distribute_tensor(t.full_tensor(), t.device_mesh, placements, src_data_rank=None)


def _plain(placements: Any) -> list[Any]:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return [Shard(p.dim) if isinstance(p, _StridedShard) else p for p in placements]


def storable(state: dict[str, Any]) -> dict[str, Any]:
    """The run's {"model", "optimizer", ...} state as a checkpoint stores it: strided DTensors in
    their plain layout, the optimizer's parameter groups merged."""
    out = _tensors_storable(state)
    if "optimizer" in out:
        out["optimizer"] = {**out["optimizer"], PARAM_GROUPS: merged_groups(out["optimizer"][PARAM_GROUPS])}
    return out


def restore_layout(loaded: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """`loaded` (storable(live) filled by a checkpoint load) in the layout of `live`."""
    out = _tensors_restored(loaded, live)
    if "optimizer" in out:
        groups = split_groups(out["optimizer"][PARAM_GROUPS], live["optimizer"][PARAM_GROUPS])
        out["optimizer"] = {**out["optimizer"], PARAM_GROUPS: groups}
    return out


PARAM_GROUPS = "param_groups"
PARAMS = "params"


def merged_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups equal in every setting but their parameters, as one (first appearance's order)."""
    merged: list[dict[str, Any]] = []
    for group in groups:
        settings = {k: v for k, v in group.items() if k != PARAMS}
        same = next((m for m in merged if {k: v for k, v in m.items() if k != PARAMS} == settings), None)
        if same is None:
            merged.append({**group, PARAMS: list(group[PARAMS])})
        else:
            same[PARAMS] += group[PARAMS]
    return merged


def split_groups(loaded: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live groups, each with the loaded settings of the (merged) group that holds its parameters."""
    out = []
    for group in live:
        source = next((g for g in loaded if set(group[PARAMS]) <= set(g[PARAMS])), None)
        if source is None:  # an empty group, or parameters the checkpoint groups otherwise: keep the run's
            out.append(group)
        else:
            out.append({**source, PARAMS: list(group[PARAMS])})
    return out


def _tensors_storable(state: Any) -> Any:
    if isinstance(state, dict):
        return {key: _tensors_storable(value) for key, value in state.items()}
    return _relaid(state, _plain(state.placements)) if _needs_plain_copy(state) else state


def _tensors_restored(loaded: Any, live: Any) -> Any:
    if isinstance(loaded, dict):
        return {key: _tensors_restored(value, live[key]) for key, value in loaded.items()}
    return _relaid(loaded, live.placements) if _needs_plain_copy(live) else loaded
