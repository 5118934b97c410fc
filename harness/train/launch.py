"""Starting local worker processes when no launcher did: parabench re-runs itself
under torchrun, so one code path serves `nproc=N`, torchrun, deepspeed and accelerate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

RUNNER = str(Path(__file__).resolve().parents[2] / "runner.py")


def torchrun_args(nproc: int, runner_args: list[str]) -> list[str]:
    """torchrun's arguments for `runner.py <runner_args>` on `nproc` local processes: standalone,
    a free rendezvous port on this host."""
    return ["--standalone", f"--nproc_per_node={nproc}", RUNNER, *runner_args]


def torchrun_command(nproc: int, runner_args: list[str]) -> list[str]:
    """`python -m torch.distributed.run <torchrun_args>`, for a job that runs apart from this process."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args(nproc, runner_args)]


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
    """Run `runner.py <runner_args>` in `nproc` local processes and return the job's exit code.

    torchrun's agent runs in this process, which has imported torch already for the checks
    before launch: a second interpreter importing it again would cost a few seconds a run. A
    failed worker is torchrun's failure table (ranks, exit codes) and exit code 1, as from its
    command line, without the agent's own traceback, which says only that a worker failed."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    os.environ.update(worker_env())
    try:
        torchrun_main(torchrun_args(nproc, runner_args))
    except ChildFailedError as failed:
        print(failed.format_msg(), file=sys.stderr)
        return 1
    except SignalException as stopped:  # the agent stopped its workers first
        return 128 + stopped.sigval
    return 0
