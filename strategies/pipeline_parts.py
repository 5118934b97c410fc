"""The pieces of a torch.distributed.pipelining run, for any strategy with a pipeline dimension
(the outermost of its mesh): the schedule and its loss scaling, one run of it over the loop's
micro-batch, the tied weights' gradients summed between the first and the last stage (and the
copies the clipping norm leaves out: strategies/fsdp.py sums it over the stages), and the
consolidated weights gathered from the stages.

The stages are models/stages.py's cut of the model: each runs the model's own forward, so the
last stage returns the model's loss; every stage is given the micro-batch's inputs and targets as
keyword arguments (the schedule splits them into pipeline micro-batches with its positional ones).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from models.stages import RankStages

# schedule option -> (torch's class, virtual stages per rank)
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2),
    "zero-bubble": ("ScheduleInterleavedZeroBubble", 2),
}


def pipeline_stage(module: Any, index: int, count: int, device: torch.device, group: Any) -> Any:
    """torch's PipelineStage of `module`, stage `index` of `count` over `group`. torch learns the
    shapes a stage sends by running it once on the first micro-batch, a stage after the first on
    activations it makes from their shapes alone, uninitialised (torch.empty_strided): here they
    are zeros, so that a forward reading a value (a user's finiteness guard) sees a number, and an
    MoE layer's router does not count that run as routed tokens.

    Under FSDP2 the stage's units are gathered before each half of a backward that zero-bubble
    splits in two: torch finds the weights whose gradients the second half computes among the
    parameters the stage has registered, and a unit resharded after forward has registered its
    shards, not the gathered weights the forward's graph used, so those weights were left out of
    both halves and their gradients of that micro-batch lost."""
    from torch.distributed.pipelining import PipelineStage

    return _stage_class(PipelineStage)(module, index, count, device, group=group)


def gather_units(module: Any) -> None:
    """Gather every FSDP2 unit of `module` that holds shards, so that its parameters are the gathered
    weights a forward uses (a no-op for one gathered already, or not under FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.unshard()


@functools.cache
def _stage_class(base: type) -> type:
    import torch

    class Stage(base):  # type: ignore[misc, valid-type]
        def _to_tensor(self, arg: Any) -> torch.Tensor:
            made = super()._to_tensor(arg)
            if not isinstance(arg, torch.Tensor):  # made from metadata: its memory as it was
                with torch.no_grad():
                    made.zero_()
            return made

        def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
            from models.routing import tallies_paused

            with tallies_paused():  # a forward for shapes, not a training step's
                return super()._forward_metadata_inference(*args, **kwargs)

        def backward_maybe_with_nosync(self, backward_type: str, bwd_kwargs: dict, last_backward: bool = False) -> Any:
            # The input half lists self.submod.parameters() before its autograd runs and keeps the
            # gradient nodes of those among them the forward's graph reaches; the weight half
            # assigns the gradients it computes to the parameters it finds registered then. Both
            # must be the gathered weights: a unit resharded after forward (and again by a forward
            # between the halves) has its shards registered. A full backward (autograd's own,
            # whose hooks gather) needs nothing.
            if backward_type in ("input", "weight"):
                gather_units(self.submod)
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward=last_backward)

    return Stage


def build_schedule(stages: list[Any], schedule: str, microbatches: int, grad_accum: int) -> Any:
    """torch's `schedule` over this rank's PipelineStages. Each pipeline micro-batch's loss is
    scaled to its share of the step's mean, 1/(grad_accum x microbatches); the schedule's own
    scaling is off: it divides every gradient the stage holds, those of the loop's earlier
    micro-steps too."""
    import torch.distributed.pipelining as pipelining

    share = grad_accum * microbatches

    def loss_fn(loss: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss / share  # the model's own loss, which its forward computed from the targets

    name, virtual = SCHEDULES[schedule]
    cls = getattr(pipelining, name)
    return cls(stages if virtual > 1 else stages[0], n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=False)


def run_schedule(
    schedule: Any, stages: list[Any], inputs: torch.Tensor, targets: torch.Tensor, grad_accum: int
) -> torch.Tensor | None:
    """One run of `schedule` over the loop's micro-batch, forward and backward. Returns the mean
    loss over it on a rank holding the last stage, None elsewhere."""
    import torch

    last = any(s.is_last for s in stages)
    losses: list[torch.Tensor] = []
    # `target` is what the schedule hands its loss function; the stages take both as keywords. The
    # last stage's outputs are the losses themselves, scalars the schedule need not merge.
    schedule.step(
        target=targets if last else None,
        losses=losses if last else None,
        return_outputs=False,
        inputs=inputs,
        targets=targets,
    )
    if not last:
        return None
    return torch.stack([x.detach().float() for x in losses]).sum() * grad_accum


def tie_group(world_size: int, pp: int, rank: int) -> Any:
    """The process group of the first and the last pipeline rank at this rank's place in the other
    dimensions of a mesh whose outermost dimension is the pipeline (every rank creates every group,
    as new_group requires); None on the ranks in between, and where one rank holds both."""
    import torch.distributed as dist

    if pp == 1:
        return None
    inner = world_size // pp
    mine = None
    for place in range(inner):
        ranks = [place, (pp - 1) * inner + place]
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def tied_copies(model: RankStages) -> set[int]:
    """The ids of the last stage's copies of tied weights this rank holds: left out of the
    gradient norm, which counts each tied weight once."""
    copies = set()
    for tie in model.plan.ties:
        first, copy = model.held_weight(tie.first), model.held_weight(tie.copy)
        if copy is not None and copy is not first:
            copies.add(id(copy))
    return copies


def sum_tied_gradients(model: RankStages, group: Any) -> None:
    """Each tied weight's gradient on the first stage and its copy's on the last, each replaced by
    their sum: the tied weight's gradient, on both (group: tie_group's)."""
    import torch.distributed as dist

    for tie in model.plan.ties:
        first, copy = model.held_weight(tie.first), model.held_weight(tie.copy)
        if first is copy:
            continue  # one stage holds the tie whole, or a middle stage holds neither
        if first is not None and copy is not None:  # both stages on this rank (virtual stages)
            total = _local(first.grad) + _local(copy.grad)
            _local(first.grad).copy_(total)
            _local(copy.grad).copy_(total)
        elif group is not None:
            dist.all_reduce(_local((first if copy is None else copy).grad), group=group)


def tied_layouts(part: Any, ties: Any) -> dict[str, str]:
    """The tensor-parallel layout (its DTensor placements, or "whole") of each tied weight a stage
    `part` holds, under the weight's name: read between tensor parallel and the engine."""
    from torch.distributed.tensor import DTensor

    layouts = {}
    for tie in ties:
        for name in (tie.first, tie.copy):
            try:
                weight = part.get_parameter(name)
            except AttributeError:  # another stage's
                continue
            layouts[name] = str(tuple(weight.placements)) if isinstance(weight, DTensor) else "whole"
    return layouts


def check_tied_layouts(layouts: dict[str, str], ties: Any, group: Any) -> None:
    """Refuse, in one line, a tied weight whose two ends tensor parallel split differently: their
    gradients, summed between the first and the last stage before each step (sum_tied_gradients),
    would not even have the same size (gloo aborts the process on it). The ends' layouts are
    exchanged over `group` (tie_group's; None where this rank holds both ends or neither). The
    whole model's tied weights are held to the same rule as they are split (models/tensor_parallel.py)."""
    import torch.distributed as dist

    from strategies.base import StrategyError

    if group is not None:
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, layouts, group=group)
        layouts = {name: layout for other in gathered for name, layout in other.items()}
    for tie in ties:
        first, copy = layouts.get(tie.first), layouts.get(tie.copy)
        if first is not None and copy is not None and first != copy:
            raise StrategyError(
                f"{tie.first} and {tie.copy} are one tied parameter, but the tensor-parallel plan splits them "
                f"differently ({first} vs {copy}): give both the same split, or neither"
            )


def gather_full_state(model: RankStages, leads: bool, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """The consolidated weights of every stage under the model's names, on rank 0 ({} elsewhere).
    Every rank takes part (the stages' shards are gathered over their data-parallel groups);
    `leads`: this rank is the first of its stage's data-parallel ranks, whose copy is sent."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    mine = {}
    for name, t in model.state_dict().items():
        whole = t.full_tensor() if isinstance(t, DTensor) else t  # a collective over the stage's group
        mine[name] = whole.detach().cpu()
    parts: list[Any] = [None] * world_size if rank == 0 else []
    dist.gather_object(mine if leads else {}, parts if rank == 0 else None, dst=0)
    if rank != 0:
        return {}
    return {name: t for part in parts for name, t in part.items()}
