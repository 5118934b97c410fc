"""Models a user might bring by import path, for tests/models/test_blocks.py and the pipeline cut's
tests (tests/models/test_stages.py): none is a GPT and none has `transformer_blocks()`, so block
discovery must find their repeated layers.

Each keeps parabench's model contract: `forward(inputs, targets) -> loss` on int64 token
ids, a `vocab_size`, and an init that depends only on the seed set before building.

    tests.user_models:build_recurrent    residual GRU layers in a ModuleList
    tests.user_models:build_decoder      DecoderLayers in a ModuleList named decoder_layers
    tests.user_models:build_nested       residual MLP blocks in a Sequential inside a Sequential
    tests.user_models:build_bigram       no repeated layers: no blocks to find
    tests.user_models:build_gru          one nn.GRU of two layers: no blocks to find
    tests.user_models:build_untraceable  reads a value mid-forward (no meta-device trace)

PARAM_PEAK_FILE=<path> makes a model record, in every submodule's forward, the bytes of
its parameters that are materialised whole at that moment (plain tensors, not FSDP2's
DTensor shards), and write the largest to <path>.rank<RANK> after each forward.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class ResidualGRU(nn.Module):
    """A recurrent layer with a residual connection: x + GRU(norm(x))."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gru = nn.GRU(width, width, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.norm(x))
        return x + out


class RecurrentLM(nn.Module):
    def __init__(self, vocab_size: int = 128, width: int = 32, depth: int = 2):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleList(ResidualGRU(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab_size)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        for layer in self.layers:
            x = layer(x)
        return _loss(self.head(x), targets)


class DecoderLayer(nn.Module):
    """Mixes each position with the one before it (causal), then an MLP; pre-norm, residual."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mix = nn.Linear(2 * width, width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        previous = F.pad(h, (0, 0, 1, 0))[:, :-1]
        x = x + self.mix(torch.cat([h, previous], dim=-1))
        return x + self.down(F.gelu(self.up(x)))


class Decoder(nn.Module):
    def __init__(self, vocab_size: int = 128, width: int = 32, depth: int = 3):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, width)
        self.decoder_layers = nn.ModuleList(DecoderLayer(width) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width)
        self.unembed = nn.Linear(width, vocab_size, bias=False)
        self.unembed.weight = self.embed.weight  # tied, as language models often are
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        for layer in self.decoder_layers:
            x = layer(x)
        return _loss(self.unembed(self.final_norm(x)), targets)


class ResidualMLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class NestedLM(nn.Module):
    """The whole network is one Sequential; its blocks sit in a Sequential inside it."""

    def __init__(self, vocab_size: int = 128, width: int = 32, depth: int = 3):
        super().__init__()
        self.vocab_size = vocab_size
        self.net = nn.Sequential(
            nn.Embedding(vocab_size, width),
            nn.Sequential(*(ResidualMLP(width) for _ in range(depth))),
            nn.LayerNorm(width),
            nn.Linear(width, vocab_size),
        )

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _loss(self.net(inputs), targets)


class BigramLM(nn.Module):
    """No repeated layers at all: nothing to find, so one FSDP unit and a warning."""

    def __init__(self, vocab_size: int = 128, width: int = 32):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _loss(self.head(self.norm(self.embed(inputs))), targets)


class GRULM(nn.Module):
    """A plain recurrent language model: its layers are inside one nn.GRU, not repeated modules."""

    def __init__(self, vocab_size: int = 128, width: int = 32, layers: int = 2):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, width)
        self.gru = nn.GRU(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(inputs))
        return _loss(self.head(out), targets)


class UntraceableLM(NestedLM):
    """Reads a tensor's value in forward, which no meta-device trace can do."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = super().forward(inputs, targets)
        if not math.isfinite(loss.item()):  # a user's guard: it reads a value, which meta tensors lack
            raise FloatingPointError("the loss is not finite")
        return loss


def _record_parameter_peak(model: nn.Module, path: str) -> nn.Module:
    """Forward pre-hooks on every submodule: the largest sum, over the whole model, of the
    bytes of parameters held whole (not as DTensor shards) at any point of the forward."""
    state = {"peak": 0}
    rank = os.environ.get("RANK", "0")

    def whole_bytes() -> int:
        return sum(p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor))

    def pre_hook(module: nn.Module, args) -> None:
        state["peak"] = max(state["peak"], whole_bytes())

    def write(module: nn.Module, args, output) -> None:
        with open(f"{path}.rank{rank}", "w") as f:
            json.dump({"peak_whole_param_bytes": state["peak"]}, f)

    for module in model.modules():
        module.register_forward_pre_hook(pre_hook)
    model.register_forward_hook(write)
    return model


def _maybe_recorded(model: nn.Module) -> nn.Module:
    path = os.environ.get("PARAM_PEAK_FILE")
    # Not the copies the planner builds on the meta device (and traces) beside the run.
    on_meta = next(model.parameters()).device.type == "meta"
    return _record_parameter_peak(model, path) if path and not on_meta else model


def build_recurrent(**kwargs) -> nn.Module:
    return _maybe_recorded(RecurrentLM(**kwargs))


def build_decoder(**kwargs) -> nn.Module:
    return _maybe_recorded(Decoder(**kwargs))


def build_nested(**kwargs) -> nn.Module:
    return _maybe_recorded(NestedLM(**kwargs))


def build_bigram(**kwargs) -> nn.Module:
    return BigramLM(**kwargs)


def build_gru(**kwargs) -> nn.Module:
    return GRULM(**kwargs)


def build_untraceable(**kwargs) -> nn.Module:
    return UntraceableLM(**kwargs)
