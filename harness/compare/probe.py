"""`runner.py probe key=value ...`: one job of the batch search that `runner.py compare
batch_search=true` runs (internal: compare starts it through the same supervisor as its runs,
so timeouts, Ctrl-C and the failure kinds work as for a run).

The job reads <out_dir>/search.json (harness/compare/batch_search.py), which compare wrote; the first job
adds the planner's predicted limit and starts there. Each probe builds the run's model and
strategy afresh at one micro-batch (harness/train/loop.py: the loop every run uses), trains
timing_warmup + 2 steps, so that the optimizer state exists and the peak is reached, tears it
all down and appends its result to the file before the next probe starts: a job that dies loses
nothing. Where the file allows probes in one process (a backend that recovers from an
out-of-memory error, world size 1), an out-of-memory error is caught, everything is freed, and
the next size follows in this process while there is time left in the job; otherwise the job
probes one size, and an out-of-memory error ends it as a failed job whose kind compare records.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
import weakref
from pathlib import Path

import torch
import torch.distributed as dist

from configs.schema import ConfigError, RunConfig, load_config
from harness.common.testing_hooks import fake_memory_limit, install_fake_memory_limit
from harness.common.units import human_bytes
from harness.compare import batch_search
from harness.compare.batch_search import ERROR, FITS, OOM, Probe, Search
from harness.compare.supervise import is_out_of_memory_message, shorten
from harness.train import DistEnv, built, init_distributed, shutdown_distributed

# Device memory still held after a probe's teardown, over what the job's first probe left
# (cuBLAS workspaces and NCCL communicators are made once per process and stay), beyond which
# the next probe in this process would not see what a fresh process sees.
LEAK_TOLERANCE_BYTES = 64 * 2**20


def main(args: list[str]) -> int:
    cfg = load_config(args)
    path = Path(cfg.out_dir) / batch_search.SEARCH_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path} not found: `runner.py probe` is a job of `runner.py compare batch_search=true`, "
            "which writes it; run the compare instead"
        )
    limit = fake_memory_limit()  # a test's fake device limit, read once
    env = init_distributed(cfg.device, cfg.pg_timeout_s)
    try:
        probe_job(cfg, env, path, fake_limit=limit)
    finally:
        shutdown_distributed()
    return 0


def probe_job(cfg: RunConfig, env: DistEnv, path: Path, *, fake_limit: int | None = None) -> None:
    """Probe sizes in the order of the search file until it is answered or this job must stop."""
    started = time.monotonic()
    search = batch_search.load(path) if env.is_main else None  # rank 0 decides; every rank follows
    if search is not None and search.start is None:
        search.predicted, search.prediction_note = predicted_limit(cfg, env, search.limit)
        search.start = search.predicted or search.fallback_start
        batch_search.save(path, search)
    first, longest, baseline = True, 0.0, None
    while (size := _agreed(env, _size_to_probe(search, first, longest, time.monotonic() - started))) is not None:
        record, refs = probe_once(
            cfg, env, size, new_process=first, catch=search is not None and search.in_process, fake_limit=fake_limit
        )
        leak, in_use = _free(env.device, refs, baseline, compiled=cfg.compile)
        if first:
            baseline = in_use  # what any process holds once it has trained: the next probes' yardstick
        longest = max(longest, record.wall_time_s or 0.0)
        if search is not None:
            _record(search, record, leak)
            batch_search.save(path, search)
        first = False


def _size_to_probe(search: Search | None, first: bool, longest: float, elapsed: float) -> int | None:
    """The next size, if this job is to probe it: its first probe always, more only in one process
    and while the job's time allows two of its longest probes."""
    if search is None or not (first or (search.in_process and elapsed + 2 * longest < search.job_time_s)):
        return None
    return search.next_size()


def _record(search: Search, record: Probe, leak: str | None) -> None:
    """Add the probe; stop probing in one process where the next probe would not see a fresh one."""
    if record.result == ERROR and not record.new_process:
        # What the earlier probes left behind may be the cause: that size again, in a process of its own.
        search.in_process = False
        search.note = (
            f"micro-batch {record.micro_batch} failed after other probes in one process ({record.error}): "
            "a process per probe from there"
        )
        return
    search.probes.append(record)
    if leak:
        search.in_process, search.note = False, f"{leak}: a process per probe from there"


def predicted_limit(cfg: RunConfig, env: DistEnv, limit: int) -> tuple[int | None, str | None]:
    """(the planner's largest micro-batch on this job's devices, why there is none)."""
    from harness.plan import PlanError, largest_micro_batch, question_for_run

    if env.device.type != "cuda":
        return None, "no device memory to predict against on a CPU"
    memory = torch.cuda.get_device_properties(env.device).total_memory
    try:
        # One node: how the GPUs are spread over nodes changes the speed, not the memory.
        predicted = largest_micro_batch(cfg.strategy, question_for_run(cfg, env.world_size, 1, memory), limit=limit)
    except PlanError as exc:
        return None, f"the planner could not answer: {exc}"
    if predicted is None:
        return None, f"the planner has no model of {cfg.strategy!r} or of this model's activations"
    return predicted, None


def probe_once(
    cfg: RunConfig, env: DistEnv, size: int, *, new_process: bool, catch: bool, fake_limit: int | None = None
) -> tuple[Probe, list[tuple[str, weakref.ref]]]:
    """Train briefly at micro-batch `size`; returns its record and weak references to what it built.
    With `catch`, an error is recorded rather than raised (an out-of-memory one as OOM); with
    `fake_limit` (a test's), sizes above it run out of memory."""
    refs: list[tuple[str, weakref.ref]] = []
    started = time.monotonic()
    try:
        tokens_per_s, peak = _train_briefly(for_size(cfg, size, env.world_size), env, refs, fake_limit)
        record = Probe(size, FITS, new_process, tokens_per_s=tokens_per_s, peak_allocated_bytes=peak)
    except Exception as exc:  # the exception, and its frames that hold the model, end with this block
        if not catch:
            raise
        message = shorten(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
        oom = isinstance(exc, torch.OutOfMemoryError) or is_out_of_memory_message(message)
        if not oom:
            traceback.print_exc()
        record = Probe(size, OOM if oom else ERROR, new_process, error=message)
    record.wall_time_s = time.monotonic() - started
    if env.is_main:
        outcome = (
            f"fits, {record.tokens_per_s or 0:,.0f} tok/s, peak allocated {human_bytes(record.peak_allocated_bytes)}"
            if record.result == FITS
            else f"{'out of memory' if record.result == OOM else 'failed'}: {record.error}"
        )
        print(f"probe micro_batch={size}: {outcome} ({record.wall_time_s:.1f} s)", flush=True)
    return record, refs


def for_size(cfg: RunConfig, size: int, world_size: int) -> RunConfig:
    """The run at micro-batch `size` without accumulation, long enough for a throughput figure."""
    steps = cfg.timing_warmup + 2
    batch = size * world_size
    return dataclasses.replace(
        cfg,
        micro_batch=size,
        grad_accum=None,
        batch_size=batch,
        steps=steps,
        log_every=steps,
        data_samples=max(cfg.data_samples, batch),
        out_dir=str(Path(cfg.out_dir) / f"micro_batch_{size}"),
        checkpoint_every=0,
        resume=None,
    )


def _train_briefly(
    cfg: RunConfig, env: DistEnv, refs: list[tuple[str, weakref.ref]], fake_limit: int | None
) -> tuple[float | None, int | None]:
    with built(cfg, env) as training:
        refs.append(("model", weakref.ref(training.model)))
        refs.append(("strategy", weakref.ref(training.strategy)))
        training.setup()
        if training.strategy.optimizer is not None:
            refs.append(("optimizer", weakref.ref(training.strategy.optimizer)))
        if fake_limit is not None:
            install_fake_memory_limit(training.model, cfg.micro_batch, fake_limit)
        metrics = training.step_metrics()
        training.train(metrics)
        return metrics.throughput()["tokens_per_s"], metrics.last_row.get("peak_mem_allocated_bytes")


def _free(
    device: torch.device, refs: list[tuple[str, weakref.ref]], baseline: int | None, compiled: bool
) -> tuple[str | None, int]:
    """Free what the last probe left (compiled graphs, cycles, the allocator's cache); returns (why
    the next probe cannot run in this process, or None; the device bytes in use now)."""
    if compiled:
        # Each size compiles afresh, as in a process of its own: left cached, the next size would
        # recompile with dynamic shapes (and after a few, stop compiling).
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # blocks still in use by queued kernels cannot be released
        torch.cuda.empty_cache()
    alive = [name for name, ref in refs if ref() is not None]
    held = _device_bytes_in_use(device)
    if alive:
        return f"the {', '.join(alive)} of the last probe outlived its teardown", held
    if baseline is not None and held - baseline > LEAK_TOLERANCE_BYTES:
        return f"{human_bytes(held - baseline)} of device memory stayed in use after the last probe's teardown", held
    return None, held


def _device_bytes_in_use(device: torch.device) -> int:
    """Device memory in use by anything (the allocator, NCCL, the context; other processes too: the
    search, like the compare's runs, wants the device to itself); 0 on a CPU."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def _agreed(env: DistEnv, size: int | None) -> int | None:
    """Rank 0's decision, on every rank: all ranks probe the same size or stop together."""
    if env.world_size == 1:
        return size
    decision = [size]
    dist.broadcast_object_list(decision, src=0)
    return decision[0]
