"""Context parallel for parabench's GPT: its attention modules change class (as FSDP2's do), keeping
their parameters and names, and its position embedding reads the positions of this rank's share."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from models.all_to_all_attention import all_to_all_attention
from models.context_parallel import ContextParallelError, fitting_sizes
from models.gpt import GPT, CausalSelfAttention
from models.ring_attention import ring_sdpa


def check_gpt(model: GPT, cp_size: int, attention: str, tp_size: int) -> None:
    """Refuse heads the all-to-all cannot share out: each rank of a group gets whole heads of the
    heads / tp_size its tensor-parallel rank holds. The ring splits the sequence, not the heads."""
    heads = model.config.n_head // tp_size
    if attention == "all-to-all" and heads % cp_size:
        held = f"{heads} heads each tensor-parallel rank holds" if tp_size > 1 else f"{heads} attention heads"
        raise ContextParallelError(
            f"cp_size={cp_size} does not divide the GPT's {held} (the all-to-all gives each rank whole heads): "
            f"use strategy_options.cp_size={' or '.join(map(str, fitting_sizes(heads)))}, "
            "or strategy_options.cp_attention=ring"
        )


def split_gpt(model: nn.Module, mesh: DeviceMesh, attention: str, positions: Callable[[], torch.Tensor]) -> None:
    """Attention over the whole sequence from each rank's share; `positions()` gives the positions
    of the share the current forward computes on. `model`: the GPT, or a pipeline stage of it (a
    stage after the first has no position embedding)."""
    wpe = getattr(model, "wpe", None)
    if wpe is not None:
        wpe.register_forward_pre_hook(lambda module, args: (positions(),))
    for module in model.modules():
        if type(module) is CausalSelfAttention:
            if attention == "ring":
                module.__class__ = RingSelfAttention
                module.cp_mesh = mesh
            else:
                module.__class__ = AllToAllSelfAttention
                module.cp_group = mesh.get_group()


def _heads(attention: CausalSelfAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k and v (batch, sequence, heads, head_dim): this tensor-parallel rank's heads, all of them
    without tensor parallel (-1 heads: models/gpt.py)."""
    B, T, C = x.shape
    return tuple(t.view(B, T, -1, C // attention.n_head) for t in attention.c_attn(x).chunk(3, dim=2))


class AllToAllSelfAttention(CausalSelfAttention):
    """CausalSelfAttention on a slice of the sequence: all-to-all to whole sequences of a share of
    the heads, attention, all-to-all back (models/all_to_all_attention.py)."""

    cp_group: torch.distributed.ProcessGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        dropout = self.dropout if self.training else 0.0

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout).transpose(1, 2)

        y = all_to_all_attention(*_heads(self, x), self.cp_group, attend)
        return self.c_proj(y.reshape(B, T, -1))


class RingSelfAttention(CausalSelfAttention):
    """CausalSelfAttention on a head-and-tail share of the sequence, the keys and values passed
    around the ring (models/ring_attention.py)."""

    cp_mesh: DeviceMesh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in _heads(self, x))
        y = ring_sdpa(q, k, v, self.cp_mesh, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))
