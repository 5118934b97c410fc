"""Context parallel: each sequence split over the cp_size ranks of a group, the attention made whole
over the sequence, for the models whose attention parabench knows: its GPT
(models/gpt_context_parallel.py) and Hugging Face causal LMs (models/hf_context_parallel.py).

Each rank of a group embeds, normalises and runs the MLPs on its own share of the sequence, at the
share's positions. Attention is one of two:
- all-to-all (DeepSpeed-Ulysses, models/all_to_all_attention.py): the share is a contiguous slice;
  before attention an all-to-all scatters the heads and gathers the sequence, so each rank holds
  every position of heads / cp_size heads and their causal attention is exact; a second sends the
  outputs back. Runs wherever the process group runs an all-to-all (gloo on the CPU, NCCL).
- ring (torch's, models/ring_attention.py): the share is a head and a tail chunk; keys and values
  pass around the ring. CUDA only.

Each rank's loss is its tokens' mean; the group's ranks hold equal shares, so the sequence's mean,
which the model returns on each of them, is the mean of theirs, while each rank's gradient is its
own tokens': the data-parallel average over every rank of the group makes it the batch's.

The model keeps its modules and their names (its checkpoints are the bare model's); it gets a hook
that takes each forward's share of the inputs and targets, one that returns the group's loss, and
its family's attention. Under tensor parallel, attention modules hold heads / tp_size heads, and the
all-to-all shares out those (check with tp_size).

Anything else is refused: parabench does not guess at a model's attention.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from models.sequence_split import CP_ATTENTIONS, sequence_split_error


class ContextParallelError(ValueError):
    """A model or sequence that cannot be split as asked (one line, says what would)."""


class UnsplittableModel(ContextParallelError):
    """A model whose attention context parallel cannot split at any size (its form, not a size)."""


def fitting_sizes(heads: int) -> list[int]:
    """The group sizes that give each rank whole heads of `heads`."""
    return [d for d in range(1, heads + 1) if heads % d == 0]


def check_context_parallel(
    model: nn.Module, cp_size: int, seq_len: int | None, *, attention: str = "all-to-all", tp_size: int = 1
) -> None:
    """Refuse, in one line, a model whose attention parabench does not know, or a sequence, heads
    (tp_size: the heads each tensor-parallel rank holds) or attention implementation that
    `cp_size` ranks cannot split with `attention`. Runs on the model built on the meta device."""
    if attention not in CP_ATTENTIONS:
        raise ContextParallelError(f"cp_attention={attention!r} is not one of {', '.join(CP_ATTENTIONS)}")
    family = _family(model)
    if family is None:
        raise UnsplittableModel(
            f"context parallel splits the attention of parabench's GPT (gpt-* models) and of Hugging Face "
            f"causal LMs (model=hf:...), not {type(model).__name__}'s, which it does not know: "
            "use one of those, or fsdp / fsdp-tp for this model"
        )
    unsplit = None if seq_len is None else sequence_split_error(seq_len, cp_size, attention)
    if unsplit is not None:
        raise ContextParallelError(unsplit)
    if family == "gpt":
        from models.gpt_context_parallel import check_gpt

        check_gpt(model, cp_size, attention, tp_size)
    else:
        from models.hf_context_parallel import check_hf

        check_hf(model, cp_size, attention, tp_size)


def split_sequences(model: nn.Module, mesh: DeviceMesh, attention: str = "all-to-all") -> None:
    """Make `model` (checked by check_context_parallel) compute on this rank's share of each
    sequence, its attention over the ranks of `mesh` (1-D: the context-parallel group), before
    any wrapping (tensor parallel may come first)."""
    group = mesh.get_group()
    size = dist.get_world_size(group)
    share: dict[str, torch.Tensor] = {}

    def take_share(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        inputs, targets, share["positions"] = sequence_share(mesh, attention, *args)
        return inputs, targets

    def group_mean_loss(module: nn.Module, args: tuple[Any, ...], loss: torch.Tensor) -> torch.Tensor:
        # The value the loop logs is the sequence's mean loss; the gradient stays this rank's own
        # tokens' (the data-parallel reduction averages it over every rank of the group).
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        return loss + (mean / size - loss).detach()

    model.register_forward_pre_hook(take_share)
    model.register_forward_hook(group_mean_loss)
    split_attention(model, model, mesh, attention, lambda: share["positions"])


def sequence_share(
    mesh: DeviceMesh, attention: str, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's share of the (batch, sequence) inputs and targets, the same on every rank of
    `mesh`, and the share's positions (a sequence's)."""
    positions = torch.arange(inputs.size(1), device=inputs.device).expand_as(inputs)
    if attention == "ring":
        from models.ring_attention import head_tail_shares

        inputs, targets, positions = head_tail_shares(mesh, [inputs, targets, positions])
    else:
        group = mesh.get_group()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        inputs, targets, positions = (_slice(t, rank, size) for t in (inputs, targets, positions))
    return inputs, targets, positions[0]


def split_attention(
    model: nn.Module, part: nn.Module, mesh: DeviceMesh, attention: str, positions: Callable[[], torch.Tensor]
) -> None:
    """The attention of `part` (`model` itself, or a pipeline stage of it under its names) over the
    ranks of `mesh`, its position embedding at `positions()`: the share the current forward runs.
    A pipeline takes each share itself (sequence_share) and averages the loss over the group."""
    if attention == "ring":
        from models.ring_attention import enable_ring_attention

        enable_ring_attention()
    if _family(model) == "gpt":
        from models.gpt_context_parallel import split_gpt

        split_gpt(part, mesh, attention, positions)
    else:
        from models.hf_context_parallel import split_hf

        split_hf(part, mesh, attention, positions)


def _family(model: nn.Module) -> str | None:
    from models.gpt import GPT
    from models.hf import HFCausalLM

    if isinstance(model, GPT):
        return "gpt"
    if isinstance(model, HFCausalLM):
        return "hf"
    return None


def _slice(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    length = t.size(1) // size
    return t[:, rank * length : (rank + 1) * length]
