"""`fsdp-pp`: pipeline parallel over pp_size groups of ranks, FSDP2 inside each stage: torchtitan's
layout (pipeline_llm, then apply_fsdp on the data-parallel dimension of the mesh).

parabench's GPT is cut at block boundaries (models/pipeline_stages.py): the first stage holds the
embeddings, the last the final norm, the head and the loss. torch.distributed.pipelining runs the
schedule: `gpipe` (ScheduleGPipe) and `1f1b` (Schedule1F1B) one stage per rank, `interleaved-1f1b`
(ScheduleInterleaved1F1B) and `zero-bubble` (ScheduleInterleavedZeroBubble) two virtual stages per
rank, rank r holding stages r and r + pp_size. Each stage's blocks and the stage itself are FSDP2
units over the mesh's "shard" dimension, not resharded after forward (torchtitan's default under a
pipeline: every micro-batch would gather them again).

How the pipeline composes with the loop's accumulation: each micro-step of the loop hands its
micro-batch to one run of the schedule, which cuts it into `microbatches` pipeline micro-batches and
runs their forwards and backwards; gradients accumulate over the loop's micro-steps as under fsdp.
The loss on each pipeline micro-batch is scaled by 1/(grad_accum x microbatches), so the step's
gradient is the global batch's mean (the schedule's own division by its micro-batch count would
divide the gradients of the loop's earlier micro-steps again). The loop's forward call
runs the whole schedule and backward() has nothing left to do; the loss it returns is the mean over
the micro-batch, computed on the last stage and broadcast to the pipeline's other ranks.

The GPT's head is tied to its token embedding: the last stage holds a copy (the memory it reports is
what it holds), and the two copies' gradients are summed between the first and the last stage
before each step, as Megatron-LM does. The gradient norm for clipping is summed over the stages,
the copy left out.

Checkpoints are DCP directories: each rank writes its stages' shards of the parameters and optimizer
state under the GPT's own names; the format is its own (the head's copy carries optimizer state that
fsdp's layout has not), and any strategy reads its weights back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.base import OptimizerFactory, Preset, RunContext, StrategyError
from strategies.fsdp import FSDPStrategy
from strategies.mesh_layout import PIPELINE, MeshLayout, pipeline_layout
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


DATA_DIM = "shard"
# schedule option -> (torch's class, virtual stages per rank)
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2),
    "zero-bubble": ("ScheduleInterleavedZeroBubble", 2),
}


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

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        """pp x shard: FSDP inside each stage over the node's ranks."""
        return pipeline_layout(world_size, local_world_size, options.get("pp_size"), DATA_DIM, "FSDP", "fsdp-grad-op")

    @property
    def stage_count(self) -> int:
        return self.pp_size * self.virtual_stages

    def check_model(self, model: nn.Module) -> None:
        from models.pipeline_stages import PipelineStagesError, check_stages

        try:
            check_stages(model, self.stage_count)
        except PipelineStagesError as exc:
            raise StrategyError(f"fsdp-pp ({self.schedule_name}): {exc}") from None

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage

        from models.pipeline_stages import GPTStage, PipelinedStages, blocks_per_stage

        self.check_model(model)
        mesh = init_device_mesh(self.ctx.device.type, self.mesh.shape, mesh_dim_names=self.mesh.dims)
        pp_rank = self.mesh.coordinates(self.ctx.rank)[0]
        self._pp_group = mesh[PIPELINE].get_group()
        self._last_rank = dist.get_global_rank(self._pp_group, self.pp_size - 1)
        self._tie_group = _tie_group(self.mesh, self.ctx.rank)
        policies = self._policies()
        cuts = blocks_per_stage(model.config.n_layer, self.stage_count)
        mine = [pp_rank + k * self.pp_size for k in range(self.virtual_stages)]
        modules = []
        for index in mine:
            stage = GPTStage(model, cuts[index], first=index == 0, last=index == self.stage_count - 1)
            stage.to(self.ctx.device)
            for block in stage.blocks.values():
                self._wrap(block, mesh[DATA_DIM], self.reshard_after_forward, policies)
            self._wrap(stage, mesh[DATA_DIM], self.reshard_after_forward, policies)
            modules.append(stage)
            self._stages.append(PipelineStage(stage, index, self.stage_count, self.ctx.device, group=self._pp_group))
        self._pipeline = self._make_schedule()
        self.model = PipelinedStages(modules, self.run_pipeline)
        self.layout = (
            f"pipeline of {self.stage_count} stages over {self.pp_size} ranks ({self.schedule_name}, "
            f"{self.microbatches} micro-batches a step; this rank: stages {', '.join(map(str, mine))}, blocks "
            f"{'; '.join(_span(cuts[i]) for i in mine)}), each stage fsdp"
        )
        self.optimizer = optimizer_factory(self.model)
        self.scaler = None
        return self.model, self.optimizer

    def _make_schedule(self) -> Any:
        import torch.distributed.pipelining as pipelining

        from models.pipeline_stages import next_token_loss

        share = self.ctx.grad_accum * self.microbatches

        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            # Each pipeline micro-batch's share of the step's mean. The schedule's own scaling is off:
            # it divides every gradient the stage holds, those of the loop's earlier micro-steps too.
            return next_token_loss(logits, targets) / share

        cls = getattr(pipelining, SCHEDULES[self.schedule_name][0])
        stages = self._stages if self.virtual_stages > 1 else self._stages[0]
        return cls(stages, n_microbatches=self.microbatches, loss_fn=loss_fn, scale_grads=False)

    def run_pipeline(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One run of the schedule over the loop's micro-batch, forward and backward; the mean loss
        over it on every rank of the pipeline."""
        import torch
        import torch.distributed as dist

        first = any(s.is_first for s in self._stages)
        last = any(s.is_last for s in self._stages)
        losses: list[torch.Tensor] = []
        args = (inputs,) if first else ()
        self._pipeline.step(*args, target=targets if last else None, losses=losses if last else None)
        loss = torch.zeros((), device=self.ctx.device)
        if last:
            loss = torch.stack([x.detach().float() for x in losses]).sum() * self.ctx.grad_accum
        dist.broadcast(loss, src=self._last_rank, group=self._pp_group)
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """Nothing: the schedule ran each pipeline micro-batch's backward in the forward call."""

    def no_sync(self) -> Any:
        import contextlib

        return contextlib.nullcontext()  # the schedule reduce-scatters at the end of each run

    def clip_gradients(self) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        self._sum_tied_gradients()
        if self.ctx.grad_clip <= 0:
            return
        params = [p for p in self.model.parameters() if p.grad is not None]
        counted = [p.grad for p in params if p is not self.model.tied_pair()[1]]
        norm = torch.nn.utils.get_total_norm(counted, foreach=True) if counted else torch.zeros(())
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        squared = (norm.to(self.ctx.device).float() ** 2).reshape(())
        dist.all_reduce(squared, group=self._pp_group)
        torch.nn.utils.clip_grads_with_norm_(params, self.ctx.grad_clip, squared.sqrt(), foreach=True)

    def _sum_tied_gradients(self) -> None:
        """The token embedding's gradient on the first stage and its head copy's on the last, each
        replaced by their sum: the tied weight's gradient, on both."""
        import torch.distributed as dist

        embedding, copy = self.model.tied_pair()
        if copy is None and (embedding is None or self._tie_group is None):
            return  # a middle stage, or one stage holding the tie whole
        if embedding is not None and copy is not None:  # both stages on this rank (pp 1, virtual stages)
            total = embedding.grad.to_local() + copy.grad.to_local()
            embedding.grad.to_local().copy_(total)
            copy.grad.to_local().copy_(total)
            return
        dist.all_reduce((embedding if copy is None else copy).grad.to_local(), group=self._tie_group)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        assert self.model is not None, "setup() first"
        mine = {}
        for name, t in self.model.state_dict().items():
            whole = t.full_tensor() if isinstance(t, DTensor) else t  # a collective over the stage's FSDP group
            mine[name] = whole.detach().cpu()
        leads = self.mesh.coordinates(self.ctx.rank)[1] == 0
        parts: list[Any] = [None] * self.ctx.world_size if self.ctx.rank == 0 else []
        dist.gather_object(mine if leads else {}, parts if self.ctx.rank == 0 else None, dst=0)
        if self.ctx.rank != 0:
            return {}
        return {name: t for part in parts for name, t in part.items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        assert self.model is not None, "setup() first"
        mine = {name: state[name] for name in self.model.state_dict()}
        set_model_state_dict(self.model, mine, options=StateDictOptions(full_state_dict=True, strict=True))

    def teardown(self) -> None:
        self._pipeline = None
        self._stages = []
        super().teardown()


def _span(blocks: range) -> str:
    if not blocks:
        return "none"
    return str(blocks.start) if len(blocks) == 1 else f"{blocks.start}-{blocks.stop - 1}"


def _tie_group(layout: MeshLayout, rank: int) -> Any:
    """The process group of the first and the last pipeline rank sharing this rank's FSDP shard
    (every rank creates every group, as new_group requires); None on the ranks in between, and
    where one rank holds both."""
    import torch.distributed as dist

    pp, dp = layout.shape
    if pp == 1:
        return None
    mine = None
    for shard in range(dp):
        ranks = [shard, (pp - 1) * dp + shard]
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine
