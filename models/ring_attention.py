"""torch's ring attention (torch.distributed.tensor.experimental, as torchtitan applies it): each rank
of a group keeps its share of every sequence, and SDPA, given its queries, keys and values as
DTensors sharded along the sequence, passes the keys and values around the ring and merges the
partial outputs by their log-sum-exp.

The share is head and tail: of 2 x cp chunks, rank r keeps chunks r and 2 x cp - 1 - r, so that
causal masking leaves every rank the same work; torch's ring reads this order from the load
balancer its sharding was given. torch sends only its CUDA kernels (flash, memory-efficient,
cuDNN) around the ring: the CPU's SDPA has no sharding strategy there.

torchtitan's route, not the `context_parallel` context manager: that one shards buffers it is given
on entry, and parabench's loop makes each step's inputs inside the step; the model's hook shards
them here instead, and the DTensor dispatcher stays on for the run, as torchtitan leaves it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

SEQUENCE_DIM = 2  # of (batch, heads, sequence, head_dim), where torch's ring expects it


def enable_ring_attention() -> None:
    """Send SDPA on sequence-sharded DTensors around the ring, for the rest of the process."""
    from torch.distributed.tensor.experimental._attention import _enable_context_parallel_dispatcher

    _enable_context_parallel_dispatcher()


def head_tail_shares(mesh: DeviceMesh, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """(batch, sequence) tensors, the same on every rank of `mesh` -> this rank's share of each,
    head and tail, in the order torch's ring attention expects (its load balancing on)."""
    from torch.distributed.tensor.experimental._attention import _context_parallel_shard, _HeadTailLoadBalancer

    balancer = _HeadTailLoadBalancer(tensors[0].size(1), mesh.size(), tensors[0].device)
    return list(_context_parallel_shard(mesh, tensors, [1] * len(tensors), load_balancer=balancer))


def ring_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mesh: DeviceMesh,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of this rank's share of the queries (batch, heads, share, head_dim) over
    the whole sequence's keys and values (as many heads as the queries), passed around the ring."""
    from torch.distributed.tensor import DTensor, Shard

    q, k, v = (DTensor.from_local(t, mesh, [Shard(SEQUENCE_DIM)], run_check=False) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    return y.to_local()
