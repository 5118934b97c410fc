"""Where a model is cut into pipeline stages, and whether it can be: checked on one traced
forward (models/stage_trace.py) before any stage is built.

The cut (models/stages.py) keeps the model's own forward and substitutes what a stage does not
hold, so it needs of the model only what that forward shows:
  (1) the blocks each run once, one after another, none inside another, each taking a tensor
      first and returning one tensor; no weight outside them is read between two blocks;
  (2) at each cut, the next block's first argument *is* the previous block's output (no code
      between them, which would run on both stages);
  (3) a block's arguments, and whatever the forward computes after a cut, depend on nothing
      computed from weights on an earlier stage but the activation the stage receives (masks
      and positions made from the inputs, or by modules without weights, are recomputed on
      every stage);
  (4) the forward returns the loss, a scalar.
Outside the blocks, each submodule holding weights (a *part*) runs either before the blocks (the
first stage holds it) or after them (the last stage does); a weight tied between a part before
and a part after is a *tie*: the last stage holds a copy, whose gradient the pipeline sums with
the first stage's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn as nn

from models.stage_split import blocks_per_stage
from models.stage_trace import BEFORE_BLOCKS, Trace, TraceFailed, run_traced

DEFAULT_SEQ_LEN = 16  # the traced sequence length where the run gives none


class StagesError(ValueError):
    """A model that cannot be cut into the stages asked for (one line, says what would)."""


@dataclass(frozen=True)
class Tie:
    """A weight read before the blocks under `first` and after them under `copy`."""

    first: str
    copy: str


@dataclass(frozen=True)
class CutPlan:
    """Which blocks each stage holds, and what else the first and the last stage hold."""

    blocks: tuple[str, ...]  # the blocks' names in the model, in the order the forward runs them
    spans: tuple[range, ...]  # each stage's blocks (indices into `blocks`)
    first_parts: tuple[str, ...]  # submodules with weights that run before the blocks (or never)
    last_parts: tuple[str, ...]  # submodules with weights that run after the blocks
    ties: tuple[Tie, ...]

    @property
    def stage_count(self) -> int:
        return len(self.spans)

    def span_text(self, stage: int) -> str:
        span = self.spans[stage]
        return str(span.start) if len(span) == 1 else f"{span.start}-{span.stop - 1}"


def cut_plan(
    model: nn.Module, blocks: tuple[nn.Module, ...], stages: int, seq_len: int | None = None
) -> CutPlan | None:
    """The plan for cutting `model` (its `blocks` as models/blocks.py finds them) into `stages`,
    or a StagesError saying why it cannot be. None where the model is on the meta device and its
    forward cannot run on fake tensors (it reads a value): it is checked once built, on its real
    weights."""
    kind = type(model).__name__
    if not blocks:
        raise StagesError(
            f"pipeline parallel cuts a model between its blocks, and {kind} has none (no repeated layers found): "
            "name them with model_blocks=<ClassName>, or use fsdp for this model"
        )
    if len(blocks) < stages:
        raise StagesError(
            f"{stages} pipeline stages need at least {stages} blocks, and this {kind} has {len(blocks)}: use a "
            "smaller strategy_options.pp_size, a schedule without virtual stages, or a deeper model"
        )
    names = {id(m): name for name, m in model.named_modules()}
    found = [names[id(b)] for b in blocks]
    parts = _parts(model, found)
    seq_len = seq_len or DEFAULT_SEQ_LEN
    try:
        trace = run_traced(model, found, parts, seq_len)
    except TraceFailed as fake_failed:
        if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            return None
        try:
            trace = run_traced(model, found, parts, seq_len, real=True)
        except TraceFailed as exc:
            raise StagesError(f"{kind}'s forward failed when traced for the cut ({exc}; {fake_failed})") from None
    return _plan(kind, trace, found, parts, stages)


def _parts(model: nn.Module, blocks: list[str]) -> list[str]:
    """The submodules outside the blocks that the cut keeps or substitutes whole: every child of a
    module holding blocks that is neither a block nor holds one. Weights directly on a module
    holding blocks cannot be taken off a stage: refused."""
    holders = {""} | {name.rsplit(".", 1)[0] if "." in name else "" for name in blocks}
    for name in list(holders):
        while "." in name:
            name = name.rsplit(".", 1)[0]
            holders.add(name)
    out = []
    for holder in sorted(holders):
        module = model.get_submodule(holder)
        own = [n for n, p in module.named_parameters(recurse=False)]
        if own:
            where = f"{holder}.{own[0]}" if holder else own[0]
            raise StagesError(
                f"the weight {where} sits on {type(module).__name__}, which holds the blocks, so no stage can leave it "
                "out: move it into a submodule (an nn.Embedding, an nn.Linear) for pipeline parallel"
            )
        for child, _ in module.named_children():
            name = f"{holder}.{child}" if holder else child
            if name not in holders and name not in blocks:
                out.append(name)
    return out


def _plan(kind: str, trace: Trace, found: list[str], parts: list[str], stages: int) -> CutPlan:
    if not isinstance(trace.output, torch.Tensor) or trace.output.dim() != 0:
        raise StagesError(
            f"{kind}'s forward returns {_what(trace.output)}, not the loss: pipeline parallel needs "
            "forward(inputs, targets) to return the scalar loss (parabench's model contract)"
        )
    order = list(dict.fromkeys(trace.calls))
    counts = Counter(trace.calls)
    for index, name in enumerate(found):
        if index not in order:
            raise StagesError(f"block {name} never runs in {kind}'s forward: the cut needs every block to run once")
        if counts[index] > 1:
            raise StagesError(
                f"block {name} runs {counts[index]} times in {kind}'s forward: the cut needs each block to run once "
                "(a shared block cannot sit on one stage)"
            )
        if index not in trace.block_calls:
            raise StagesError(f"block {name} runs inside another block: name the outer blocks with model_blocks=")
    if order != sorted(order):
        raise StagesError(
            f"{kind}'s forward runs its blocks in another order than the model lists them ({', '.join(found)}): "
            "name the blocks in the order they run, or use fsdp for this model"
        )
    blocks = found
    for name, call in zip(blocks, (trace.block_calls[i] for i in order), strict=True):
        if not isinstance(call.output, torch.Tensor) or not isinstance(call.first_arg, torch.Tensor):
            raise StagesError(
                f"block {name} returns {_what(call.output)}: the cut passes one tensor from block to block, so "
                "each block must take the hidden state first and return it alone"
            )
    spans = tuple(blocks_per_stage(len(blocks), stages))
    first_parts, last_parts, ties = _place_parts(kind, trace, blocks, parts)
    plan = CutPlan(tuple(blocks), spans, first_parts, last_parts, ties)
    _check_cuts(kind, trace, plan)
    return plan


def _place_parts(
    kind: str, trace: Trace, blocks: list[str], parts: list[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Tie, ...]]:
    """Each part holding weights placed before or after the blocks, from where its weights are
    read; the weights tied between a part before and one after."""
    last = len(blocks) - 1

    def owner(name: str, among: list[str]) -> str | None:
        return next((p for p in among if name == p or name.startswith(p + ".")), None)

    sides: dict[str, set[str]] = {}
    for first_name, reads in trace.outside_reads.items():
        names = trace.names[first_name]
        for block in filter(None, (owner(n, blocks) for n in names)):
            raise StagesError(f"{names[0]} belongs to block {block} but is read outside it: the cut keeps it there")
        for position, part in reads:
            mine = part is not None and any(owner(n, [part]) for n in names)
            if not mine:
                raise StagesError(
                    f"{kind}'s forward reads {names[0]} outside its module ({'in ' + part if part else 'directly'}): "
                    "the cut moves whole modules, so give that use a module of its own (a head nn.Linear whose "
                    "weight is tied to it)"
                )
            if position not in (BEFORE_BLOCKS, last):
                raise StagesError(
                    f"{part} runs between blocks {blocks[position]} and {blocks[position + 1]} with weights of its "
                    "own: the cut puts modules with weights before or after the blocks; make it part of a block"
                )
            sides.setdefault(part, set()).add("before" if position == BEFORE_BLOCKS else "after")
    for first_name, readers in trace.block_reads.items():
        names = trace.names[first_name]
        owners = {owner(n, blocks) for n in names} - {None}
        if len(owners) > 1 or any(blocks[i] not in owners for i in readers):
            raise StagesError(
                f"{names[0]} is shared by blocks or read by a block it does not belong to: the cut puts each "
                "block's weights on one stage"
            )
    for part, side in sides.items():
        if len(side) > 1:
            raise StagesError(
                f"{part} runs both before and after the blocks: the cut puts it on the first or the last stage; "
                "give the later use a module of its own (its weight tied)"
            )
    holding = {owner(n, parts) for names in trace.names.values() for n in names} - {None}
    last_parts = tuple(p for p in parts if sides.get(p) == {"after"})
    first_parts = tuple(p for p in parts if p in holding and p not in last_parts)
    ties = []
    for names in trace.names.values():
        before = [n for n in names if owner(n, list(first_parts))]
        after = [n for n in names if owner(n, list(last_parts))]
        if before and after:  # one copy on the last stage, however many of its parts read it
            ties.append(Tie(before[0], after[0]))
    return first_parts, last_parts, tuple(ties)


def _check_cuts(kind: str, trace: Trace, plan: CutPlan) -> None:
    """(2) and (3) at the cuts of `plan`."""
    blocks, n = plan.blocks, len(plan.blocks)
    stage_of = {i: s for s, span in enumerate(plan.spans) for i in span}
    calls = [trace.block_calls[i] for i in range(n)]
    for stage in range(1, plan.stage_count):
        start = plan.spans[stage].start
        if calls[start].first_arg is not calls[start - 1].output:
            raise StagesError(
                f"{kind}'s forward changes block {blocks[start - 1]}'s output before block {blocks[start]} takes it, "
                "where the pipeline cuts: the cut needs each block's output passed on as the next block's first "
                "argument; move that code into a block"
            )

    def received(position: int) -> int:
        """The earliest source the stage running after block `position` may read: the block before its first."""
        return plan.spans[stage_of[min(position + 1, n - 1)]].start - 1

    def source(index: int) -> str:
        return "weights read before the blocks" if index == BEFORE_BLOCKS else f"block {blocks[index]}'s output"

    for k, call in enumerate(calls):
        if call.earliest is not None and call.earliest < received(k - 1):
            raise StagesError(
                f"block {blocks[k]}'s {call.earliest_arg} is computed from {source(call.earliest)}, which stage "
                f"{stage_of[k]} does not hold: a block's arguments other than the hidden state must come from the "
                "inputs or from modules without weights"
            )
    for position, (earliest, op, block) in sorted(trace.earliest_at.items()):
        if earliest < received(position):
            if block is not None:
                where = f"in block {blocks[block]}"
            else:
                where = "before the blocks" if position == BEFORE_BLOCKS else f"after block {blocks[position]}"
            raise StagesError(
                f"{kind}'s forward computes {op} {where} from {source(earliest)}, which the stage running it does "
                "not hold: after a cut only the block's output may carry what earlier stages computed"
            )


def _what(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
