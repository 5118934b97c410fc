"""The pipeline dimension of the torch mesh: the model cut into stages (models/pipeline_stages.py),
each parallelized as a model of its own, and run by a torch.distributed.pipelining schedule.

`gpipe` (ScheduleGPipe) and `1f1b` (Schedule1F1B) hold one stage per rank, `interleaved-1f1b`
(ScheduleInterleaved1F1B) and `zero-bubble` (ScheduleInterleavedZeroBubble) two: rank r holds
stages r and r + pp. Each micro-step of the loop hands its micro-batch to one run of the schedule,
which cuts it into `microbatches` pipeline micro-batches and runs their forwards and backwards; the
loss of each is scaled by 1/(grad_accum x microbatches), so the step's gradient is the global
batch's mean (the schedule's own division by its micro-batch count would divide the gradients of
the loop's earlier micro-steps again). The loss the loop logs is computed on the last stage and
broadcast to the pipeline's other ranks; under context parallel each rank of a group runs the
schedule on its slice of the sequences and the group averages the loss.

A weight tied across stages (the GPT's head and token embedding) is held twice: the last stage keeps
a copy, and the two copies' gradients are summed between the first and the last stage before each
step, as Megatron-LM does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.parallel_dims import SCHEDULES, ParallelDims

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from strategies.parallelize import Meshes


class Pipeline:
    def __init__(self, dims: ParallelDims, meshes: Meshes, rank: int, schedule: str, microbatches: int, attention: str):
        import torch.distributed as dist

        assert meshes.pp is not None
        self.dims = dims
        self.schedule_name = schedule
        self.virtual = SCHEDULES[schedule][1]
        self.microbatches = microbatches
        self.group = meshes.pp.get_group()
        self.pp_rank = meshes.pp.get_local_rank()
        self.last_rank = dist.get_global_rank(self.group, dims.pp - 1)
        self.cp_mesh, self.attention = meshes.cp, attention
        self.share_positions: torch.Tensor | None = None  # of the share the current run computes on
        self.tie_group = _tie_group(dims, rank)
        self.stages: list[Any] = []
        self.schedule: Any = None
        self.model: Any = None

    @property
    def stage_count(self) -> int:
        return self.dims.pp * self.virtual

    def my_stages(self) -> list[int]:
        return [self.pp_rank + k * self.dims.pp for k in range(self.virtual)]

    def cut(self, model: nn.Module) -> list[tuple[int, nn.Module]]:
        """This rank's stages of `model` (index, module), under the model's own names."""
        from models.pipeline_stages import GPTStage, blocks_per_stage

        cuts = blocks_per_stage(model.config.n_layer, self.stage_count)
        self.spans = [cuts[index] for index in self.my_stages()]
        return [
            (index, GPTStage(model, cuts[index], first=index == 0, last=index == self.stage_count - 1))
            for index in self.my_stages()
        ]

    def start(self, parts: list[tuple[int, nn.Module]], device: torch.device, grad_accum: int) -> nn.Module:
        """The schedule over this rank's parallelized stages, and the module the loop calls: the
        stages under the model's own names, whose forward runs the schedule."""
        import torch.distributed.pipelining as pipelining
        from torch.distributed.pipelining import PipelineStage

        from models.pipeline_stages import PipelinedStages, next_token_loss

        modules = [module for _, module in parts]
        self.stages = [
            PipelineStage(module, index, self.stage_count, device, group=self.group) for index, module in parts
        ]
        share = grad_accum * self.microbatches

        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            # Each pipeline micro-batch's share of the step's mean. The schedule's own scaling is off:
            # it divides every gradient the stage holds, those of the loop's earlier micro-steps too.
            return next_token_loss(logits, targets) / share

        cls = getattr(pipelining, SCHEDULES[self.schedule_name][0])
        stages = self.stages if self.virtual > 1 else self.stages[0]
        self.schedule = cls(stages, n_microbatches=self.microbatches, loss_fn=loss_fn, scale_grads=False)
        self.model = PipelinedStages(modules, lambda inputs, targets: self.run(inputs, targets, grad_accum, device))
        return self.model

    def run(self, inputs: torch.Tensor, targets: torch.Tensor, grad_accum: int, device: torch.device) -> torch.Tensor:
        """One run of the schedule over the loop's micro-batch, forward and backward; the mean loss
        over it on every rank of the pipeline."""
        import torch
        import torch.distributed as dist

        if self.cp_mesh is not None:  # this rank's share of every sequence
            from models.context_parallel import sequence_share

            inputs, targets, self.share_positions = sequence_share(self.cp_mesh, self.attention, inputs, targets)
        first = any(s.is_first for s in self.stages)
        last = any(s.is_last for s in self.stages)
        losses: list[torch.Tensor] = []
        args = (inputs,) if first else ()
        self.schedule.step(*args, target=targets if last else None, losses=losses if last else None)
        loss = torch.zeros((), device=device)
        if last:
            loss = torch.stack([x.detach().float() for x in losses]).sum() * grad_accum
        dist.broadcast(loss, src=self.last_rank, group=self.group)
        if self.cp_mesh is not None:
            dist.all_reduce(loss, group=self.cp_mesh.get_group())
            loss /= self.cp_mesh.size()
        return loss

    def positions(self) -> torch.Tensor:
        """The positions of the share of the sequences the current run computes on."""
        assert self.share_positions is not None, "a run of the schedule first"
        return self.share_positions

    def sum_tied_gradients(self) -> None:
        """The token embedding's gradient on the first stage and its head copy's on the last, each
        replaced by their sum: the tied weight's gradient, on both."""
        import torch.distributed as dist

        embedding, copy = self.model.tied_pair()
        if copy is None and (embedding is None or self.tie_group is None):
            return  # a middle stage, or one stage holding the tie whole
        if embedding is not None and copy is not None:  # both stages on this rank (virtual stages)
            total = embedding.grad.to_local() + copy.grad.to_local()
            embedding.grad.to_local().copy_(total)
            copy.grad.to_local().copy_(total)
            return
        dist.all_reduce((embedding if copy is None else copy).grad.to_local(), group=self.tie_group)

    def describe(self) -> str:
        spans = "; ".join(_span(blocks) for blocks in self.spans)
        return (
            f"pipeline of {self.stage_count} stages over {self.dims.pp} ranks ({self.schedule_name}, "
            f"{self.microbatches} micro-batches a step; this rank: stages {', '.join(map(str, self.my_stages()))}, "
            f"blocks {spans})"
        )

    def teardown(self) -> None:
        self.schedule = None
        self.stages = []
        self.model = None


def _span(blocks: range) -> str:
    if not blocks:
        return "none"
    return str(blocks.start) if len(blocks) == 1 else f"{blocks.start}-{blocks.stop - 1}"


def _tie_group(dims: ParallelDims, rank: int) -> Any:
    """The process group of the first and the last pipeline rank at this rank's place in the other
    dimensions (every rank creates every group, as new_group requires); None on the ranks in
    between, and where one rank holds both."""
    import torch.distributed as dist

    if dims.pp == 1:
        return None
    inner = dims.world_size // dims.pp  # the pipeline is the outermost dimension
    mine = None
    for place in range(inner):
        ranks = [place, (dims.pp - 1) * inner + place]
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine
