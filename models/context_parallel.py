"""Context parallel for parabench's GPT: each sequence split over the cp_size ranks of a group, the
attention computed over the whole sequence by an all-to-all (DeepSpeed-Ulysses).

Each rank of a group embeds, normalises and runs the MLPs on its own contiguous slice of the
sequence (positions offset by the slice's start). Before attention an all-to-all scatters the heads
and gathers the sequence: each rank then holds every position of n_head / cp_size heads, and the
causal attention of those heads is exact; a second all-to-all sends the outputs back to their
sequence slices. Each rank's loss is its tokens' mean; the group's ranks hold equal shares, so the
sequence's mean, which the model returns on each of them, is the mean of theirs, while each rank's
gradient is its own tokens': FSDP's average over every rank of the mesh makes it the batch's.

The model keeps its modules and their names: the attention modules change class (as FSDP2's do)
and the GPT gets two hooks, one slicing the loop's inputs and targets, one offsetting the positions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from models.gpt import GPT, CausalSelfAttention


class ContextParallelError(ValueError):
    """A model or sequence that cannot be split as asked (one line, says what would)."""


def check_context_parallel(model: nn.Module, cp_size: int, seq_len: int | None) -> None:
    """Refuse a model other than parabench's GPT, heads or a sequence that cp_size does not divide."""
    if not isinstance(model, GPT):
        raise ContextParallelError(
            f"context parallel splits parabench's GPT (the zoo's gpt-* models), not {type(model).__name__}: "
            "use a gpt-* model, or fsdp / fsdp-tp for this one"
        )
    heads = model.config.n_head
    if heads % cp_size:
        fits = [d for d in range(1, heads + 1) if heads % d == 0]
        raise ContextParallelError(
            f"cp_size={cp_size} does not divide the GPT's {heads} attention heads (the all-to-all gives each rank "
            f"whole heads): use strategy_options.cp_size={' or '.join(map(str, fits))}"
        )
    if seq_len is not None and seq_len % cp_size:
        raise ContextParallelError(
            f"seq_len={seq_len} does not split over cp_size={cp_size}: use a seq_len that {cp_size} divides"
        )


def split_sequences(model: nn.Module, group: dist.ProcessGroup, slices_batch: bool = True) -> None:
    """Make `model` (the GPT, or a pipeline stage of it) compute on this rank's slice of each
    sequence, its attention over the group. `slices_batch`: the model's forward takes the loop's
    whole sequences, slices them and returns the group's mean loss; a pipeline stage is handed its
    slice, and the pipeline averages the loss over the group itself."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def slice_batch(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(_own_slice(t, rank, size) for t in args)

    def offset_positions(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        positions = args[0]
        return (positions + rank * positions.numel(),)

    def group_mean_loss(module: nn.Module, args: tuple[Any, ...], loss: torch.Tensor) -> torch.Tensor:
        # The value the loop logs is the sequence's mean loss; the gradient stays this rank's own
        # tokens' (the data-parallel reduction averages it over every rank of the group).
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        return loss + (mean / size - loss).detach()

    if slices_batch:
        model.register_forward_pre_hook(slice_batch)
        model.register_forward_hook(group_mean_loss)
    wpe = getattr(model, "wpe", None)
    if wpe is not None:  # a pipeline stage after the first has no position embedding
        wpe.register_forward_pre_hook(offset_positions)
    for module in model.modules():
        if type(module) is CausalSelfAttention:
            module.__class__ = AllToAllSelfAttention
            module.cp_group = group


def _own_slice(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    length = t.size(1) // size
    return t[:, rank * length : (rank + 1) * length]


class AllToAllSelfAttention(CausalSelfAttention):
    """CausalSelfAttention on a slice of the sequence: all-to-all to whole sequences of a share of
    the heads, attention, all-to-all back."""

    cp_group: dist.ProcessGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # -1 heads: under tensor parallel this rank's c_attn gives q;k;v of its own heads only.
        q, k, v = self.c_attn(x).chunk(3, dim=2)
        q, k, v = (_AllToAll.apply(t.view(B, T, -1, C // self.n_head), self.cp_group, True) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = _AllToAll.apply(y.transpose(1, 2), self.cp_group, False)
        return self.c_proj(y.reshape(B, T, -1))


def _heads_to_ranks(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, T/cp, H, D) on each rank -> (B, T, H/cp, D): the whole sequence of this rank's heads."""
    size = dist.get_world_size(group)
    B, T, H, D = x.shape
    send = x.reshape(B, T, size, H // size, D).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.permute(1, 0, 2, 3, 4).reshape(B, size * T, H // size, D)


def _sequence_to_ranks(y: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, T, H/cp, D) -> (B, T/cp, H, D): the inverse of _heads_to_ranks."""
    size = dist.get_world_size(group)
    B, T, h, D = y.shape
    send = y.reshape(B, size, T // size, h, D).permute(1, 0, 2, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.permute(1, 2, 0, 3, 4).reshape(B, T // size, size * h, D)


class _AllToAll(torch.autograd.Function):
    """One of the two all-to-alls, whose backward is the other."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, to_heads: bool) -> torch.Tensor:
        ctx.group, ctx.to_heads = group, to_heads
        return _heads_to_ranks(x, group) if to_heads else _sequence_to_ranks(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        back = _sequence_to_ranks(grad, ctx.group) if ctx.to_heads else _heads_to_ranks(grad, ctx.group)
        return back, None, None
