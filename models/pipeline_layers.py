"""parabench's GPT as the flat sequence of layers DeepSpeed's PipelineModule cuts into stages.

DeepSpeed's own GPT (Megatron-DeepSpeed's GPTModelPipe) is a list of layer specs: the embedding as
a TiedLayerSpec, the transformer layers, the final norm, and the same TiedLayerSpec again with a
forward function that multiplies by the embedding's weight for the logits. PipelineModule builds
only the specs of its own stage; the tied spec is built on the first and on the last stage, and
DeepSpeed broadcasts the first stage's weight to the last at build and all-reduces the two copies'
gradients before each step. Here each spec builds a thin layer around the GPT's own submodule, so
that the pipeline starts from the very weights every other strategy starts from (seeded, built
once on the CPU), and each parameter is the GPT's own object, whose names in the bare model
pipeline_names gives.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from models.gpt import GPT

# The key of the tied embedding and head among PipelineModule's tied modules.
TIED_KEY = "wte"


class TokenEmbedding(nn.Module):
    """The token embedding: token ids in, the embeddings out; on the last stage, through
    head_logits, the head tied to it."""

    def __init__(self, wte: nn.Embedding):
        super().__init__()
        self.wte = wte

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte(ids)


def head_logits(embedding: TokenEmbedding, x: torch.Tensor) -> torch.Tensor:
    """The last stage's use of the tied layer: the logits from the embedding's weight."""
    return F.linear(x, embedding.wte.weight)


class PositionEmbedding(nn.Module):
    """Adds the position embeddings, then the GPT's embedding dropout."""

    def __init__(self, wpe: nn.Embedding, drop: nn.Dropout):
        super().__init__()
        self.wpe, self.drop = wpe, drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x + self.wpe(torch.arange(x.size(1), device=x.device)))


class BlockLayer(nn.Module):
    """One of the GPT's blocks, recomputed in the backward where the GPT's own switch says so."""

    def __init__(self, block: nn.Module, recompute: bool):
        super().__init__()
        self.block, self.recompute = block, recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and self.training:
            return checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


class FinalNorm(nn.Module):
    def __init__(self, ln_f: nn.LayerNorm):
        super().__init__()
        self.ln_f = ln_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x)


def _layers(gpt: GPT) -> list[tuple[type[nn.Module], tuple[Any, ...]]]:
    """Each layer's class and arguments, in order: embedding, positions, the blocks, the final
    norm, and the embedding again for the head."""
    return [
        (TokenEmbedding, (gpt.wte,)),
        (PositionEmbedding, (gpt.wpe, gpt.drop)),
        *((BlockLayer, (block, gpt.activation_checkpointing)) for block in gpt.blocks),
        (FinalNorm, (gpt.ln_f,)),
        (TokenEmbedding, (gpt.wte,)),
    ]


def layer_specs(gpt: GPT) -> list[Any]:
    """The GPT as DeepSpeed's layer specs, the first and the last layer tied."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    layers = _layers(gpt)
    tied = {"tied_weight_attr": ["wte.weight"]}
    (first, first_args), (last, last_args) = layers[0], layers[-1]
    return [
        TiedLayerSpec(TIED_KEY, first, *first_args, **tied),
        *(LayerSpec(cls, *args) for cls, args in layers[1:-1]),
        TiedLayerSpec(TIED_KEY, last, *last_args, forward_fn=head_logits, **tied),
    ]


# What PipelineModule's partition_method balances: the blocks, as Megatron-DeepSpeed's
# "type:transformer" does; the embeddings go with the first stage, the norm and the head with the last.
PARTITION_METHOD = f"type:{BlockLayer.__name__}"


def pipeline_names(gpt: GPT) -> dict[str, list[str]]:
    """Each parameter's name in PipelineModule (its layer's index, or `tied_modules.<key>` for the
    tied layer, then the name inside the layer) -> its names in the GPT's state dict (the tied
    weight under both of its names), from the layers built as PipelineModule builds them."""
    in_gpt: dict[int, list[str]] = {}
    for name, p in gpt.named_parameters(remove_duplicate=False):
        in_gpt.setdefault(id(p), []).append(name)
    layers = [cls(*args) for cls, args in _layers(gpt)]
    out = {}
    for index, layer in enumerate(layers):
        prefix = f"tied_modules.{TIED_KEY}" if index in (0, len(layers) - 1) else str(index)
        out.update({f"{prefix}.{name}": in_gpt[id(p)] for name, p in layer.named_parameters()})
    return out


class ScheduledPipeline(nn.Module):
    """This rank's stage (DeepSpeed's PipelineModule), the model the loop calls: `run(inputs,
    targets)` runs the pipeline's schedule over a micro-batch, forward and backward, and returns
    the mean loss."""

    def __init__(self, stage: nn.Module, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.stage = stage
        self._run = run

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._run(inputs, targets)
