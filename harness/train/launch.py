"""Starting local worker processes when no launcher did: parabench re-runs itself
under torchrun, so one code path serves `nproc=N`, torchrun, deepspeed and accelerate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RUNNER = str(Path(__file__).resolve().parents[2] / "runner.py")


def torchrun_command(nproc: int, runner_args: list[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone ...`: a free rendezvous port on this host."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        RUNNER,
        *runner_args,
    ]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # torchrun sets 1 thread per worker with a warning; say so ourselves, quietly.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # With the rendezvous store shared, a restarted gloo group can read the dead
    # attempt's addresses and fail (pytorch#135712); a store of its own avoids that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def run_under_torchrun(nproc: int, runner_args: list[str]) -> int:
    """Run `runner.py <runner_args>` in `nproc` local processes and return the job's exit code."""
    return subprocess.call(torchrun_command(nproc, runner_args), env=worker_env())
