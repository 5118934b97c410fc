"""Pipeline stages of any model whose blocks are found: substitution, not deletion or tracing.

A stage is the model itself, its modules under their own names (so its state dict is the bare
model's restricted to the stage, and checkpoints keep their keys), with what other stages hold
substituted, and the model's own forward run unchanged (models/stage_plan.py checks the
forward allows it):
  - a block before the stage's first, but the one just before it: PassThrough (returns its
    first argument); the one just before: Inject (returns the activation the stage received);
    the block just after the stage's last: ExitHere (raises StageExit with its first argument,
    which the stage's forward returns); any later block: Elsewhere (never reached);
  - on a stage other than the first, each part with weights that runs before the blocks
    (embeddings): ZeroStub, zeros of the shape the part would give, computed on a weightless
    twin on the meta device; parts without weights (rotary tables, dropout, masks) are kept, so
    each stage recomputes them from the inputs, which every stage is given;
  - on a stage other than the last, each part with weights that runs after the blocks: Elsewhere;
  - on a last stage that is not the first, a part reading a weight tied to one before the blocks
    holds its own copy of that weight (Megatron-LM's layout): the pipeline sums the two copies'
    gradients, so they stay equal.
Each stage's root is a shallow copy of the model's (and of each module on the way down to a
substitute), so several stages of one model can live on one rank.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

from models.stage_plan import CutPlan


class StageExit(Exception):
    """Raised where the stage ends, mid-forward; carries the activation the next stage receives."""

    def __init__(self, activation: torch.Tensor):
        super().__init__("the stage ends here")
        self.activation = activation


class _Received:
    """The activation a stage received, while its forward runs."""

    activation: torch.Tensor | None = None


class PassThrough(nn.Module):
    """A block of an earlier stage: hands its first argument on."""

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x


class Inject(nn.Module):
    """The block just before the stage: its output is the activation the stage received."""

    def __init__(self, received: _Received):
        super().__init__()
        self._received = received

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._received.activation


class ExitHere(nn.Module):
    """The block just after the stage: its first argument is the stage's output."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        raise StageExit(x)


class Elsewhere(nn.Module):
    """A module another stage holds, which this stage's forward never reaches."""

    def __init__(self, name: str):
        super().__init__()
        self.held_elsewhere = name

    def forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{self.held_elsewhere} is held by another pipeline stage, yet this stage ran it")


class ZeroStub(nn.Module):
    """A part with weights that runs before the blocks, on a later stage: zeros of the shape it
    would give (the stage's Inject replaces what flows from them), in the received activation's
    dtype and on its device."""

    def __init__(self, part: nn.Module, received: _Received):
        super().__init__()
        self._twin = (_meta_twin(part),)  # a tuple: not a submodule, no weights in the stage's state
        self._received = received

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        like = self._received.activation

        def on_meta(t: Any) -> Any:
            return t.to("meta") if isinstance(t, torch.Tensor) else t

        def zeros(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            dtype = like.dtype if t.is_floating_point() and like is not None else t.dtype
            return torch.zeros(t.shape, dtype=dtype, device=like.device if like is not None else None)

        return tree_map(zeros, self._twin[0](*tree_map(on_meta, args), **tree_map(on_meta, kwargs)))


# What a stage holds in place of another stage's modules: nothing to shard, split or wrap.
SUBSTITUTES = (PassThrough, Inject, ExitHere, Elsewhere, ZeroStub)


def _meta_twin(module: nn.Module) -> nn.Module:
    """`module` with its weights and buffers on the meta device, its own left as they are."""
    memo: dict[int, Any] = {}
    for t in (*module.parameters(), *module.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def cut(model: nn.Module, plan: CutPlan, stage: int) -> nn.Module:
    """Stage `stage` of `model` as `plan` cuts it, before any of its weights are sharded or
    moved (every stage a rank holds is cut first). Its forward takes the activation the stage
    receives (none on the first stage) and the model's inputs and targets as keywords:
    `stage(*received, inputs=..., targets=...)`; it returns the activation for the next stage,
    or on the last the model's loss."""
    received = _Received()
    first, last = stage == 0, stage == plan.stage_count - 1
    span = plan.spans[stage]
    swaps: dict[str, nn.Module] = {}
    for index, name in enumerate(plan.blocks):
        if index in span:
            continue
        if index == span.start - 1:
            swaps[name] = Inject(received)
        elif index < span.start:
            swaps[name] = PassThrough()
        elif index == span.stop:
            swaps[name] = ExitHere()
        else:
            swaps[name] = Elsewhere(name)
    if not first:
        swaps.update({name: ZeroStub(model.get_submodule(name), received) for name in plan.first_parts})
    if not last:
        swaps.update({name: Elsewhere(name) for name in plan.last_parts})
    elif not first and plan.ties:
        swaps.update(_tied_copies(model, plan))
    root = substituted(model, swaps)
    root.forward = _stage_forward(root.forward, received)
    return root


def _tied_copies(model: nn.Module, plan: CutPlan) -> dict[str, nn.Module]:
    """The last stage's parts that read a tied weight, each with its own copy of that weight
    (one copy per weight, shared by every part of the stage reading it)."""
    memo: dict[int, Any] = {}
    for tie in plan.ties:
        weight = model.get_parameter(tie.copy)
        memo.setdefault(id(weight), nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad))
    out = {}
    for name in plan.last_parts:
        part = model.get_submodule(name)
        if any(id(p) in memo for p in part.parameters()):
            shared = {id(t): t for t in (*part.parameters(), *part.buffers()) if id(t) not in memo}
            out[name] = copy.deepcopy(part, {**memo, **shared})
    return out


def _stage_forward(model_forward: Callable[..., Any], received: _Received) -> Callable[..., Any]:
    def forward(*activation: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        received.activation = activation[0] if activation else None
        try:
            return model_forward(inputs, targets)
        except StageExit as exit:  # caught here, inside the call: hooks on the stage see a return
            return exit.activation
        finally:
            received.activation = None

    return forward


def substituted(model: nn.Module, swaps: dict[str, nn.Module]) -> nn.Module:
    """A shallow copy of `model` with each module named in `swaps` replaced; every module on the
    way down to one is copied too, so `model` itself is left as it was."""
    copies: dict[str, nn.Module] = {}

    def copy_of(name: str) -> nn.Module:
        if name not in copies:
            copies[name] = _shallow(model.get_submodule(name))
            if name:
                parent, _, child = name.rpartition(".")
                copy_of(parent)._modules[child] = copies[name]
        return copies[name]

    for name, module in swaps.items():
        parent, _, child = name.rpartition(".")
        copy_of(parent)._modules[child] = module
    return copy_of("")


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of `module` sharing its submodules, weights and buffers, but not the tables that
    hold them (nor its hooks'): changing one leaves the other as it was."""
    new = copy.copy(module)
    for key, value in vars(module).items():
        if isinstance(value, (dict, set)):
            new.__dict__[key] = copy.copy(value)
    return new


def stage_blocks(plan: CutPlan, stage: int, root: nn.Module) -> list[nn.Module]:
    """The blocks stage `stage` (its root `root`) runs, in order."""
    return [root.get_submodule(plan.blocks[i]) for i in plan.spans[stage]]


class RankStages(nn.Module):
    """The stages one rank holds, as one module under the bare model's names (what the loop and
    the optimizer see, and what checkpoints save): `forward(inputs, targets)` runs `run`, the
    pipeline's schedule over a micro-batch, and returns the mean loss."""

    def __init__(
        self,
        model: nn.Module,
        plan: CutPlan,
        roots: dict[int, nn.Module],
        run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ):
        super().__init__()
        held = {i for stage in roots for i in plan.spans[stage]}
        last = plan.stage_count - 1
        swaps: dict[str, nn.Module] = {}
        swaps.update({name: Elsewhere(name) for i, name in enumerate(plan.blocks) if i not in held})
        if 0 not in roots:
            swaps.update({name: Elsewhere(name) for name in plan.first_parts})
        if last in roots:
            swaps.update({name: roots[last].get_submodule(name) for name in plan.last_parts})
        else:
            swaps.update({name: Elsewhere(name) for name in plan.last_parts})
        whole = substituted(model, swaps)
        self._modules = whole._modules
        self._buffers = whole._buffers
        self._non_persistent_buffers_set = whole._non_persistent_buffers_set
        self.plan = plan
        self._roots = tuple(roots.items())  # a tuple: not registered again under other names
        self._run = run

    def held_weight(self, name: str) -> nn.Parameter | None:
        """The weight `name` where this rank's stages hold it; None where another rank's do."""
        try:
            return self.get_parameter(name)
        except AttributeError:
            return None

    def train(self, mode: bool = True) -> RankStages:
        for _, root in self._roots:  # their own flags: the model's forward reads `self.training`
            root.train(mode)
        return super().train(mode)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._run(inputs, targets)
