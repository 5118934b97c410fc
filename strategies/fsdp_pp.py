"""`fsdp-pp`: pipeline parallel over pp_size groups of ranks, FSDP2 inside each stage: torchtitan's
layout (pipeline_llm, then apply_fsdp on the data-parallel dimension of the mesh).

Any model whose blocks are found is cut at block boundaries (models/stages.py): each stage is the
model itself with the other stages' modules substituted, so it runs the model's own forward under
the model's own names; the first stage holds what runs before the blocks (embeddings), the last
what runs after them (final norm, head) and returns the model's loss. A model the cut's checks
refuse (models/stage_plan.py) is refused in one line before any worker starts.
torch.distributed.pipelining runs the schedule: `gpipe` (ScheduleGPipe) and `1f1b` (Schedule1F1B)
one stage per rank, `interleaved-1f1b` (ScheduleInterleaved1F1B) and `zero-bubble`
(ScheduleInterleavedZeroBubble) two virtual stages per rank, rank r holding stages r and r +
pp_size. Each stage's blocks and the stage itself are FSDP2 units over the mesh's "shard"
dimension, not resharded after forward (torchtitan's default under a pipeline: every micro-batch
would gather them again).

How the pipeline composes with the loop's accumulation: each micro-step of the loop hands its
micro-batch to one run of the schedule, which cuts it into `microbatches` pipeline micro-batches and
runs their forwards and backwards; gradients accumulate over the loop's micro-steps as under fsdp.
The loss of each pipeline micro-batch is scaled by 1/(grad_accum x microbatches), so the step's
gradient is the global batch's mean (strategies/pipeline_parts.py). The loop's forward call runs
the whole schedule and backward() has nothing left to do; the loss it returns is the mean over the
micro-batch, computed on the last stage and broadcast to the pipeline's other ranks.

A weight tied between the first and the last stage (the GPT's head and token embedding) is held
twice: the last stage holds a copy (the memory it reports is what it holds), and the two copies'
gradients are summed between the first and the last stage before each step, as Megatron-LM does.
The gradient norm for clipping is summed over the stages, the copy left out.

Checkpoints are DCP directories: each rank writes its stages' shards of the parameters and optimizer
state under the model's own names; the format is its own where a tie crosses stages (the copy
carries optimizer state that fsdp's layout has not), and any strategy reads its weights back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.base import ModelUnsupported, OptimizerFactory, Preset, RunContext, StrategyError
from strategies.fsdp import FSDPStrategy
from strategies.mesh_layout import PIPELINE, MeshLayout, pipeline_layout
from strategies.pipeline_parts import SCHEDULES
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.stage_plan import CutPlan


DATA_DIM = "shard"


class FSDPPipelineStrategy(FSDPStrategy):
    description = "pipeline parallel over pp_size stages, FSDP2 inside each stage"
    presets = (
        Preset(
            "fsdp-pp",
            "pipeline parallel (GPipe, 1F1B, interleaved, zero bubble), FSDP2 inside each stage",
            {"reshard_after_forward": False, "cpu_offload": False},
            PlanModel("torch", 3, "low_precision", reshard_after_forward=False),
        ),
    )
    listing_order = 25
    backend_modules = (*FSDPStrategy.backend_modules, "torch.distributed.pipelining")
    checkpoint_format = "dcp-pipeline"

    def __init__(
        self,
        ctx: RunContext,
        *,
        pp_size: int | None = None,
        microbatches: int | None = None,
        schedule: str = "1f1b",
        reshard_after_forward: bool = False,
        cpu_offload: bool = False,
    ):
        super().__init__(ctx, reshard_after_forward=reshard_after_forward, cpu_offload=cpu_offload)
        if schedule not in SCHEDULES:
            raise StrategyError(f"strategy_options.schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
        if ctx.precision == "fp16":
            raise StrategyError(
                "fsdp-pp runs fp32 or bf16: fp16 loss scaling would have to agree across the stages; use precision=bf16"
            )
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"pp_size": pp_size})
        self.pp_size = self.mesh.shape[self.mesh.dims.index(PIPELINE)]
        self.schedule_name = schedule
        self.virtual_stages = SCHEDULES[schedule][1]
        self.microbatches = self.pp_size if microbatches is None else microbatches
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise StrategyError(f"strategy_options.microbatches={microbatches} must be a whole number >= 1")
        if ctx.micro_batch % self.microbatches:
            raise StrategyError(
                f"strategy_options.microbatches={self.microbatches} does not divide the micro-batch of "
                f"{ctx.micro_batch} sequences each pipeline step runs: set micro_batch= to a multiple of it"
            )
        if schedule == "1f1b" and self.microbatches < self.pp_size:
            raise StrategyError(
                f"schedule 1f1b needs at least one micro-batch per stage: set strategy_options.microbatches >= "
                f"pp_size={self.pp_size}, or schedule=gpipe"
            )
        if self.virtual_stages > 1 and self.microbatches % self.pp_size:
            raise StrategyError(
                f"schedule {schedule} runs micro-batches in rounds of pp_size={self.pp_size}: set "
                f"strategy_options.microbatches to a multiple of {self.pp_size}"
            )
        self._stages: list[Any] = []
        self._pipeline: Any = None
        self._planned: tuple[nn.Module, CutPlan | None] | None = None

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        """pp x shard: FSDP inside each stage over the node's ranks."""
        return pipeline_layout(world_size, local_world_size, options.get("pp_size"), DATA_DIM, "FSDP", "fsdp-grad-op")

    @property
    def stage_count(self) -> int:
        return self.pp_size * self.virtual_stages

    def check_model(self, model: nn.Module) -> None:
        self._cut_plan(model)

    def _cut_plan(self, model: nn.Module) -> CutPlan | None:
        """The cut of `model` into this pipeline's stages (traced once per model); None for a model
        on the meta device whose forward only its real weights can run: checked at setup."""
        from models.stage_plan import StagesError, cut_plan

        if self._planned is None or self._planned[0] is not model:
            seq_len = getattr(self.ctx.config, "seq_len", None)
            try:
                plan = cut_plan(model, self.find_blocks(model).modules, self.stage_count, seq_len)
            except StagesError as exc:
                raise ModelUnsupported(f"fsdp-pp ({self.schedule_name}): {exc}") from None
            self._planned = (model, plan)
        return self._planned[1]

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from models.stages import RankStages, cut, stage_blocks
        from strategies.pipeline_parts import build_schedule, pipeline_stage, tie_group

        plan = self._cut_plan(model)
        assert plan is not None, "a model on its real weights always has a plan"
        mesh = init_device_mesh(self.ctx.device.type, self.mesh.shape, mesh_dim_names=self.mesh.dims)
        pp_rank = self.mesh.coordinates(self.ctx.rank)[0]
        self._pp_group = mesh[PIPELINE].get_group()
        self._last_rank = dist.get_global_rank(self._pp_group, self.pp_size - 1)
        self._tie_group = tie_group(self.ctx.world_size, self.pp_size, self.ctx.rank) if plan.ties else None
        policies = self._policies()
        mine = [pp_rank + k * self.pp_size for k in range(self.virtual_stages)]
        roots = {index: cut(model, plan, index) for index in mine}  # every cut before any sharding
        for index, root in roots.items():
            root.to(self.ctx.device)
            for block in stage_blocks(plan, index, root):
                self._wrap(block, mesh[DATA_DIM], self.reshard_after_forward, policies)
            self._wrap(root, mesh[DATA_DIM], self.reshard_after_forward, policies)
            self._stages.append(pipeline_stage(root, index, self.stage_count, self.ctx.device, self._pp_group))
        self._pipeline = build_schedule(self._stages, self.schedule_name, self.microbatches, self.ctx.grad_accum)
        self.model = RankStages(model, plan, roots, self.run_pipeline)
        self.layout = (
            f"pipeline of {self.stage_count} stages over {self.pp_size} ranks ({self.schedule_name}, "
            f"{self.microbatches} micro-batches a step; this rank: stages {', '.join(map(str, mine))}, blocks "
            f"{'; '.join(plan.span_text(i) for i in mine)}), each stage fsdp"
        )
        self.optimizer = optimizer_factory(self.model)
        self.scaler = None
        return self.model, self.optimizer

    def run_pipeline(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One run of the schedule over the loop's micro-batch, forward and backward; the mean loss
        over it on every rank of the pipeline."""
        import torch
        import torch.distributed as dist

        from strategies.pipeline_parts import run_schedule

        loss = run_schedule(self._pipeline, self._stages, inputs, targets, self.ctx.grad_accum)
        loss = torch.zeros((), device=self.ctx.device) if loss is None else loss
        dist.broadcast(loss, src=self._last_rank, group=self._pp_group)
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """Nothing: the schedule ran each pipeline micro-batch's backward in the forward call."""

    def no_sync(self) -> Any:
        import contextlib

        return contextlib.nullcontext()  # the schedule reduce-scatters at the end of each run

    def clip_gradients(self) -> None:
        from strategies.pipeline_parts import clip_across_stages, sum_tied_gradients

        sum_tied_gradients(self.model, self._tie_group)
        if self.ctx.grad_clip > 0:
            clip_across_stages(self.model, self.ctx.grad_clip, self._pp_group, self.ctx.device)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from strategies.pipeline_parts import gather_full_state

        assert self.model is not None, "setup() first"
        leads = self.mesh.coordinates(self.ctx.rank)[1] == 0
        return gather_full_state(self.model, leads, self.ctx.rank, self.ctx.world_size)

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        assert self.model is not None, "setup() first"
        mine = {name: state[name] for name in self.model.state_dict()}
        set_model_state_dict(self.model, mine, options=StateDictOptions(full_state_dict=True, strict=True))

    def teardown(self) -> None:
        self._pipeline = None
        self._stages = []
        self._planned = None
        super().teardown()
