"""Models as the flat sequence of layers DeepSpeed's PipelineModule cuts into stages.

parabench's GPT is laid out as DeepSpeed's own GPT (Megatron-DeepSpeed's GPTModelPipe) is: a list
of layer specs, the embedding as a TiedLayerSpec, the transformer layers, the final norm, and the
same TiedLayerSpec again with a forward function that multiplies by the embedding's weight for the
logits. PipelineModule builds only the specs of its own stage; the tied spec is built on the first
and on the last stage, and DeepSpeed broadcasts the first stage's weight to the last at build and
all-reduces the two copies' gradients before each step. Here each spec builds a thin layer around
the GPT's own submodule, so that the pipeline starts from the very weights every other strategy
starts from (seeded, built once on the CPU), and each parameter is the GPT's own object, whose
names in the bare model pipeline_names gives.

Any other model whose blocks are found is one layer per stage, each a stage of models/stages.py's
cut (StageLayer): the model's own forward, its modules under its own names. DeepSpeed passes one
tensor or a tuple from stage to stage and gives the first stage the data's first element, so the
inputs and targets travel with the activation, and the last stage returns the model's loss. A
weight tied across stages is the cut's: the last stage holds a copy, whose gradient DeepSpeed's
own ReduceTiedGrads sums with the first stage's (tie_cut_weights).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.activation_checkpointing import recompute
from models.gpt import GPT
from models.stage_plan import CutPlan
from models.stages import cut

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


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT's loss on the last stage's logits, as its forward computes it: the mean cross-entropy."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class PositionEmbedding(nn.Module):
    """Adds the position embeddings, then the GPT's embedding dropout."""

    def __init__(self, wpe: nn.Embedding, drop: nn.Dropout):
        super().__init__()
        self.wpe, self.drop = wpe, drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x + self.wpe(torch.arange(x.size(1), device=x.device)))


class BlockLayer(nn.Module):
    """One of the GPT's blocks, recomputed in the backward where the GPT's own switch says so, keeping
    what its checkpoint context keeps."""

    def __init__(self, block: nn.Module, recompute: bool, context_fn: Callable[[], Any]):
        super().__init__()
        self.block, self.recompute, self.context_fn = block, recompute, context_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and self.training:
            return recompute(self.block, x, context_fn=self.context_fn)
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
        *((BlockLayer, (block, gpt.activation_checkpointing, gpt.checkpoint_context_fn)) for block in gpt.blocks),
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


class StageLayer(nn.Module):
    """Stage `stage` of the cut as one DeepSpeed layer, under the model's own names: takes
    (inputs, targets) on the first stage, (activation, inputs, targets) on the others, and
    returns the same triple for the next stage, or on the last the model's loss."""

    def __init__(self, model: nn.Module, plan: CutPlan, stage: int):
        super().__init__()
        root = cut(model, plan, stage)
        # The stage's own tables: moving or casting this layer moves and casts the stage.
        self._modules = root._modules
        self._buffers = root._buffers
        self._non_persistent_buffers_set = root._non_persistent_buffers_set
        self._root = (root,)  # a tuple: not registered again under another name
        self.first, self.last = stage == 0, stage == plan.stage_count - 1

    def train(self, mode: bool = True) -> StageLayer:
        self._root[0].train(mode)  # its own flag: the model's forward reads `self.training`
        return super().train(mode)

    def forward(self, received: tuple[torch.Tensor, ...]) -> Any:
        activation, (inputs, targets) = received[:-2], received[-2:]
        out = self._root[0](*activation, inputs=inputs, targets=targets)
        return out if self.last else (out, inputs, targets)


def stage_layer_specs(model: nn.Module, plan: CutPlan) -> list[Any]:
    """A LayerSpec per stage, each building its stage of `model` where PipelineModule places it."""
    from deepspeed.pipe import LayerSpec

    return [LayerSpec(StageLayer, model, plan, stage) for stage in range(plan.stage_count)]


def stage_layer_names(model: nn.Module) -> Callable[[str], list[str]]:
    """A StageLayer parameter's name in PipelineModule (its stage, then its name in the model) ->
    its names in the bare model (a tied weight under each of its names; the last stage's copy too)."""
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    by_name = {name: names for names in aliases.values() for name in names}
    return lambda name: by_name[name.split(".", 1)[1]]


def tie_cut_weights(stage: nn.Module, plan: CutPlan, groups: dict[str, Any]) -> None:
    """Hands DeepSpeed the cut's tied weights this stage holds, with their group of the first and
    the last stage (`groups`: by the tie's first name; none on a middle stage): its ReduceTiedGrads
    then sums their gradients, and its gradient norm counts each once (the copy marked
    pipe-replicated, as DeepSpeed marks its own tied layers' copies)."""
    held = []
    for tie in plan.ties:
        for name, is_copy in ((tie.first, False), (tie.copy, True)):
            weight = _weight(stage, name)
            if weight is not None and groups.get(tie.first) is not None:
                held.append((weight, groups[tie.first]))
                weight.ds_pipe_replicated = is_copy
    stage.get_tied_weights_and_groups = lambda: list(held)


def _weight(stage: nn.Module, name: str) -> nn.Parameter | None:
    """The weight `name` of the model in this PipelineModule's one StageLayer, if it holds it."""
    for layer in stage.children():
        if isinstance(layer, StageLayer):
            try:
                return layer.get_parameter(name)
            except AttributeError:
                return None
    return None


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
