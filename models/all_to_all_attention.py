"""DeepSpeed-Ulysses' attention over a sequence split between the ranks of a group: an all-to-all
turns each rank's slice of the sequence with every head into the whole sequence with a share of the
heads, the attention of those heads runs on whole sequences (so causal masking is exact), and a
second all-to-all sends the outputs back to their slices.

The head counts are read from the tensors, so they are the rank's own: under tensor parallel each
rank's projections give heads / tp_size heads, and these are what the group shares out.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

# attend(q, k, v): (batch, heads, whole sequence, head_dim) each -> (batch, whole sequence, heads, head_dim).
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def all_to_all_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup, attend: Attend
) -> torch.Tensor:
    """q (batch, slice, heads, head_dim), k and v (batch, slice, kv_heads, head_dim) on each rank of
    `group` -> the attention output (batch, slice, heads, head_dim) of that rank's slice, computed
    by `attend` on whole sequences of heads / group size heads."""
    size = dist.get_world_size(group)
    k, v = spread_kv_heads(k, size), spread_kv_heads(v, size)
    q, k, v = (_AllToAll.apply(t, group, True).transpose(1, 2) for t in (q, k, v))
    return _AllToAll.apply(attend(q, k, v), group, False)


def spread_kv_heads(x: torch.Tensor, size: int) -> torch.Tensor:
    """(batch, slice, kv_heads, head_dim) with `size` ranks to share the heads among: fewer kv heads
    than ranks are each repeated so that every rank receives the one its queries' group reads
    (the check has made one count divide the other)."""
    kv_heads = x.size(2)
    return x if kv_heads % size == 0 else x.repeat_interleave(size // kv_heads, dim=2)


def _heads_to_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, T/cp, H, D) on each rank -> (B, T, H/cp, D): the whole sequence of this rank's heads."""
    size = dist.get_world_size(group)
    B, T, H, D = x.shape
    send = x.reshape(B, T, size, H // size, D).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.permute(1, 0, 2, 3, 4).reshape(B, size * T, H // size, D)


def _sequence_to_heads(y: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, T, H/cp, D) -> (B, T/cp, H, D): the inverse of _heads_to_sequence."""
    size = dist.get_world_size(group)
    B, T, h, D = y.shape
    send = y.reshape(B, size, T // size, h, D).permute(1, 0, 2, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.permute(1, 2, 0, 3, 4).reshape(B, T // size, size * h, D)


class _AllToAll(torch.autograd.Function):
    """One of the two all-to-alls, whose backward is the other."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, to_sequence: bool) -> torch.Tensor:
        ctx.group, ctx.to_sequence = group, to_sequence
        return _heads_to_sequence(x, group) if to_sequence else _sequence_to_heads(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        back = _sequence_to_heads(grad, ctx.group) if ctx.to_sequence else _heads_to_sequence(grad, ctx.group)
        return back, None, None
