"""`runner.py train`: one strategy, one model, one data set, under any launcher.

The loop is the same for every backend; what differs lives behind the Strategy
verbs. Writes <out_dir>/metrics.jsonl (a line per step), <out_dir>/summary.json and,
with checkpoint_every, <out_dir>/checkpoints/step_<N>. A resumed run continues at the
checkpoint's step: the data position and the learning rate are functions of the step.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from configs.schema import PRECISIONS, RunConfig, to_dict
from harness.common.testing_hooks import fault_after_step
from harness.train import device_info, distributed
from harness.train.checkpoint import CHECKPOINTS, SUMMARY, CheckpointError, CheckpointManager, Manifest, param_shapes
from harness.train.determinism import make_deterministic
from harness.train.library_output import loggers_to_stderr
from harness.train.metrics import StepMetrics
from harness.train.noise import RoundingNoise
from harness.train.optimizer import Schedule, adamw_factory, resolve_schedule
from harness.train.profiling import StepProfiler
from harness.train.router_metrics import router_metrics
from harness.train.trackers import Trackers, tracking
from models.activation_checkpointing import enable_checkpointing
from models.blocks import Blocks, find_blocks
from models.data import GlobalBatchSchedule, load_data, split_inputs_targets
from models.zoo import build_model, flops_per_token, num_params
from strategies.backend_imports import import_backends
from strategies.base import RunContext, Strategy, compute_precision, no_checkpoints_error, torch_dtype
from strategies.float8 import convert_to_float8, float8_scales_hook, gathers_in_fp8
from strategies.memory import MemoryBreakdown
from strategies.parallel_dims import CONTEXT, PIPELINE, ModelFacts
from strategies.registry import default_registry

DTYPE_NAMES = {torch_dtype(name): name for name in PRECISIONS if compute_precision(name) == name}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("deepspeed", "accelerate"):
        module = sys.modules.get(name)
        if module is None:
            try:
                from importlib.metadata import version

                versions[name] = version(name)
            except Exception:
                versions[name] = None
        else:
            versions[name] = getattr(module, "__version__", None)
    return versions


def prepare_model(cfg: RunConfig) -> tuple[torch.nn.Module, Blocks, str | None]:
    """The model, its blocks and what activation checkpointing recomputes (None: off).
    Preflight calls it under the meta device, so a bad model_blocks= or a model that cannot
    be checkpointed is one line before any worker starts."""
    # Built on the CPU from the seed, identically on every rank, before any wrapping:
    # every strategy starts from the same weights.
    seed_everything(cfg.seed)
    model = build_model(cfg.model, cfg.model_kwargs)
    blocks = find_blocks(model, cfg.model_blocks)
    checkpointed = (
        enable_checkpointing(model, blocks, cfg.selective_checkpointing) if cfg.activation_checkpointing else None
    )
    return model, blocks, checkpointed


@dataclass
class Training:
    """A run's pieces on this rank, built from its config: the model (wrapped or sharded once set
    up), its strategy, the data and its global-batch schedule. `run()` trains one; the batch
    search (harness/compare/probe.py) builds one per micro-batch it tries, several in one process."""

    cfg: RunConfig
    env: distributed.DistEnv
    model: torch.nn.Module
    blocks: Blocks
    checkpointed: str | None  # what activation checkpointing recomputes; None: off
    shapes: dict[str, list[int]]  # the bare model's parameter shapes, what a checkpoint must fit
    data: Any
    schedule: GlobalBatchSchedule
    micro_batch: int
    grad_accum: int
    strategy: Strategy
    compiled: str | None  # None: eager
    fp8: str | None = None  # precision=fp8: what trains in float8, in words
    fp8_gathered: bool = False  # FSDP2 all-gathers the float8 layers' weights in float8
    fp8_scales: Callable[..., None] | None = None  # computes the float8 all-gathers' scales (set up)
    n_params: int = 0
    fpt: float = 0.0
    lr_schedule: Schedule | None = None  # the run's (run_schedule), which built() resolves

    def setup(self) -> None:
        """Wrap or shard the model and build its optimizer; peak memory is counted from here."""
        cfg, env = self.cfg, self.env
        self.n_params, self.fpt = num_params(self.model), flops_per_token(self.model, cfg.seq_len)
        assert self.lr_schedule is not None, "built() resolves the schedule"
        for device in self.strategy.devices():
            device_info.reset_peak_memory(device)
        noise = RoundingNoise(cfg.precision, cfg.noise_seed, env.rank) if cfg.noise_seed is not None else None
        self.model, optimizer = self.strategy.setup(
            self.model, adamw_factory(self.lr_schedule.lr, (cfg.beta1, cfg.beta2), cfg.weight_decay, noise)
        )
        if self.fp8_gathered:  # the next step's float8 all-gathers use the scales computed after this one
            self.fp8_scales = float8_scales_hook(self.model)
            optimizer.register_step_post_hook(self.fp8_scales)
        loggers_to_stderr()  # of the libraries the backend imported: stdout is the run's own

    def step_metrics(self, trackers: Trackers | None = None) -> StepMetrics:
        # One loss (and one count of routed tokens) per data-parallel rank: the ranks of a
        # tensor-parallel group hold the same one.
        mesh, rank = self.strategy.mesh, self.env.rank
        leads = mesh.leads_its_group(rank)
        return StepMetrics(
            env=self.env,
            data_parallel_size=self.strategy.data_parallel[1],
            counts_loss=leads,
            out_dir=Path(self.cfg.out_dir),
            tokens_per_step=self.cfg.batch_size * self.cfg.seq_len,
            flops_per_token=self.fpt,
            precision=self.cfg.precision,
            timing_warmup=self.cfg.timing_warmup,
            printer=_rank0_print(self.env),
            devices=self.strategy.devices(),
            trackers=trackers,
            # Each stage routes its own layers, each rank of a context-parallel group its share of the sequence.
            router=router_metrics(self.model, self.env.device, mesh.leads_its_group(rank, apart=(PIPELINE, CONTEXT))),
        )

    def train(
        self, metrics: StepMetrics, start_step: int = 0, after_step: Callable[[int], None] | None = None
    ) -> tuple[MemoryBreakdown | None, torch.dtype | None]:
        """Steps start_step..cfg.steps-1 (after_step(steps done) after each); returns the memory
        held between backward and step of the second step, and the dtype the loss came back in."""
        cfg, env, strategy, model = self.cfg, self.env, self.strategy, self.model
        assert self.lr_schedule is not None, "setup() first"
        metrics.start(first_step=start_step, append=start_step > 0)
        profiler = StepProfiler(cfg.profile_steps, Path(cfg.out_dir) / "profile", env.rank, env.device)
        dp_rank, dp_size = strategy.data_parallel
        memory = None
        loss_dtype: torch.dtype | None = None  # as the backend returns it: its resolution bounds the comparison
        for step in range(start_step, cfg.steps):
            with profiler.step(step):
                metrics.begin_step(step, cfg.log_every, cfg.steps - 1)
                lr = self.lr_schedule.at(step, cfg.steps)
                strategy.set_lr(lr)
                step_loss = None  # this rank's mean loss over its micro-steps, fp32, on the device
                for micro in range(self.grad_accum):
                    # The data-parallel rank picks the micro-batch: a tensor-parallel group reads one.
                    rows = self.data.batch(self.schedule.micro_indices(step, micro, dp_rank, dp_size, self.micro_batch))
                    # One contiguous pinned copy, split on the device (views would go through pageable memory).
                    inputs, targets = split_inputs_targets(_pin(rows, env).to(env.device, non_blocking=True))
                    sync_ctx = strategy.no_sync() if micro < self.grad_accum - 1 else contextlib.nullcontext()
                    with sync_ctx:
                        with strategy.autocast():
                            loss = model(inputs, targets)
                        strategy.backward(loss)
                    micro_loss = loss.detach().float()
                    step_loss = micro_loss if step_loss is None else step_loss + micro_loss
                    loss_dtype = loss.dtype
                if self.grad_accum > 1:
                    step_loss = step_loss / self.grad_accum
                if step == min(start_step + 1, cfg.steps - 1):
                    # Measured between backward and step of the second step: gradients are
                    # held, and the optimizer state exists since the first step.
                    memory = strategy.memory_breakdown()
                strategy.step()
                metrics.record(step, lr, step_loss)
                if metrics.should_flush(step, cfg.log_every, cfg.steps - 1):
                    metrics.flush(memory or strategy.memory_breakdown())
                if after_step is not None:
                    after_step(step + 1)
        return memory, loss_dtype


def run_schedule(cfg: RunConfig, model: torch.nn.Module) -> Schedule:
    """The learning-rate schedule `cfg` trains `model` under, derived values filled in."""
    return resolve_schedule(
        cfg.lr,
        cfg.min_lr,
        cfg.warmup_steps,
        params=num_params(model),
        steps=cfg.steps,
        shape=cfg.lr_schedule,
        warmup_type=cfg.warmup_type,
    )


def create_strategy(
    cfg: RunConfig, env: distributed.DistEnv, schedule: Schedule, model: torch.nn.Module, blocks: Blocks
) -> Strategy:
    """`cfg.strategy` for this rank of `env`, constructed (not yet set up): its options and
    configuration checked, its mesh laid out for `model` (whose blocks and heads some sizes default
    to). The global batch is split over the data-parallel ranks alone (replicate x shard under hsdp;
    under fsdp-tp the ranks of a tensor-parallel group share their micro-batch). `schedule`: the
    run's (run_schedule), for a backend running its own scheduler to check."""
    registry = default_registry()
    facts = ModelFacts.of(model, blocks.count)
    mesh = registry.mesh_layout(cfg.strategy, env.world_size, env.ranks_per_node, facts, **cfg.strategy_options)
    micro_batch, grad_accum = cfg.world_batch(mesh.data_parallel(env.rank)[1], data_parallel=mesh.declared)
    ctx = RunContext(
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=env.device,
        precision=cfg.precision,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        grad_clip=cfg.grad_clip,
        config=cfg,
        mesh=mesh,
        schedule=schedule,
    )
    return registry.create(cfg.strategy, ctx, **cfg.strategy_options)


@contextlib.contextmanager
def built(cfg: RunConfig, env: distributed.DistEnv) -> Iterator[Training]:
    """The model, data and strategy of `cfg` on this rank, not yet set up; the strategy is torn
    down on the way out, however the block ends."""
    strategy: Strategy | None = None
    try:
        model, blocks, checkpointed = prepare_model(cfg)
        shapes = param_shapes(model)
        data = load_data(
            cfg.data,
            vocab_size=getattr(model, "vocab_size", None),
            seq_len=cfg.seq_len,
            num_samples=cfg.data_samples,
            seed=cfg.seed,
        )
        schedule = GlobalBatchSchedule(len(data), cfg.batch_size, cfg.seed)
        lr_schedule = run_schedule(cfg, model)
        strategy = create_strategy(cfg, env, lr_schedule, model, blocks)
        import_backends(strategy.backend_modules)  # before any setup imports one its own way
        strategy.check_model(model)
        micro_batch, grad_accum = strategy.ctx.micro_batch, strategy.ctx.grad_accum
        fp8, fp8_gathered = None, False
        if cfg.precision == "fp8":  # before any wrapping: FSDP2 shards the float8 layers' weights
            fp8_gathered = gathers_in_fp8(strategy, cfg.fp8_scaling, cfg.fp8_all_gather)
            converted = convert_to_float8(model, blocks, cfg.fp8_scaling, fp8_gathered)
            fp8 = f"{converted} linear layers in float8 ({cfg.fp8_scaling})" + (
                ", all-gathered in float8" if fp8_gathered else ""
            )
        # The whole model or per block: the backend knows which it can take.
        compiled = strategy.compile(model) if cfg.compile else None
        yield Training(
            cfg,
            env,
            model,
            blocks,
            checkpointed,
            shapes,
            data,
            schedule,
            micro_batch,
            grad_accum,
            strategy,
            compiled,
            fp8=fp8,
            fp8_gathered=fp8_gathered,
            lr_schedule=lr_schedule,
        )
    finally:
        if strategy is not None:
            strategy.teardown()


def run(cfg: RunConfig) -> dict[str, Any]:
    """Train under the current launcher's process group; returns the summary (on every rank)."""
    determinism = make_deterministic() if cfg.deterministic else None  # before the first CUDA kernel
    env = distributed.init_distributed(cfg.device, cfg.pg_timeout_s)
    # DeepSpeed, wherever a backend imports it, then need not detect the device (and warn it found none).
    os.environ.setdefault("DS_ACCELERATOR", env.device.type)
    finished = False
    try:
        with built(cfg, env) as training, tracking(cfg, env) as trackers:
            strategy = training.strategy
            checkpoints = CheckpointManager(
                Path(cfg.out_dir) / CHECKPOINTS, env.rank, env.world_size, cfg.keep_last, printer=_rank0_print(env)
            )
            resume_from = _find_checkpoint(cfg, strategy, checkpoints)
            training.setup()
            # The discovery warning matters where the backend works block by block.
            blocks_warning = training.blocks.warning if strategy.layout is not None else None
            start_step = 0
            if resume_from is not None:
                path, manifest = resume_from
                message = checkpoints.restore(
                    path,
                    manifest,
                    strategy,
                    training.shapes,
                    bare_model=lambda: build_model(cfg.model, cfg.model_kwargs),
                    config=to_dict(cfg),
                )
                _rank0_print(env)(message)
                start_step = manifest.step
                if training.fp8_scales:  # as the saved run computed them after its last step
                    training.fp8_scales()
                if env.is_main:
                    _keep_metrics_up_to(Path(cfg.out_dir) / "metrics.jsonl", start_step)
            metrics = training.step_metrics(trackers)
            _rank0_print(env)(_header(training, metrics))
            if blocks_warning:
                _rank0_print(env)(f"warning: {blocks_warning}")

            fault = fault_after_step(env.rank)

            def after_step(done: int) -> None:
                if cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                    checkpoints.save(done, strategy, to_dict(cfg), training.shapes)
                if fault is not None:
                    fault(done)

            started = time.time()
            # Nothing runs between steps unless checkpoints or a test's fault ask for it.
            memory, loss_dtype = training.train(
                metrics, start_step, after_step if cfg.checkpoint_every or fault else None
            )
            summary = _summary(training, metrics, memory, started)
            summary["resumed_from_step"] = start_step
            summary["compiled"] = training.compiled  # None: eager
            summary["fp8"] = training.fp8  # None: no float8 layers
            # The learning rates the run used, derived ones filled in.
            summary["lr_schedule"] = training.lr_schedule.as_dict()
            summary["loss_dtype"] = DTYPE_NAMES.get(loss_dtype, str(loss_dtype))
            summary["deterministic"] = determinism or False
            summary["blocks"] = {
                **training.blocks.as_dict(),
                "warning": blocks_warning,
                "units": strategy.layout,
                "checkpointed": training.checkpointed,
            }
            if env.is_main:
                (Path(cfg.out_dir) / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
            finished = True
            return summary
    finally:
        # A finished worker of a launched multi-process run ends without teardown (train_cli's
        # os._exit, or multiprocessing's for a forked one), so its process group is left to that end:
        # destroyed here, the group's last reference could go with the wrapped model while a gloo
        # thread still releases a finished collective's tensors, and the two deadlock on the GIL.
        if not (finished and env.world_size > 1 and distributed.launched_by_launcher()):
            distributed.shutdown_distributed()


def _header(training: Training, metrics: StepMetrics) -> str:
    cfg, env, strategy = training.cfg, training.env, training.strategy
    mesh = strategy.mesh
    router = metrics.router
    dp_size = strategy.data_parallel[1]
    ranks = f"{dp_size} data-parallel ranks" if mesh.declared else f"{env.world_size} ranks"
    return (
        f"parabench train | strategy {cfg.strategy} | model {cfg.model} ({training.n_params / 1e6:.2f}M params) | "
        f"{env.world_size} x {device_info.device_name(env.device)} | {cfg.precision} | global batch "
        f"{cfg.batch_size} = {ranks} x {training.micro_batch} x {training.grad_accum} accum | "
        f"{training.lr_schedule.describe()} | loss floor {_fmt(getattr(training.data, 'loss_floor', None))}"
        + (f" | {mesh.describe()}" if mesh.declared else "")
        + (f" | compiled: {training.compiled}" if training.compiled else "")
        + (f" | fp8: {training.fp8}" if training.fp8 else "")
        + (f" | {strategy.layout}" if strategy.layout else "")
        + (f" | checkpointing: {training.checkpointed}" if training.checkpointed else "")
        + (f" | routing: {router.describe()}" if router else "")
    )


def _find_checkpoint(
    cfg: RunConfig, strategy: Strategy, checkpoints: CheckpointManager
) -> tuple[Path, Manifest] | None:
    """Where this run starts: refused up front if the backend cannot checkpoint at all."""
    if (cfg.checkpoint_every or cfg.resume) and not strategy.checkpoint_format:
        raise no_checkpoints_error(cfg.strategy)
    found = checkpoints.find(cfg.resume, will_write=cfg.checkpoint_every > 0)
    if found is not None and found[1].step >= cfg.steps:
        raise CheckpointError(
            f"checkpoint {found[0]} is at step {found[1].step}, and this run ends at steps={cfg.steps}: "
            "raise steps= to train further"
        )
    return found


def _keep_metrics_up_to(path: Path, step: int) -> None:
    """Drop the lines of steps after `step` that a killed run logged: they are about to be redone."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _logged_step(line) <= step]
    if len(kept) != len(lines):
        partial = path.with_name(path.name + ".tmp")
        partial.write_text("".join(kept))
        os.replace(partial, path)


def _logged_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")  # a line torn by the kill: dropped with the steps after the checkpoint


def _summary(training: Training, metrics: StepMetrics, memory: MemoryBreakdown, started: float) -> dict[str, Any]:
    cfg, env = training.cfg, training.env
    last = metrics.last_row
    topology = distributed.topology(env)
    return {
        "strategy": cfg.strategy,
        "description": default_registry().get(cfg.strategy).description,
        "config": to_dict(cfg),
        "world_size": env.world_size,
        **topology,
        "device": device_info.device_name(env.device),
        "device_memory_bytes": device_info.device_memory(env.device),
        "device_type": env.device.type,
        "devices_per_process": len(training.strategy.devices()),
        "micro_batch": training.micro_batch,
        "grad_accum": training.grad_accum,
        "num_params": training.n_params,
        "flops_per_token": training.fpt,
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        "loss_floor": getattr(training.data, "loss_floor", None),
        "steps": metrics.steps_logged,
        "final_loss": last.get("loss"),
        **metrics.throughput(),
        "peak_mem_allocated_bytes": last.get("peak_mem_allocated_bytes"),
        "peak_mem_reserved_bytes": last.get("peak_mem_reserved_bytes"),
        "mem_params_bytes": last.get("mem_params_bytes"),
        "mem_grads_bytes": last.get("mem_grads_bytes"),
        "mem_optimizer_bytes": last.get("mem_optimizer_bytes"),
        "memory_by_device_rank0": memory.as_dict(),
        "mesh": training.strategy.mesh.as_dict(),
        "router": metrics.router_summary(),
        "data_parallel_size": training.strategy.data_parallel[1],
        "wall_time_s": time.time() - started,
        "versions": library_versions(),
    }


def _pin(rows: torch.Tensor, env: distributed.DistEnv) -> torch.Tensor:
    # Pinned host memory lets the copy to the GPU run asynchronously (non_blocking).
    return rows.pin_memory() if env.device.type == "cuda" else rows


def _rank0_print(env: distributed.DistEnv):
    def printer(message: str) -> None:
        if env.is_main:
            print(message, flush=True)

    return printer


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4f}"
