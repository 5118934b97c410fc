"""`zero1-pp`: DeepSpeed's pipeline engine over pp_size stages, ZeRO-1 over the data-parallel ranks.

The model becomes DeepSpeed's PipelineModule (models/pipeline_layers.py): parabench's GPT as
DeepSpeed's own GPT examples build it (layer specs, the embedding and the head one TiedLayerSpec,
the blocks balanced over the stages); any other model whose blocks are found a layer per stage of
models/stages.py's cut, its own forward computing the loss on the last stage. A model the cut's
checks refuse (models/stage_plan.py) is refused in one line before any worker starts.
deepspeed.initialize then makes the PipelineEngine, with ZeRO stage 1 over the ranks of each stage
(DeepSpeed's pipeline takes no higher stage), the runner's AdamW, and the config built as for zero1
(strategies/deepspeed_config.py).

How the engine's schedule fits the loop's accumulation: PipelineEngine.train_batch() runs
DeepSpeed's TrainSchedule (1F1B) over gradient_accumulation_steps pipeline micro-batches and closes
with three instructions: sum the tied weight's gradients between the first and the last stage,
reduce the gradients over the data-parallel ranks, step the optimizer. Here each micro-step of the
loop runs that same schedule (through the engine's own instruction executor, as train_batch does)
over `microbatches` pipeline micro-batches of its micro-batch, the closing instructions held back:
backward() of the loop's last micro-step runs the two reductions (where zero1's engine.backward
reduces, at the accumulation boundary), step() the optimizer step. DeepSpeed's
gradient_accumulation_steps is the loop's accumulation times `microbatches`, so its backward scales
each pipeline micro-batch's loss to its share of the step's mean. The loop's forward call runs the
schedule, forward and backward; the loss it returns is the mean over the micro-batch, from the last
stage, broadcast to the pipeline's other ranks. These are the engine's own pieces of train_batch()
(DeepSpeed 0.19.8's PipelineEngine._exec_schedule and its instruction map), not public API.

Checkpoints are DeepSpeed's own pipeline checkpoints (engine.save_checkpoint): a file per layer (a
stage's under the cut), written by the first data-parallel rank of each stage, and each rank's
optimizer partition; they load back at the same pp_size and world size. Export and a resume under
another strategy read the fp32 master weights out of the optimizer partitions, under the model's
names.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from strategies.base import (
    ModelUnsupported,
    OptimizerFactory,
    Preset,
    RunContext,
    Strategy,
    StrategyError,
    compile_blocks,
    missing_package_reason,
)
from strategies.deepspeed import (
    import_deepspeed,
    load_zero_checkpoint,
    save_zero_checkpoint,
    write_config,
    zero_memory_breakdown,
)
from strategies.deepspeed_config import (
    check_user_config,
    final_config,
    model_size,
    read_user_config,
    run_config,
    sizing_config,
)
from strategies.mesh_layout import DATA, MeshError, MeshLayout, pipeline_layout
from strategies.parallel_dims import microbatch_count
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.stage_plan import CutPlan
    from strategies.config_files import ConfigFile
    from strategies.memory import MemoryBreakdown
    from strategies.parallel_dims import ModelFacts

CHECKPOINT_TAG = "zero1-pp"  # the sub-directory of state/ that engine.save_checkpoint writes
# A rank's optimizer partition in DeepSpeed's checkpoint: its data-parallel rank, then its stage.
OPTIMIZER_FILE = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
# The closing instructions of DeepSpeed's TrainSchedule: the reductions, then the optimizer step.
CLOSING = ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep")
REDUCTIONS = 2


class ZeroPipelineStrategy(Strategy):
    description = "DeepSpeed's pipeline engine over pp_size stages, ZeRO-1 over the data-parallel ranks"
    presets = (
        Preset(
            "zero1-pp",
            "DeepSpeed's pipeline engine (1F1B) over pp_size stages, ZeRO-1 over the data-parallel ranks",
            {"schedule": "1f1b"},
            PlanModel("deepspeed", 1, "low_precision", pipeline_engine=True),
        ),
    )
    listing_order = 32
    backend_modules = ("deepspeed",)
    checkpoint_format = "deepspeed-zero1-pp"  # the family; each instance narrows it to its pp_size
    # DeepSpeed loads a pipeline checkpoint's optimizer partitions at the world size that wrote them.
    checkpoint_reshards = False

    def __init__(
        self, ctx: RunContext, *, pp_size: int | None = None, microbatches: int | None = None, schedule: str = "1f1b"
    ):
        super().__init__(ctx)
        if schedule != "1f1b":
            raise StrategyError(
                f"schedule {schedule!r}: DeepSpeed's pipeline engine runs one schedule, its 1F1B TrainSchedule; "
                "fsdp-pp runs gpipe, interleaved-1f1b and zero-bubble"
            )
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"pp_size": pp_size})
        self.pp_size, self.dp_size = self.mesh.shape
        try:  # DeepSpeed's engine runs fewer micro-batches than stages too
            self.microbatches = microbatch_count(self.pp_size, microbatches, ctx.micro_batch)
        except MeshError as exc:
            raise StrategyError(str(exc)) from None
        # Another pp_size lays the layers and the optimizer partitions out otherwise: its checkpoint
        # carries the weights over, not the optimizer state.
        self.checkpoint_format = f"deepspeed-zero1-pp{self.pp_size}"
        self.run_config = self._pipeline_config(ctx)
        source = getattr(ctx.config, "deepspeed_config", None)
        self.user_config = read_user_config(source) if source else {}
        check_user_config(self.user_config, self.run_config, source or "", self._batch_fixes())
        self.config: dict[str, Any] = {}  # what deepspeed.initialize is given, at setup
        self.engine: Any = None  # deepspeed's PipelineEngine after setup
        self._names: dict[int, list[str]] = {}  # id of each of this stage's parameters -> its names in the model
        self._model_keys: set[str] = set()
        self._closing: list[Any] = []  # the closing instructions the last schedule held back
        self._micro_step = 0
        self._planned: tuple[nn.Module, CutPlan | None] | None = None
        self._as_gpt = False  # the GPT's own layer specs, not the cut's stages

    def _pipeline_config(self, ctx: RunContext) -> dict[str, Any]:
        """zero1's config, its batch split the pipeline's: `microbatches` pipeline micro-batches in each
        of the loop's micro-steps, on each data-parallel rank."""
        config = run_config(
            ctx, stage=1, offload_optimizer=False, offload_params=False, torch_optimizer_offloaded=False
        )
        micro = ctx.micro_batch // self.microbatches
        accumulation = ctx.grad_accum * self.microbatches
        config.update(
            train_micro_batch_size_per_gpu=micro,
            gradient_accumulation_steps=accumulation,
            train_batch_size=micro * accumulation * self.dp_size,
        )
        return config

    def _batch_fixes(self) -> dict[str, Callable[[Any], str]]:
        """What a user's DeepSpeed JSON must be told for its batch keys, which here count pipeline
        micro-batches (_pipeline_config): "set micro_batch=" to the JSON's value would be cut into
        `microbatches` again and refused again."""
        pieces = self.microbatches

        def micro(value: Any) -> str:
            wanted = f"micro_batch={value * pieces}" if isinstance(value, int) else f"micro_batch= to it x {pieces}"
            return (
                f"zero1-pp hands DeepSpeed one pipeline micro-batch, micro_batch / strategy_options.microbatches="
                f"{pieces}: set {wanted} on the command line instead"
            )

        def accumulation(value: Any) -> str:
            how = (
                f"set grad_accum={value // pieces} on the command line instead"
                if isinstance(value, int) and value % pieces == 0
                else f"give it as a multiple of {pieces}, or leave it out"
            )
            return f"zero1-pp's DeepSpeed accumulation is grad_accum x strategy_options.microbatches={pieces}: {how}"

        return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accumulation}

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return missing_package_reason("deepspeed", "pip install deepspeed")

    @classmethod
    def takes_deepspeed_config(cls, config_file: ConfigFile | None) -> bool:
        return True  # merged over the pipeline engine's config, by zero1-3's rules

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        """pp x data, as fsdp-pp lays its ranks out (and DeepSpeed's PipeDataParallelTopology): ZeRO-1
        over the ranks of each stage."""
        blocks = model.blocks if model is not None else None
        return pipeline_layout(world_size, local_world_size, options.get("pp_size"), DATA, "ZeRO-1", "zero1", blocks)

    def check_model(self, model: nn.Module) -> None:
        self._cut_plan(model)

    def _cut_plan(self, model: nn.Module) -> CutPlan | None:
        """The cut of `model` into pp_size stages (traced once per model); None for a model on the
        meta device whose forward only its real weights can run: checked at setup."""
        from models.stage_plan import StagesError, cut_plan

        if self._planned is None or self._planned[0] is not model:
            seq_len = getattr(self.ctx.config, "seq_len", None)
            try:
                plan = cut_plan(model, self.find_blocks(model).modules, self.pp_size, seq_len)
            except StagesError as exc:
                raise ModelUnsupported(f"zero1-pp: {exc}") from None
            self._planned = (model, plan)
        return self._planned[1]

    def compile(self, model: nn.Module) -> str:
        # Each stage runs its own share of the blocks: compiled one by one, they compile once.
        return compile_blocks(model, self.find_blocks(model))

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        deepspeed = import_deepspeed(self.ctx)
        from deepspeed.accelerator import get_accelerator
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

        from models.gpt import GPT
        from models.pipeline_layers import (
            PARTITION_METHOD,
            ScheduledPipeline,
            layer_specs,
            next_token_loss,
            pipeline_names,
            stage_layer_names,
            stage_layer_specs,
            tie_cut_weights,
        )

        plan = self._cut_plan(model)
        assert plan is not None, "a model on its real weights always has a plan"
        self._model_keys = set(model.state_dict())
        # The GPT as DeepSpeed's own GPT examples lay it out (its checkpoints keep their layers);
        # any other model a layer per stage of the cut, whose forward returns the loss.
        self._as_gpt = isinstance(model, GPT)
        topology = PipeDataParallelTopology(num_pp=self.pp_size, num_dp=self.dp_size)
        # DeepSpeed wraps the runner's process group (never makes its own); PipelineModule's notices
        # (its partition of the layers) print on stdout, which carries the run's own lines.
        with contextlib.redirect_stdout(sys.stderr):
            deepspeed.comm.init_distributed(
                dist_backend=get_accelerator().communication_backend_name(), dist_init_required=False
            )
            if self._as_gpt:
                stage = PipelineModule(
                    layers=layer_specs(model),
                    topology=topology,
                    loss_fn=next_token_loss,
                    partition_method=PARTITION_METHOD,
                )
            else:
                specs = stage_layer_specs(model, plan)
                stage = PipelineModule(layers=specs, topology=topology, partition_method="uniform")
                tie_cut_weights(stage, plan, _tie_groups(plan, topology, self.ctx.rank))
        names = pipeline_names(model) if self._as_gpt else None
        of = stage_layer_names(model)
        self._names = {id(p): names[name] if names else of(name) for name, p in stage.named_parameters()}
        self.config = final_config(sizing_config(model_size(stage), 1, self.dp_size), self.run_config, self.user_config)
        write_config(self.config, self.ctx)
        with contextlib.redirect_stdout(sys.stderr):
            engine, _, _, _ = deepspeed.initialize(
                model=stage, optimizer=optimizer_factory(stage), config=self.config, dist_init_required=False
            )
        if engine.dp_world_size != self.dp_size or engine.num_stages != self.pp_size:
            raise StrategyError(
                f"DeepSpeed laid out {engine.num_stages} stages x {engine.dp_world_size} data-parallel ranks, "
                f"the run {self.pp_size} x {self.dp_size}"
            )
        self.engine = engine
        self.model = ScheduledPipeline(stage, self.run_pipeline)
        self.optimizer = engine.optimizer
        if self._as_gpt:
            blocks = sorted({int(n.split(".")[1]) for names in self._names.values() for n in names if "blocks." in n})
            span = _span(blocks)
        else:
            span = plan.span_text(engine.stage_id)
        self.layout = (
            f"DeepSpeed's pipeline engine over {self.pp_size} ranks (1F1B over {self.microbatches} "
            f"micro-batch{'es' if self.microbatches > 1 else ''} a step; "
            f"this rank: stage {engine.stage_id}, blocks {span}), ZeRO-1 over each stage's data-parallel ranks"
        )
        return self.model, self.optimizer

    def run_pipeline(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's TrainSchedule over the loop's micro-batch, forward and backward, its closing
        instructions held back; the mean loss over the micro-batch on every rank of the pipeline."""
        import torch
        import torch.distributed as dist
        from deepspeed.runtime.pipe import schedule

        engine = self.engine
        pipeline_batches = zip(inputs.chunk(self.microbatches), targets.chunk(self.microbatches), strict=True)
        if not self._as_gpt:  # the cut's stages take the targets with the inputs, and return the loss
            pipeline_batches = (((x, y), y) for x, y in pipeline_batches)
        engine.set_dataiterator(iter(list(pipeline_batches)))
        engine.module.train()
        engine.total_loss = None
        engine._compute_loss = True
        steps = schedule.TrainSchedule(micro_batches=self.microbatches, stages=self.pp_size, stage_id=engine.stage_id)
        self._closing = []
        engine._exec_schedule(_WithoutClosing(steps, self._closing))
        held = tuple(type(c).__name__ for c in self._closing)
        if held != CLOSING:
            raise StrategyError(f"DeepSpeed's schedule closed with {held}, not {CLOSING}: run DeepSpeed 0.19")
        if engine.is_last_stage():
            loss = engine.total_loss.detach().float() / self.microbatches
        else:
            loss = torch.zeros((), device=self.ctx.device)
        last = engine.grid.stage_to_global(self.pp_size - 1)
        dist.broadcast(loss, src=last, group=engine.grid.get_pipe_parallel_group())
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """The schedule ran each pipeline micro-batch's backward in the forward call; at the loop's
        last micro-step, the schedule's reductions: the tied weight's gradients summed over its two
        stages, then the gradients reduced into each rank's ZeRO-1 partition."""
        self._micro_step += 1
        if self._micro_step == self.ctx.grad_accum:
            self._execute(self._closing[:REDUCTIONS])

    def step(self) -> None:
        """The schedule's optimizer step: clipping, the step of each rank's partition, the
        parameters gathered back."""
        if self._micro_step != self.ctx.grad_accum:
            raise StrategyError(
                f"zero1-pp stepped after {self._micro_step} micro-steps, not its accumulation's {self.ctx.grad_accum}"
            )
        self._execute(self._closing[REDUCTIONS:])
        self._micro_step = 0

    def _execute(self, instructions: list[Any]) -> None:
        """Held-back instructions of the last schedule, through the engine's own instruction map."""
        for instruction in instructions:
            self.engine._INSTRUCTION_MAP[type(instruction)](self.engine, **instruction.kwargs)

    def set_lr(self, lr: float) -> None:
        for group in self.engine.basic_optimizer.param_groups:  # the optimizer DeepSpeed steps
            group["lr"] = lr

    def memory_breakdown(self) -> MemoryBreakdown:
        assert self.engine is not None, "setup() first"
        return zero_memory_breakdown(self.engine)

    def save(self, path: Path) -> None:
        assert self.engine is not None, "setup() first"
        save_zero_checkpoint(self.engine, path, CHECKPOINT_TAG)

    def load(self, path: Path) -> None:
        assert self.engine is not None, "setup() first"
        load_zero_checkpoint(self.engine, path, CHECKPOINT_TAG, with_scheduler=False)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The fp32 master weights of every stage under the model's names, on rank 0."""
        import torch.distributed as dist
        from deepspeed.utils import safe_get_full_fp32_param

        assert self.engine is not None, "setup() first"
        mine = {}
        for p in self.engine.module.parameters():  # a collective over the stage's data-parallel ranks each
            whole = safe_get_full_fp32_param(p).detach().cpu()
            mine.update({name: whole for name in self._names[id(p)]})
        leads = self.mesh.coordinates(self.ctx.rank)[1] == 0
        parts: list[Any] = [None] * self.ctx.world_size if self.ctx.rank == 0 else []
        dist.gather_object(mine if leads else {}, parts if self.ctx.rank == 0 else None, dst=0)
        if self.ctx.rank != 0:
            return {}
        return {name: t for part in parts for name, t in part.items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Each stage's share of the consolidated weights into its parameters and into DeepSpeed's
        fp32 master partitions (which the optimizer steps from)."""
        import torch
        from deepspeed.utils import safe_set_full_fp32_param

        assert self.engine is not None, "setup() first"
        if set(state) != self._model_keys:
            missing, unexpected = sorted(self._model_keys - set(state)), sorted(set(state) - self._model_keys)
            raise StrategyError(
                f"the weights do not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]}): "
                "resume from a checkpoint of the same model"
            )
        for p in self.engine.module.parameters():
            value = state[self._names[id(p)][0]]
            p.data.copy_(value.to(p.device, p.dtype))
            safe_set_full_fp32_param(p, value.to(p.device, torch.float32))

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        """Offline: the fp32 master weights in the checkpoint `path` under the names of `model` (built
        in the checkpoint's shape), from each stage's optimizer partitions: each parameter's
        fragments, in the order of the data-parallel ranks that hold them."""
        import torch

        from models.gpt import GPT
        from models.pipeline_layers import pipeline_names, stage_layer_names

        files = sorted(
            ((int(m[2]), int(m[1])), file)  # (stage, data-parallel rank)
            for file in (path / CHECKPOINT_TAG).glob("*_optim_states.pt")
            if (m := OPTIMIZER_FILE.search(file.name))
        )
        if not files:
            raise StrategyError(f"{path} holds no zero1-pp checkpoint {CHECKPOINT_TAG!r}: give one that zero1-pp wrote")
        fragments: dict[tuple[int, str], list[torch.Tensor]] = {}
        for (stage, _), file in files:
            # DeepSpeed's own objects (its loss scaler, the fragments' addresses) are in the file.
            state = torch.load(file, map_location="cpu", weights_only=False)["optimizer_state_dict"]
            groups = zip(state["single_partition_of_fp32_groups"], state["param_slice_mappings"], strict=True)
            for flat, where in groups:
                for name, fragment in where.items():
                    fragments.setdefault((stage, name), []).append(flat.narrow(0, fragment.start, fragment.numel))
        names_of = pipeline_names(model).__getitem__ if isinstance(model, GPT) else stage_layer_names(model)
        shapes, out = model.state_dict(), {}
        for (_, name), parts in fragments.items():  # the tied weight's first stage first: both hold it
            whole = torch.cat(parts)
            for model_name in names_of(name):
                out.setdefault(model_name, whole.view(shapes[model_name].shape))
        if set(out) != set(shapes):
            raise StrategyError(
                f"{path / CHECKPOINT_TAG} lacks the weights of {sorted(set(shapes) - set(out))[:3]}: "
                "give a checkpoint of this model"
            )
        return out

    def teardown(self) -> None:
        if self.engine is not None and hasattr(self.engine, "destroy"):
            self.engine.destroy()
        if self.engine is not None:
            from deepspeed.utils import groups

            # The pipeline's grid, set as DeepSpeed's global model-parallel unit: a later engine in
            # this process would take its stages for tensor-parallel ranks.
            groups.mpu = None
        self.engine = None
        self._closing, self._micro_step = [], 0
        self._planned = None
        super().teardown()


def _span(blocks: list[int]) -> str:
    return str(blocks[0]) if len(blocks) == 1 else f"{blocks[0]}-{blocks[-1]}"


def _tie_groups(plan: CutPlan, topology: Any, rank: int) -> dict[str, Any]:
    """Each tie's process group of the first and the last stage at this rank's data-parallel place
    (every rank creates every group, as new_group requires), by the tie's first name; empty where
    this rank holds neither end."""
    import torch.distributed as dist

    pp, dp = topology.get_dim("pipe"), topology.get_dim("data")
    mine: dict[str, Any] = {}
    if pp == 1:
        return mine  # one stage holds every tie whole
    for tie in plan.ties:
        for place in range(dp):
            ranks = [topology.get_rank(pipe=0, data=place), topology.get_rank(pipe=pp - 1, data=place)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[tie.first] = group
    return mine


class _WithoutClosing:
    """A DeepSpeed pipeline schedule less its closing instructions (CLOSING), which it appends to
    `held` as the engine walks it."""

    def __init__(self, steps: Any, held: list[Any]):
        self._steps, self._held = steps, held

    def num_pipe_buffers(self) -> int:
        return self._steps.num_pipe_buffers()

    def __iter__(self) -> Any:
        for instructions in self._steps:
            self._held.extend(c for c in instructions if type(c).__name__ in CLOSING)
            yield [c for c in instructions if type(c).__name__ not in CLOSING]
