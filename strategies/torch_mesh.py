"""The torch layouts, one composable mesh: pp x replicate x shard x cp x tp (strategies/parallel_dims.py),
and expert parallel borrowed from the data-parallel ranks, the data-parallel engine a choice (FSDP2
full shard, without resharding after forward, or offloaded; torch's `replicate`, DDP rebuilt on
FSDP2's machinery; ZeRO-1 by ZeroRedundancyOptimizer), applied in torchtitan's order: the pipeline
cut, then on each stage tensor parallel, context parallel, expert parallel (each experts module a
unit of the engine over the ranks holding the same experts) and the engine over the data
dimensions (strategies/parallelize.py, strategies/mesh_pipeline.py).

Each name users type is a preset: the engine and the dimensions it lays out, which default as
`dims_for` says; any other size the preset takes a run may set (`ddp-tp` + pp_size is Megatron-LM's
DDP x TP x PP, `fsdp-tp` + pp_size + cp_size torchtitan's 4D). What a preset fixes cannot be
overridden.

Checkpoints are DCP directories holding every tensor whole under the bare model's names
(strategies/dcp_layout.py), the experts too whatever ep: every layout without a pipeline loads the
others' natively, at any world size; a pipelined one holds the tied head's copy besides, in a format of its own
(`dcp-pipeline`), whose weights any strategy reads back.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ContextManager

from strategies.base import ModelUnsupported, OptimizerFactory, Preset, RunContext, StrategyError
from strategies.fsdp import FSDPStrategy, fsdp_units, tied_outside
from strategies.memory import MemoryBreakdown
from strategies.mesh_layout import MeshError, MeshLayout
from strategies.parallel_dims import (
    DEFAULT_SCHEDULE,
    EXPERT,
    SCHEDULES,
    ModelFacts,
    ParallelDims,
    check_model_fits,
    mesh_layout,
    pipeline_microbatches,
    syncs_each_micro_step,
)
from strategies.plan_model import PlanModel
from strategies.single import MODEL_FILE, SingleDeviceStrategy

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    import torch.nn as nn

    from models.stage_plan import CutPlan
    from strategies.mesh_pipeline import Pipeline
    from strategies.parallelize import Meshes, Zero1

FSDP = {"engine": "fsdp", "reshard_after_forward": True, "cpu_offload": False}
# replicate and zero1 gather nothing: no resharding, no prefetching, no offload.
REPLICATE = {"reshard_after_forward": False, "cpu_offload": False, "prefetch_blocks": 0}
PIPELINE = ("pp_size", "schedule", "microbatches")
CONTEXT = ("cp_size", "cp_attention")
TENSOR = ("tp_size", "sequence_parallel")
ENGINE = ("prefetch_blocks", "sync_each_micro_step")
EP = ("ep_size",)
TORCH_Z3 = PlanModel("torch", 3, "low_precision")
TORCH_DDP = PlanModel("torch", 0, "low_precision", reshard_after_forward=False, tensor_parallel=True)


def _preset(
    name: str, description: str, fixed: dict[str, Any], takes: tuple[str, ...], plan: PlanModel | None
) -> Preset:
    return Preset(name, description, fixed, plan, takes=takes)


class MeshStrategy(FSDPStrategy):
    description = (
        "the torch mesh: pipeline, data parallel (FSDP2, replicate or ZeRO-1), context, tensor and expert parallel"
    )
    presets = (
        _preset(
            "fsdp",
            "FSDP2 full shard (ZeRO-3 analogue)",
            {**FSDP, "mesh_dims": "shard"},
            (*PIPELINE, *CONTEXT, *EP, *ENGINE),
            TORCH_Z3,
        ),
        _preset(
            "fsdp-grad-op",
            "FSDP2 without resharding after forward (ZeRO-2 analogue)",
            {**FSDP, "reshard_after_forward": False, "mesh_dims": "shard"},
            (*PIPELINE, *CONTEXT, *EP, *ENGINE),
            PlanModel("torch", 3, "low_precision", reshard_after_forward=False),
        ),
        _preset(
            "fsdp-offload",
            "FSDP2 full shard, parameters and optimizer on CPU",
            {**FSDP, "cpu_offload": True, "mesh_dims": "shard"},
            (*PIPELINE, *CONTEXT, *EP, *ENGINE),
            PlanModel("torch", 3, "low_precision", offload_optimizer=True, offload_params=True),
        ),
        _preset(
            "hsdp",
            "FSDP2 hybrid shard (replicate x shard): sharded inside a node, replicated across nodes",
            {**FSDP, "mesh_dims": "replicate x shard"},
            ("shard_size", *TENSOR, *PIPELINE, *CONTEXT, *EP, *ENGINE),
            PlanModel("torch", 3, "low_precision", hybrid_shard=True),
        ),
        _preset(
            "fsdp-tp",
            "tensor parallel inside a node (attention and MLP column/row-wise), FSDP2 across nodes",
            {**FSDP, "mesh_dims": "shard x tp"},
            (*TENSOR, *PIPELINE, *CONTEXT, *EP, *ENGINE),
            PlanModel("torch", 3, "low_precision", tensor_parallel=True),
        ),
        _preset(
            "ddp-tp",
            "tensor and sequence parallel inside a node, data parallel across nodes (Megatron-LM's layout)",
            {**REPLICATE, "engine": "replicate", "mesh_dims": "replicate x tp"},
            (*TENSOR, *PIPELINE, *CONTEXT, *EP, "sync_each_micro_step"),
            TORCH_DDP,
        ),
        _preset(
            "zero1-tp",
            "ddp-tp with the optimizer state sharded over the data-parallel ranks (ZeRO-1, torch's "
            "ZeroRedundancyOptimizer)",
            {**REPLICATE, "engine": "zero1", "mesh_dims": "replicate x tp"},
            (*TENSOR, *PIPELINE, *CONTEXT, "sync_each_micro_step"),
            PlanModel("torch", 1, "low_precision", reshard_after_forward=False, tensor_parallel=True),
        ),
        _preset(
            "fsdp-pp",
            "pipeline parallel (GPipe, 1F1B, interleaved, zero bubble), FSDP2 inside each stage",
            {**FSDP, "reshard_after_forward": False, "mesh_dims": "pp x shard"},
            (*PIPELINE, *TENSOR, *CONTEXT, *EP),
            PlanModel("torch", 3, "low_precision", reshard_after_forward=False),
        ),
        _preset(
            "fsdp-cp",
            "context parallel: each sequence split over cp_size ranks (all-to-all or ring attention), FSDP2 over all",
            {**FSDP, "mesh_dims": "shard x cp"},
            (*CONTEXT, *TENSOR, *PIPELINE, *EP, *ENGINE),
            TORCH_Z3,
        ),
        _preset(
            "fsdp-ep",
            "expert parallel: each MoE layer's experts split over ep_size data-parallel ranks (all-to-all dispatch), "
            "FSDP2 over the rest",
            {**FSDP, "mesh_dims": "shard x ep"},
            (*EP, *TENSOR, *PIPELINE, *ENGINE),
            PlanModel("torch", 3, "low_precision", tensor_parallel=True, expert_parallel=True),
        ),
        _preset(
            "ddp-ep",
            "expert parallel: each MoE layer's experts split over ep_size data-parallel ranks (all-to-all dispatch), "
            "the rest replicated (torch's replicate, DDP on FSDP2's machinery)",
            {**REPLICATE, "engine": "replicate", "mesh_dims": "replicate x ep"},
            (*EP, *TENSOR, *PIPELINE, "sync_each_micro_step"),
            replace(TORCH_DDP, expert_parallel=True),
        ),
    )
    listing_order = 20
    backend_modules = (
        *FSDPStrategy.backend_modules,
        "torch.distributed.tensor.parallel",
        "torch.distributed.pipelining",
    )

    def __init__(
        self,
        ctx: RunContext,
        *,
        engine: str = "fsdp",
        mesh_dims: str = "shard",
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        tp_size: int | None = None,
        pp_size: int | None = None,
        cp_size: int | None = None,
        ep_size: int | None = None,
        cp_attention: str = "all-to-all",
        shard_size: int | None = None,
        sequence_parallel: bool = True,
        schedule: str | None = None,
        microbatches: int | None = None,
        prefetch_blocks: int = 0,
        sync_each_micro_step: bool | None = None,
    ):
        options = {
            "tp_size": tp_size,
            "pp_size": pp_size,
            "cp_size": cp_size,
            "ep_size": ep_size,
            "cp_attention": cp_attention,
            "shard_size": shard_size,
            "schedule": schedule,
            "microbatches": microbatches,
            "sync_each_micro_step": sync_each_micro_step,
        }
        self.engine = engine
        layout = ctx.mesh or self.mesh_layout(
            ctx.world_size,
            ctx.world_size,
            {**options, "engine": engine, "mesh_dims": mesh_dims, "reshard_after_forward": reshard_after_forward},
        )
        self.dims = ParallelDims.from_layout(layout, engine)
        pipelined = self.dims.pp > 1
        sync = syncs_each_micro_step(engine, sync_each_micro_step, pipelined)
        super().__init__(
            ctx,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
            prefetch_blocks=prefetch_blocks,
            sync_each_micro_step=sync,
        )
        self.mesh = layout
        if not isinstance(sequence_parallel, bool):
            raise StrategyError(f"strategy_options.sequence_parallel={sequence_parallel} must be true or false")
        # Asked for; the model's plan may have no sequence split (Hugging Face plans have none).
        self.sequence_parallel = sequence_parallel
        if self.dims.tp > 1 and ctx.precision == "fp8":
            raise StrategyError(self._fp8_under_tp())
        self.cp_attention = self._attention(cp_attention)
        self.schedule_name = schedule or DEFAULT_SCHEDULE
        self.microbatches = self._pipeline_options(microbatches)
        # A weight tied across stages has a copy with optimizer state of its own: not fsdp's layout.
        self.checkpoint_format = "dcp-pipeline" if pipelined else "dcp"
        self._pipeline: Pipeline | None = None
        self._planned: tuple[nn.Module, CutPlan | None] | None = None
        self._zero1: Zero1 | None = None
        self._expert_units = 0
        # A name that lays out ep (fsdp-ep, ddp-ep) means a mixture-of-experts model, even at ep 1.
        self.lays_out_ep = EXPERT in layout.dims

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        engine = options.get("engine", "fsdp")
        plain = {"replicate": "ddp", "zero1": "ddp with ZeroRedundancyOptimizer"}.get(engine, "fsdp")
        if engine == "fsdp" and options.get("cpu_offload"):
            plain = "fsdp-offload"
        elif engine == "fsdp" and options.get("reshard_after_forward") is False:
            plain = "fsdp-grad-op"
        dims = options.get("mesh_dims", "shard")
        return mesh_layout(engine, dims, options, world_size, local_world_size, model, plain)

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        if options.get("cp_attention") == "ring" and device_type != "cuda":
            return (
                "cp_attention=ring runs torch's ring attention, whose SDPA has no sharding strategy on the CPU: "
                "use cp_attention=all-to-all here, ring on GPUs"
            )
        return None

    def _attention(self, attention: str) -> str:
        from models.context_parallel import CP_ATTENTIONS

        if attention not in CP_ATTENTIONS:
            raise StrategyError(f"strategy_options.cp_attention={attention!r}: use {' or '.join(CP_ATTENTIONS)}")
        return attention

    @classmethod
    def fp8_refusal(cls, options: dict[str, Any]) -> str | None:
        if "tp" in options.get("mesh_dims", ""):
            return cls._fp8_under_tp()
        return super().fp8_refusal(options)

    @staticmethod
    def _fp8_under_tp() -> str:
        return (
            "does not train in fp8 under tensor parallel: float8 under tensor parallel takes torchao's own parallel "
            "styles, which parabench does not apply yet; compare it with precision=bf16"
        )

    def _pipeline_options(self, microbatches: int | None) -> int:
        """The pipeline micro-batches per run of the schedule, checked against the run's micro-batch."""
        pp = self.dims.pp
        if pp == 1:
            return 1  # a schedule or micro-batches without a pipeline: refused with the layout
        if self.ctx.precision == "fp16":
            raise StrategyError(
                "a pipeline runs fp32 or bf16: fp16 loss scaling would have to agree across the stages; use "
                "precision=bf16"
            )
        try:
            return pipeline_microbatches(pp, self.schedule_name, microbatches, self.ctx.micro_batch)
        except MeshError as exc:
            raise StrategyError(str(exc)) from None

    # ---- the model: checked in preflight on the meta device, then laid out ----------------------

    def check_model(self, model: nn.Module) -> None:
        seq_len = getattr(self.ctx.config, "seq_len", None)
        virtual = SCHEDULES[self.schedule_name][1]
        try:
            facts = ModelFacts.of(model, self.find_blocks(model).count)
            check_model_fits(self.dims, facts, virtual, self.cp_attention)
        except MeshError as exc:
            raise StrategyError(str(exc)) from None
        if self.dims.ep > 1 or self.lays_out_ep:
            self._check_experts(model)
        if self.dims.pp > 1:
            self._cut_plan(model)
        if self.dims.cp > 1:
            from models.context_parallel import ContextParallelError, UnsplittableModel, check_context_parallel

            try:
                check_context_parallel(model, self.dims.cp, seq_len, attention=self.cp_attention, tp_size=self.dims.tp)
            except UnsplittableModel as exc:  # a compare skips the name for this model and runs the rest
                raise ModelUnsupported(f"{self.name or 'context parallel'}: {exc}") from None
            except ContextParallelError as exc:
                raise StrategyError(f"{self.name or 'context parallel'}: {exc}") from None
        if self.dims.tp > 1:
            self._check_tensor_parallel(model, seq_len)

    def _check_experts(self, model: nn.Module) -> None:
        from models.expert_parallel import ExpertParallelError, check_divides_experts
        from models.routing import experts_modules

        found = experts_modules(model)
        if not found:
            raise ModelUnsupported(
                f"{self.name or 'expert parallel'}: expert parallel splits a mixture-of-experts model's experts, and "
                f"{type(model).__name__} has none: use a model such as moe-nano or hf:MixtralConfig, or a layout "
                "without ep (no strategy_options.ep_size; fsdp or ddp-tp for fsdp-ep or ddp-ep)"
            )
        try:
            for _, experts in found:
                check_divides_experts(experts.num_experts, self.dims.ep)
        except ExpertParallelError as exc:
            raise StrategyError(str(exc)) from None

    def _cut_plan(self, model: nn.Module) -> CutPlan | None:
        """The cut of `model` into this pipeline's stages (traced once per model); None for a model
        on the meta device whose forward only its real weights can run: checked at setup."""
        from models.stage_plan import StagesError, cut_plan

        if getattr(model, "adds_balance_loss", False):
            raise ModelUnsupported(
                f"{self.name or 'pipeline'}: {type(model).__name__} adds its routers' load-balancing loss, computed in "
                "every stage, to the loss the last stage returns, and a pipeline carries only the activation between "
                "stages: pipeline it without that loss (model_kwargs.aux_loss_coef=0; for an hf: model "
                "output_router_logits=false)"
            )
        if self._planned is None or self._planned[0] is not model:
            seq_len = getattr(self.ctx.config, "seq_len", None)
            stages = self.dims.pp * SCHEDULES[self.schedule_name][1]
            try:
                plan = cut_plan(model, self.find_blocks(model).modules, stages, seq_len)
            except StagesError as exc:
                raise ModelUnsupported(f"{self.name or 'pipeline'} ({self.schedule_name}): {exc}") from None
            self._planned = (model, plan)
        return self._planned[1]

    def _check_tensor_parallel(self, model: nn.Module, seq_len: int | None) -> None:
        from models.tensor_parallel import plan_of, uses_sequence_parallel

        plan = plan_of(model, self.dims.tp, self.sequence_parallel)
        local = None if seq_len is None else seq_len // self.dims.cp
        if uses_sequence_parallel(plan) and local is not None and local % self.dims.tp:
            over = f" over cp {self.dims.cp} and" if self.dims.cp > 1 else ""
            raise StrategyError(
                f"seq_len={seq_len} does not split{over} over tp_size={self.dims.tp} for sequence parallel: use a "
                f"seq_len that {self.dims.tp * self.dims.cp} divides, or strategy_options.sequence_parallel=false"
            )

    def _policies(self) -> dict:
        policies = super()._policies()
        if self.dims.tp > 1:
            from strategies.parallelize import fsdp_shard_dim

            policies["shard_placement_fn"] = fsdp_shard_dim
        return policies

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        from strategies.parallelize import Zero1, build_meshes

        self.check_model(model)
        meshes = build_meshes(self.dims, self.engine, self.ctx.device.type)
        plan = self._tensor_parallel_plan(model)
        if self.dims.pp > 1:
            from strategies.mesh_pipeline import Pipeline

            cuts = self._cut_plan(model)
            assert cuts is not None, "a model on its real weights always has a plan"
            self._pipeline = Pipeline(
                self.dims, meshes, self.ctx.rank, cuts, self.schedule_name, self.microbatches, self.cp_attention
            )
            roots = self._pipeline.cut(model)
            split: set[int] = set()  # the modules tensor parallel split, which this rank's stages may share
            tied: dict[str, str] = {}  # each tied weight's split on this rank's stages (check_tied_layouts)
            for index, root in roots.items():
                self._parallelize(model, root, plan, meshes, self._pipeline.blocks_of(index, root), split, tied)
            if plan is not None and cuts.ties:
                from strategies.pipeline_parts import check_tied_layouts

                check_tied_layouts(tied, cuts.ties, self._pipeline.tie_group)
            self.model = self._pipeline.start(model, roots, self.ctx.device, self.ctx.grad_accum)
            self.layout = self._describe(None, plan)
        else:
            self.model = model
            self.layout = self._describe(self._parallelize(model, model, plan, meshes), plan)
        built = optimizer_factory(self.model)
        if self.engine == "zero1":
            self._zero1 = Zero1(self.model, built, meshes.data.get_group())
            built = self._zero1.optimizer
        self.optimizer = built
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def _tensor_parallel_plan(self, model: nn.Module) -> dict[str, str] | None:
        if self.dims.tp == 1:
            return None
        from models.tensor_parallel import plan_of

        return plan_of(model, self.dims.tp, self.sequence_parallel)

    def _parallelize(
        self,
        model: nn.Module,
        part: nn.Module,
        plan: dict[str, str] | None,
        meshes: Meshes,
        stage_blocks: list[nn.Module] | None = None,
        split: set[int] | None = None,
        tied: dict[str, str] | None = None,
    ) -> str | None:
        """Tensor parallel, context parallel, then the engine on `part`: `model`, or a pipeline stage
        of it running `stage_blocks`. The model's units in words (None for a stage). `split`: the
        modules tensor parallel split on this rank's earlier stages (apply_tp); `tied` gains the
        split of each tied weight the stage holds, before the engine wraps it (tied_layouts)."""
        from strategies.parallelize import apply_engine, apply_tp

        if not self.cpu_offload:
            part.to(self.ctx.device)
        if plan is not None and meshes.tp is not None:
            apply_tp(part, meshes.tp, plan, split)
            if tied is not None and self._pipeline is not None:
                from strategies.pipeline_parts import tied_layouts

                tied.update(tied_layouts(part, self._pipeline.plan.ties))
        if meshes.cp is not None:
            from models.context_parallel import split_attention, split_sequences

            if self._pipeline is None:
                split_sequences(part, meshes.cp, self.cp_attention)
            else:  # the pipeline hands each stage its share
                split_attention(model, part, meshes.cp, self.cp_attention, self._pipeline.positions)
        if meshes.ep is not None:
            from models.expert_parallel import distribute_experts
            from strategies.parallelize import apply_engine_to_experts

            if distribute_experts(part, meshes.ep):
                args = (self.engine, self.reshard_after_forward, self._policies(), meshes.data.size())
                self._expert_units += apply_engine_to_experts(part, meshes, *args)
        if stage_blocks is not None:
            apply_engine(stage_blocks, part, meshes.data, self.engine, self.reshard_after_forward, self._policies())
            if self.engine == "fsdp":
                self._set_explicit_prefetch(stage_blocks)
            return None
        found = self.find_blocks(part)
        tied = tied_outside(part, found)
        blocks = [block for block in found.modules if id(block) not in tied]
        apply_engine(blocks, part, meshes.data, self.engine, self.reshard_after_forward, self._policies())
        if self.engine == "fsdp":
            self._set_explicit_prefetch(blocks)
        units = fsdp_units(part, found)
        if tied:
            units += f" ({', '.join(tied.values())}: tied to a parameter outside, kept in the root's unit)"
        return units

    def _describe(self, units: str | None, plan: dict[str, str] | None) -> str:
        """What the layout did, for the run's header: each dimension in the order applied."""
        parts = []
        if self._pipeline is not None:
            parts.append(self._pipeline.describe())
        if plan is not None:
            from models.tensor_parallel import describe, uses_sequence_parallel

            if uses_sequence_parallel(plan):
                sequence = "sequence parallel"
            elif self.sequence_parallel:
                sequence = "no sequence parallel (the model's plan splits no sequence)"
            else:
                sequence = "no sequence parallel (sequence_parallel=false)"
            parts.append(f"tensor parallel over {self.dims.tp} ({describe(plan)}; {sequence})")
        if self.dims.cp > 1:
            parts.append(f"context parallel over {self.dims.cp} ({self.cp_attention} attention)")
        if self.dims.ep > 1:
            ranks = self.dims.data_parallel // self.dims.ep
            parts.append(
                f"expert parallel over {self.dims.ep} (all-to-all dispatch; {self._expert_units} experts modules, each "
                f"a unit of its own over the {ranks} rank{'s' if ranks != 1 else ''} holding the same experts)"
            )
        engine = {"replicate": "replicate", "zero1": "replicate with ZeroRedundancyOptimizer"}.get(self.engine)
        if engine is None:
            engine = "hsdp" if self.dims.dp_replicate > 1 else "fsdp"
            if self.dims.cp > 1:
                engine += " over the data- and context-parallel ranks"
        if self._pipeline is not None:
            engine = f"each stage {engine}"
        text = ", then ".join([*parts, engine])
        return f"{text}: {units}" if units is not None else text

    # ---- the step ---------------------------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        if self._pipeline is None:
            super().backward(loss)
        # else nothing: the schedule ran each pipeline micro-batch's backward in the forward call

    def no_sync(self) -> ContextManager:
        if self._pipeline is not None:
            return contextlib.nullcontext()  # the schedule reduces at the end of each run
        return super().no_sync()

    def clip_gradients(self) -> None:
        if self._pipeline is not None:
            from strategies.pipeline_parts import sum_tied_gradients

            sum_tied_gradients(self.model, self._pipeline.tie_group)
        super().clip_gradients()

    def _gradient_norm_groups(self, with_gradients: list[Any]) -> tuple[list[Any], Any]:
        """Under a pipeline: the gradients of this rank's stages, a tied weight's copy left out (the
        norm counts each weight once), summed over the pipeline's ranks."""
        if self._pipeline is None:
            return super()._gradient_norm_groups(with_gradients)
        from strategies.pipeline_parts import tied_copies

        copies = tied_copies(self.model)
        return [p for p in with_gradients if id(p) not in copies], self._pipeline.group

    def step(self) -> None:
        if self._zero1 is None:
            super().step()
            return
        self.clip_gradients()
        self._zero1.take_gradients()  # after clipping, which scales the DTensor gradients in place
        self.optimizer.step()
        self.model.zero_grad(set_to_none=True)

    def memory_breakdown(self) -> MemoryBreakdown:
        if self._zero1 is None:
            return super().memory_breakdown()
        return MemoryBreakdown.of(self.model, self.optimizer.optim)  # the state this rank owns

    # ---- checkpoints -------------------------------------------------------------------------------

    def _optimizer_state(self) -> dict[str, Any]:
        return super()._optimizer_state() if self._zero1 is None else self._zero1.state()

    def _load_optimizer_state(self, state: dict[str, Any]) -> None:
        if self._zero1 is None:
            super()._load_optimizer_state(state)
        else:
            self._zero1.load(state)

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        """The weights of a DCP checkpoint, or of a `torch-ep<N>` one, which holds the whole model in
        single's file beside an optimizer file per expert group (ddp-ep writes DCP's now)."""
        if (path / MODEL_FILE).is_file():
            return SingleDeviceStrategy.read_full_state_dict(path, model)
        return super().read_full_state_dict(path, model)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self._pipeline is None:
            return super().full_state_dict()
        from strategies.pipeline_parts import gather_full_state

        assert self.model is not None, "setup() first"
        leads = all(i == 0 for i in self.mesh.coordinates(self.ctx.rank)[1:])  # first of its stage's ranks
        return gather_full_state(self.model, leads, self.ctx.rank, self.ctx.world_size)

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self._pipeline is None:
            super().load_full_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        assert self.model is not None, "setup() first"
        mine = {name: state[name] for name in self.model.state_dict()}
        set_model_state_dict(self.model, mine, options=StateDictOptions(full_state_dict=True, strict=True))

    def teardown(self) -> None:
        if self._pipeline is not None:
            self._pipeline.teardown()
        self._pipeline = None
        self._planned = None
        self._zero1 = None
        self._expert_units = 0
        super().teardown()
