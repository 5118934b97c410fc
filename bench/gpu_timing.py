"""What the GPU kernel benchmarks share (attention_kernels.py, ring_attention_rank.py,
misaligned_matmul.py, kernel_table.py): a best-of-N timer that waits for the GPU, a timer of the
device's own kernel time, and their command line: a GPU required, the table printed as it grows
and, with --out, written as Markdown."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch


def best_seconds(once: Callable[[], None], repeats: int) -> float:
    """The shortest of `repeats` calls of `once` (warmed up by the caller), each timed to the end
    of its GPU work (of itself, where no GPU is visible: a script's CPU dry run)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        once()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def device_seconds(once: Callable[[], object], repeats: int) -> float:
    """The GPU's time for one call of `once` (warmed up by the caller): the summed durations of the
    kernels it runs, as the profiler reads them from the device, over `repeats` calls. A wall clock
    around one call adds the launch and the wait for the result (about 30 us behind an H200's host:
    three to five times a small matmul's work), which best_seconds keeps and this leaves out."""
    from torch.autograd import DeviceType

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            once()
        torch.cuda.synchronize()
    busy_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return busy_us / repeats / 1e6


def gpu_command(description: str, script: str) -> Path | None:
    """The command line's --out (None without it); where no GPU is visible, says so and exits 2."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"{script} times GPU kernels: run it on a GPU machine", file=sys.stderr)
        sys.exit(2)
    return args.out


def write_table(lines: list[str], out: Path | None) -> None:
    """The finished table written to `out` where one was given."""
    if out:
        out.write_text("\n".join(lines) + "\n")
