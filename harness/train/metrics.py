"""Per-step metrics without per-step host syncs, reduced over ranks at the logging interval.

Step losses stay on the device until a flush; a flush does one all-gather for the
losses (summed in rank order) and one all-reduce for the memory figures, then rank 0
appends a line per step to metrics.jsonl and hands the same rows to the run's trackers
(TensorBoard, W&B, MLflow). Step time is the interval's wall time over its steps, so it is the
real time, not the time to enqueue kernels.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from harness.train import device_info
from harness.train.distributed import DistEnv, all_reduce
from harness.train.router_metrics import RouterMetrics
from harness.train.trackers import Trackers
from strategies.base import compute_precision
from strategies.memory import MemoryBreakdown


@dataclass
class StepMetrics:
    env: DistEnv
    # The reported loss is the mean over the data-parallel ranks (the whole global batch); under a
    # tensor-parallel mesh only one rank of each group counts its loss (counts_loss), the others
    # hold the same one.
    data_parallel_size: int
    counts_loss: bool
    out_dir: Path
    tokens_per_step: int
    flops_per_token: float
    precision: str
    timing_warmup: int
    printer: Callable[[str], None] = print
    # Every device this rank computes on (DataParallel drives several): MFU counts the peak of
    # each, and peak memory is the largest among them. Empty: the rank's own device.
    devices: list[torch.device] = field(default_factory=list)
    trackers: Trackers | None = None  # rank 0's TensorBoard, W&B, MLflow writers (harness/train/trackers.py)
    router: RouterMetrics | None = None  # a mixture-of-experts model's routing (harness/train/router_metrics.py)
    _pending: list[tuple[int, float, torch.Tensor]] = field(default_factory=list)
    _interval_start: float = 0.0
    _warm: bool = False  # past the first `timing_warmup` steps
    _warm_steps: int = 0
    _warm_elapsed: float = 0.0  # the timed intervals' wall time since
    last_row: dict[str, Any] = field(default_factory=dict)
    steps_logged: int = 0

    def __post_init__(self) -> None:
        self.devices = self.devices or [self.env.device]
        peak_flops = device_info.peak_flops(self.env.device, compute_precision(self.precision))
        # What the whole job could compute: every device of every rank.
        self.job_peak_flops = peak_flops * self.env.world_size * len(self.devices) if peak_flops else None
        self.path = self.out_dir / "metrics.jsonl"
        if self.env.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._interval_start = time.perf_counter()

    def start(self, first_step: int = 0, append: bool = False) -> None:
        """Begin timing at `first_step` (non-zero on resume); a fresh run starts the file anew."""
        if self.env.is_main and not append:
            self.path.write_text("")
        if self.trackers is not None:
            self.trackers.start(first_step)
        self.first_step = first_step
        self._interval_start = time.perf_counter()

    def record(self, step: int, lr: float, loss: torch.Tensor) -> None:
        """Keep step `step`'s loss (this rank's mean over its share: a detached fp32 scalar) on the device."""
        self._pending.append((step, lr, loss))

    def flush(self, memory: MemoryBreakdown) -> dict[str, Any] | None:
        """Reduce and write the pending steps; returns the last row (on every rank)."""
        if not self._pending:
            return None
        losses = torch.stack([loss for _, _, loss in self._pending])
        if not self.counts_loss:
            losses = torch.zeros_like(losses)
        if dist.is_initialized() and self.env.world_size > 1:
            # Summed in rank order: an all-reduce's order depends on where a step falls in the
            # interval's vector, so a resumed run, whose intervals fall elsewhere, would report
            # the same losses a rounding step apart (seen at 4 ranks).
            gathered = [torch.empty_like(losses) for _ in range(self.env.world_size)]
            dist.all_gather(gathered, losses)
            losses = gathered[0].clone()
            for other in gathered[1:]:
                losses += other
        losses = (losses / self.data_parallel_size).tolist()  # the host sync of this interval
        device_info.synchronize(self.env.device)
        now = time.perf_counter()
        interval = now - self._interval_start
        step_time = interval / len(self._pending)
        self._interval_start = now

        peak = [max(p) for p in zip(*(device_info.peak_memory(d) or (0, 0) for d in self.devices), strict=True)]
        mem = [memory.total(c) for c in ("params", "grads", "optimizer")]
        reduced = all_reduce([*peak, *mem], dist.ReduceOp.MAX, self.env.device)
        on_cuda = self.env.device.type == "cuda"
        tokens_per_s = self.tokens_per_step / step_time
        mfu = tokens_per_s * self.flops_per_token / self.job_peak_flops if self.job_peak_flops else None

        rows = []
        for (step, lr, _), loss in zip(self._pending, losses, strict=True):
            rows.append(
                {
                    "step": step + 1,
                    "loss": loss,
                    "lr": lr,
                    "step_time_s": step_time,
                    "tokens_per_s": tokens_per_s,
                    "mfu": mfu,
                    "peak_mem_allocated_bytes": int(reduced[0]) if on_cuda else None,
                    "peak_mem_reserved_bytes": int(reduced[1]) if on_cuda else None,
                    "mem_params_bytes": int(reduced[2]),
                    "mem_grads_bytes": int(reduced[3]),
                    "mem_optimizer_bytes": int(reduced[4]),
                }
            )
        if self.router is not None:  # counts over the interval: on its last row
            rows[-1].update(self.router.flush(self.env.world_size))
        # Only the interval's rows are kept in memory: a million-step run must not grow the host heap.
        self.last_row, self.steps_logged = rows[-1], self.steps_logged + len(rows)
        last_step = self._pending[-1][0]
        self._track_warm_time(last_step, interval, len(self._pending))
        self._pending.clear()
        if self.env.is_main:
            with self.path.open("a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
            if self.trackers is not None:
                logging_started = time.perf_counter()
                self.trackers.log(rows)
                # What the trackers take is the harness's time, not the strategy's: out of the next interval.
                self._interval_start += time.perf_counter() - logging_started
            self.printer(
                f"step {last_step + 1:>5} | loss {self.last_row['loss']:.4f} | lr {self.last_row['lr']:.2e} | "
                f"{step_time * 1e3:8.1f} ms/step | {tokens_per_s:>10,.0f} tok/s"
                + (f" | mfu {mfu:.1%}" if mfu is not None else "")
                + (f" | expert load max/mean {rows[-1]['router_max_imbalance']:.2f}" if self.router else "")
            )
        return self.last_row

    def _track_warm_time(self, last_step: int, interval: float, n: int) -> None:
        # Throughput leaves out the first `timing_warmup` steps of this process
        # (allocator growth, autotuning, compilation); the loop flushes right after them.
        done = last_step + 1 - self.first_step
        if not self._warm:
            self._warm = done >= self.timing_warmup
        else:
            self._warm_steps += n
            self._warm_elapsed += interval

    def throughput(self) -> dict[str, float | None]:
        """Whole-job tokens/s and mean step time after warm-up (None if too few steps)."""
        if not self._warm_steps:
            return {"tokens_per_s": None, "step_time_s": None, "mfu": None}
        elapsed = self._warm_elapsed
        tokens_per_s = self.tokens_per_step * self._warm_steps / elapsed
        mfu = tokens_per_s * self.flops_per_token / self.job_peak_flops if self.job_peak_flops else None
        return {"tokens_per_s": tokens_per_s, "step_time_s": elapsed / self._warm_steps, "mfu": mfu}

    def begin_step(self, step: int, log_every: int, last_step: int) -> None:
        """Before each step: a step that ends a logging interval times its all-to-alls."""
        if self.router is not None:
            self.router.begin_step(self.should_flush(step, log_every, last_step))

    def router_summary(self) -> dict[str, Any] | None:
        """The routers' figures over the whole run; None for a model without experts."""
        return self.router.summary() if self.router is not None else None

    def should_flush(self, step: int, log_every: int, last_step: int) -> bool:
        done = step + 1 - self.first_step
        return done == self.timing_warmup or (step + 1) % log_every == 0 or step == last_step
