"""Pipeline stages of parabench's GPT: the model cut at block boundaries, the embeddings on the
first stage, the final norm and the head on the last.

Each stage holds the GPT's own submodules under the GPT's own names (`blocks.3` stays `blocks.3`),
so a stage's state dict is the GPT's restricted to that stage, and the stages of all ranks together
hold every key of the bare model's. The GPT ties its head to its token embedding; on a last stage
that is not also the first, the head is a copy of that weight (Megatron-LM's layout): the pipeline
strategy sums the two copies' gradients, so they stay equal through every step.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from models.gpt import GPT


class PipelineStagesError(ValueError):
    """A model that cannot be cut into the stages asked for (one line, says what would)."""


def check_stages(model: nn.Module, stages: int) -> None:
    """Refuse a model other than parabench's GPT, or one with fewer blocks than stages."""
    if not isinstance(model, GPT):
        raise PipelineStagesError(
            f"pipeline parallel cuts parabench's GPT (the zoo's gpt-* models) into stages, not {type(model).__name__}: "
            "use a gpt-* model, or fsdp / fsdp-tp for this one"
        )
    if model.config.n_layer < stages:
        raise PipelineStagesError(
            f"{stages} pipeline stages need at least {stages} blocks, and this GPT has {model.config.n_layer}: "
            "use a smaller strategy_options.pp_size, a schedule without virtual stages, or a deeper model"
        )


def blocks_per_stage(n_blocks: int, stages: int) -> list[range]:
    """The blocks of each stage, in order: as even as they go, the earlier stages one more."""
    base, extra = divmod(n_blocks, stages)
    out, start = [], 0
    for stage in range(stages):
        size = base + (1 if stage < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


class GPTStage(nn.Module):
    """One stage: token ids (first stage) or the residual stream in, the residual stream or the
    logits (last stage) out."""

    def __init__(self, gpt: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.gpt_config = gpt.config
        self.activation_checkpointing = gpt.activation_checkpointing
        if first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in blocks})
        if last:
            self.ln_f = gpt.ln_f
            self.lm_head = gpt.lm_head
            if not first:  # the tie crosses stages: this stage's own copy of the embedding's weight
                self.lm_head = nn.Linear(gpt.config.n_embd, gpt.config.vocab_size, bias=False)
                self.lm_head.weight = nn.Parameter(gpt.lm_head.weight.detach().clone())

    @property
    def holds_tied_copy(self) -> bool:
        """Whether this stage's head is a copy of the first stage's token embedding."""
        return self.last and not self.first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.size(1), device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for block in self.blocks.values():
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT's loss on the last stage's logits: the mean cross-entropy over the tokens."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class PipelinedStages(nn.Module):
    """A rank's stages under the GPT's own names, the model the loop calls: `run(inputs, targets)`
    runs the pipeline's schedule over a micro-batch, forward and backward, and returns the mean loss."""

    def __init__(self, stages: list[GPTStage], run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        blocks = nn.ModuleDict()
        for stage in stages:
            for name in ("wte", "wpe", "ln_f", "lm_head"):
                if hasattr(stage, name):
                    self.add_module(name, getattr(stage, name))
            for key, block in stage.blocks.items():
                blocks[key] = block
        self.blocks = blocks
        self._stages = tuple(stages)  # a tuple: not registered again under other names
        self._run = run

    def tied_pair(self) -> tuple[nn.Parameter | None, nn.Parameter | None]:
        """(the first stage's token embedding, the last stage's copy of it as its head), each where
        this rank holds it; (None, None) where one stage holds the tie whole."""
        embedding = next((s.wte.weight for s in self._stages if s.first and not s.last), None)
        copy = next((s.lm_head.weight for s in self._stages if s.holds_tied_copy), None)
        return embedding, copy

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._run(inputs, targets)
