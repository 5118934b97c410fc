"""The pipeline dimension of the torch mesh: the model cut into stages (models/stages.py: each
stage the model itself with the other stages' parts substituted, under the model's names), each
stage laid out as a model of its own (tensor parallel, context parallel, the engine), and run by a
torch.distributed.pipelining schedule (strategies/pipeline_parts.py).

`gpipe` and `1f1b` hold one stage per rank, `interleaved-1f1b` and `zero-bubble` two: rank r holds
stages r and r + pp. Each micro-step of the loop hands its micro-batch to one run of the schedule;
the loss the loop logs is computed on the last stage and broadcast to the pipeline's other ranks.
Under context parallel each rank of a group runs the schedule on its share of the sequences (a
stage's forward sees activations, so the pipeline, not a hook on the model, takes the share) and
the group averages the loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.parallel_dims import SCHEDULES, ParallelDims

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.stage_plan import CutPlan
    from strategies.parallelize import Meshes


class Pipeline:
    def __init__(
        self,
        dims: ParallelDims,
        meshes: Meshes,
        rank: int,
        plan: CutPlan,
        schedule: str,
        microbatches: int,
        attention: str,
    ):
        import torch.distributed as dist

        from strategies.pipeline_parts import tie_group

        assert meshes.pp is not None
        self.dims, self.plan = dims, plan
        self.schedule_name = schedule
        self.virtual = SCHEDULES[schedule][1]
        self.microbatches = microbatches
        self.group = meshes.pp.get_group()
        self.pp_rank = meshes.pp.get_local_rank()
        self.last_rank = dist.get_global_rank(self.group, dims.pp - 1)
        self.cp_mesh, self.attention = meshes.cp, attention
        self.share_positions: torch.Tensor | None = None  # of the share the current run computes on
        self.tie_group = tie_group(dims.world_size, dims.pp, rank) if plan.ties else None
        self.stages: list[Any] = []
        self.schedule: Any = None
        self.model: Any = None

    def my_stages(self) -> list[int]:
        return [self.pp_rank + k * self.dims.pp for k in range(self.virtual)]

    def cut(self, model: nn.Module) -> dict[int, nn.Module]:
        """This rank's stages of `model` (index -> its root), every one cut before any is laid out."""
        from models.stages import cut

        return {index: cut(model, self.plan, index) for index in self.my_stages()}

    def blocks_of(self, index: int, root: nn.Module) -> list[nn.Module]:
        from models.stages import stage_blocks

        return stage_blocks(self.plan, index, root)

    def start(self, model: nn.Module, roots: dict[int, nn.Module], device: torch.device, grad_accum: int) -> Any:
        """The schedule over this rank's laid-out stages, and the module the loop calls: the stages
        under the model's names, whose forward runs the schedule."""
        from models.stages import RankStages
        from strategies.pipeline_parts import build_schedule, pipeline_stage

        count = self.dims.pp * self.virtual
        self.stages = [pipeline_stage(root, index, count, device, self.group) for index, root in roots.items()]
        self.schedule = build_schedule(self.stages, self.schedule_name, self.microbatches, grad_accum)
        self.model = RankStages(model, self.plan, roots, lambda inputs, targets: self.run(inputs, targets, grad_accum))
        return self.model

    def run(self, inputs: torch.Tensor, targets: torch.Tensor, grad_accum: int) -> torch.Tensor:
        """One run of the schedule over the loop's micro-batch, forward and backward; the mean loss
        over it on every rank of the pipeline (and of its context-parallel group)."""
        import torch
        import torch.distributed as dist

        from strategies.pipeline_parts import run_schedule

        if self.cp_mesh is not None:  # this rank's share of every sequence
            from models.context_parallel import sequence_share

            inputs, targets, self.share_positions = sequence_share(self.cp_mesh, self.attention, inputs, targets)
        loss = run_schedule(self.schedule, self.stages, inputs, targets, grad_accum)
        loss = torch.zeros((), device=inputs.device) if loss is None else loss
        dist.broadcast(loss, src=self.last_rank, group=self.group)
        if self.cp_mesh is not None:
            dist.all_reduce(loss, group=self.cp_mesh.get_group())
            loss /= self.cp_mesh.size()
        return loss

    def positions(self) -> torch.Tensor:
        """The positions of the share of the sequences the current run computes on."""
        assert self.share_positions is not None, "a run of the schedule first"
        return self.share_positions

    def describe(self) -> str:
        mine = self.my_stages()
        return (
            f"pipeline of {self.dims.pp * self.virtual} stages over {self.dims.pp} ranks ({self.schedule_name}, "
            f"{self.microbatches} micro-batches a step; this rank: stages {', '.join(map(str, mine))}, blocks "
            f"{'; '.join(self.plan.span_text(i) for i in mine)})"
        )

    def teardown(self) -> None:
        self.schedule = None
        self.stages = []
        self.model = None
