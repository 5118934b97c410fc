"""Checkpointing DTensors whose local part is not one block of the whole tensor.

A fused q;k;v projection split by heads (models/tensor_parallel.py, packed_colwise_qkv) gives
each rank the r-th slice of q, of k and of v: a strided shard. torch.distributed.checkpoint
writes each rank's part as one block at one offset, so it refuses such a tensor ("overlapping
chunks"). Those tensors go through the checkpoint in the plain layout (each strided shard a
contiguous one): the same global tensor, so the files are what a plain split writes and load
under any other layout; after a load they are put back in the layout the model computes in.
FSDP's own strided shards (its split of a dimension tensor parallel already split) are blocks,
which DCP stores as they are.
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


def storable(state: Any) -> Any:
    """`state` (nested dicts of tensors) with every strided DTensor replaced by its plain-layout copy."""
    if isinstance(state, dict):
        return {key: storable(value) for key, value in state.items()}
    return _relaid(state, _plain(state.placements)) if _needs_plain_copy(state) else state


def restore_layout(loaded: Any, live: Any) -> Any:
    """`loaded` (what storable(live) gave, filled by a checkpoint load) in the layouts of `live`."""
    if isinstance(loaded, dict):
        return {key: restore_layout(value, live[key]) for key, value in loaded.items()}
    return _relaid(loaded, live.placements) if _needs_plain_copy(live) else loaded
