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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from configs.schema import RunConfig, to_dict
from harness import distributed, hardware
from harness.checkpoint import CheckpointError, CheckpointManager, Manifest, param_shapes
from harness.metrics import StepMetrics
from harness.optim import adamw_factory, lr_at
from harness.planner.for_run import prediction_for_run
from harness.profiling import StepProfiler
from models.data import GlobalBatchSchedule, load_data, split_inputs_targets
from models.zoo import build_model, flops_per_token, num_params
from strategies.base import RunContext, Strategy, StrategyError
from strategies.registry import default_registry


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


def _prepare_model(cfg: RunConfig) -> torch.nn.Module:
    # Built on the CPU from the seed, identically on every rank, before any wrapping:
    # every strategy starts from the same weights.
    seed_everything(cfg.seed)
    model = build_model(cfg.model, cfg.model_kwargs)
    if cfg.activation_checkpointing:
        if not hasattr(model, "activation_checkpointing"):
            raise ValueError(f"model {cfg.model!r} has no activation_checkpointing switch")
        model.activation_checkpointing = True
    return model


def run(cfg: RunConfig) -> dict[str, Any]:
    """Train under the current launcher's process group; returns the summary (on every rank)."""
    env = distributed.init(cfg.device, cfg.pg_timeout_s)
    strategy: Strategy | None = None
    try:
        micro_batch, grad_accum = cfg.world_batch(env.world_size)
        model = _prepare_model(cfg)
        shapes = param_shapes(model)
        data = load_data(
            cfg.data, vocab_size=getattr(model, "vocab_size", None), seq_len=cfg.seq_len,
            num_samples=cfg.data_samples, seed=cfg.seed,
        )
        schedule = GlobalBatchSchedule(len(data), cfg.batch_size, cfg.seed)
        ctx = RunContext(
            rank=env.rank, world_size=env.world_size, local_rank=env.local_rank, device=env.device,
            precision=cfg.precision, micro_batch=micro_batch, grad_accum=grad_accum,
            grad_clip=cfg.grad_clip, config=cfg,
        )
        strategy = default_registry().create(cfg.strategy, ctx, **cfg.strategy_options)
        # The whole model or per block: the backend knows which it can take.
        compiled = strategy.compile(model) if cfg.compile else None
        checkpoints = CheckpointManager(
            Path(cfg.out_dir) / "checkpoints", env.rank, env.world_size, cfg.keep_last, printer=_rank0_print(env)
        )
        resume_from = _find_checkpoint(cfg, strategy, checkpoints)
        n_params, fpt = num_params(model), flops_per_token(model, cfg.seq_len)
        hardware.reset_peak_memory(env.device)
        model, _ = strategy.setup(model, adamw_factory(cfg.lr, (cfg.beta1, cfg.beta2), cfg.weight_decay))
        start_step = 0
        if resume_from is not None:
            path, manifest = resume_from
            message = checkpoints.restore(
                path, manifest, strategy, shapes, bare_model=lambda: build_model(cfg.model, cfg.model_kwargs),
                config=to_dict(cfg),
            )
            _rank0_print(env)(message)
            start_step = manifest.step
            if env.is_main:
                _keep_metrics_up_to(Path(cfg.out_dir) / "metrics.jsonl", start_step)
        metrics = StepMetrics(
            env=env, out_dir=Path(cfg.out_dir), tokens_per_step=cfg.batch_size * cfg.seq_len,
            flops_per_token=fpt, precision=cfg.precision, timing_warmup=cfg.timing_warmup,
            printer=_rank0_print(env),
        )
        _rank0_print(env)(
            f"parabench train | strategy {cfg.strategy} | model {cfg.model} ({n_params / 1e6:.2f}M params) | "
            f"{env.world_size} x {hardware.device_name(env.device)} | {cfg.precision} | global batch "
            f"{cfg.batch_size} = {env.world_size} ranks x {micro_batch} x {grad_accum} accum | "
            f"loss floor {_fmt(getattr(data, 'loss_floor', None))}" + (f" | compiled: {compiled}" if compiled else "")
        )
        profiler = StepProfiler(cfg.profile_steps, Path(cfg.out_dir) / "profile", env.rank, env.device)
        started = time.time()
        metrics.start(first_step=start_step, append=start_step > 0)
        memory = None
        for step in range(start_step, cfg.steps):
            with profiler.step(step):
                lr = lr_at(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps)
                strategy.set_lr(lr)
                step_loss = None  # this rank's mean loss over its micro-steps, fp32, on the device
                for micro in range(grad_accum):
                    rows = data.batch(schedule.micro_indices(step, micro, env.rank, env.world_size, micro_batch))
                    # One contiguous pinned copy, split on the device (views would go through pageable memory).
                    inputs, targets = split_inputs_targets(_pin(rows, env).to(env.device, non_blocking=True))
                    sync_ctx = strategy.no_sync() if micro < grad_accum - 1 else contextlib.nullcontext()
                    with sync_ctx:
                        with strategy.autocast():
                            loss = model(inputs, targets)
                        strategy.backward(loss)
                    micro_loss = loss.detach().float()
                    step_loss = micro_loss if step_loss is None else step_loss + micro_loss
                if grad_accum > 1:
                    step_loss = step_loss / grad_accum
                if step == min(start_step + 1, cfg.steps - 1):
                    # Measured between backward and step of the second step: gradients are
                    # held, and the optimizer state exists since the first step.
                    memory = strategy.memory_breakdown()
                strategy.step()
                metrics.record(step, lr, step_loss)
                if metrics.should_flush(step, cfg.log_every, cfg.steps - 1):
                    metrics.flush(memory or strategy.memory_breakdown())
                done = step + 1
                if cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                    checkpoints.save(done, strategy, to_dict(cfg), shapes)
                distributed.inject_fault(done, env.rank)
        summary = _summary(cfg, env, strategy, metrics, memory, n_params, fpt, data, micro_batch, grad_accum, started)
        summary["resumed_from_step"] = start_step
        summary["compiled"] = compiled  # None: eager
        if env.is_main:
            (Path(cfg.out_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    finally:
        if strategy is not None:
            strategy.teardown()
        distributed.shutdown()


def _find_checkpoint(cfg: RunConfig, strategy: Strategy,
                     checkpoints: CheckpointManager) -> tuple[Path, Manifest] | None:
    """Where this run starts: refused up front if the backend cannot checkpoint at all."""
    if (cfg.checkpoint_every or cfg.resume) and not strategy.checkpoint_format:
        raise StrategyError(
            f"strategy {cfg.strategy!r} cannot save or load checkpoints yet: set checkpoint_every=0 and no resume="
        )
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


def _summary(cfg, env, strategy, metrics, memory, n_params, fpt, data, micro_batch, grad_accum, started) -> dict:
    last = metrics.last_row
    topology = distributed.topology(env)
    return {
        "strategy": cfg.strategy,
        "description": default_registry().get(cfg.strategy).description,
        "config": to_dict(cfg),
        "world_size": env.world_size,
        **topology,
        "device": hardware.device_name(env.device),
        "device_type": env.device.type,
        "micro_batch": micro_batch,
        "grad_accum": grad_accum,
        "num_params": n_params,
        "flops_per_token": fpt,
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        "loss_floor": getattr(data, "loss_floor", None),
        "steps": metrics.steps_logged,
        "final_loss": last.get("loss"),
        **metrics.throughput(),
        "peak_mem_allocated_bytes": last.get("peak_mem_allocated_bytes"),
        "peak_mem_reserved_bytes": last.get("peak_mem_reserved_bytes"),
        "mem_params_bytes": last.get("mem_params_bytes"),
        "mem_grads_bytes": last.get("mem_grads_bytes"),
        "mem_optimizer_bytes": last.get("mem_optimizer_bytes"),
        "memory_by_device_rank0": memory.as_dict(),
        # What `runner.py plan` predicts for this run, beside the measured figures above.
        "prediction": prediction_for_run(cfg, env.world_size, topology["nodes"], env.device),
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