"""Starting local worker processes when no launcher did: parabench re-runs itself
under torchrun, so one code path serves `nproc=N`, torchrun, deepspeed and accelerate."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from harness.common.peer_lost import PEER_LOST
from harness.train.fork_gate import after_every_fork
from harness.train.join_watch import group_never_formed, print_stacks, watching_join

RUNNER = str(Path(__file__).resolve().parents[2] / "runner.py")
_FORKED = False  # whether this process is a worker forked_worker started

# With forked workers the launcher reports the first failed worker it sees, and only that one
# (torchrun's own workers, new interpreters, are all listed). A rank that dies (SIGKILL, out of
# memory) makes its peers fail in their next collective a moment later: a failing forked worker
# waits some of the agent's polls (0.1 s apart) before it ends, so the report names the rank
# that died first.
FAILED_WORKER_GRACE_S = 1.0

# A forked worker joins its process group within seconds of its fork, on a busy machine too: its
# imports are the launcher's, and joining is the first thing a run does (loop.run). One still outside
# it this long after its start is blocked (harness/train/join_watch.py), well before the process-group
# timeout (pg_timeout_s, 300 s by default) would end its peers' wait.
JOIN_WITHIN_S = 60.0

# torchrun's agent keeps each worker's error file in a folder of its own, a new one in the temporary
# folder for every launch unless --log-dir names one; a launch here gives it one that it removes after
# (the failure it reports has read the files by then).
LAUNCH_LOGS = "parabench-launch-"

# What every worker imports whatever its strategy: torch disables dynamo around an optimizer's
# constructor, which imports torch._dynamo (1.5 s of CPU) on its first call in a process.
EVERY_WORKER_IMPORTS = ("torch._dynamo",)

# A worker this launcher started writes its one-line error (`parabench: error: ...`, exit code
# USER_ERROR) into this folder instead of the terminal: every rank meets the same bad input, and
# the launcher prints each distinct line once, not once a rank beside torchrun's failure table.
WORKER_ERRORS_ENV = "PARABENCH_WORKER_ERRORS"
USER_ERROR = 2  # runner.py's exit code for a one-line error


def torchrun_args(nproc: int, runner_args: list[str]) -> list[str]:
    """torchrun's arguments for `runner.py <runner_args>` on `nproc` local processes: standalone,
    a free rendezvous port on this host."""
    return ["--standalone", f"--nproc_per_node={nproc}", RUNNER, *runner_args]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # torchrun sets 1 thread per worker with a warning; say so ourselves, quietly.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # With the rendezvous store shared, a restarted gloo group can read the dead
    # attempt's addresses and fail (pytorch#135712); a store of its own avoids that.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def run_under_torchrun(
    nproc: int, runner_args: list[str], *, fork_workers: bool = False, backend_modules: tuple[str, ...] = ()
) -> int:
    """Run `runner.py <runner_args>` in `nproc` local processes and return the job's exit code.

    torchrun's agent runs in this process, which has imported torch already for the checks
    before launch: a second interpreter importing it again would cost a few seconds a run.
    `fork_workers` (a CPU run: no CUDA state to carry over) forks each worker from this process
    instead, torch, the run's modules and the strategy's `backend_modules` imported here once. A
    failed worker is torchrun's failure table (ranks, exit codes) and exit code 1, as from its
    command line, without the agent's own traceback, which says only that a worker failed."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from strategies.backend_imports import import_backends

    os.environ.update(worker_env())
    with tempfile.TemporaryDirectory(prefix="parabench-errors-") as errors, _quiet_user_errors():
        os.environ[WORKER_ERRORS_ENV] = errors
        try:
            if fork_workers:
                # The workers train on the CPU: DeepSpeed, imported here, need not look for a device
                # (and warn on the terminal that it found none), as each run tells it (loop.run).
                os.environ.setdefault("DS_ACCELERATOR", "cpu")
                import_backends((*EVERY_WORKER_IMPORTS, *backend_modules))
                _launch_forked(nproc, runner_args)
            else:
                with tempfile.TemporaryDirectory(prefix=LAUNCH_LOGS) as logs:
                    torchrun_main([f"--log-dir={logs}", *torchrun_args(nproc, runner_args)])
        except ChildFailedError as failed:
            # A rank's one-line error is the cause even where a peer failed first: a rank that
            # stops alone (rank 0's tracker, its checkpoint check) leaves its peers to fail in their
            # next collective.
            lines = worker_errors(Path(errors))
            for line in lines:
                print(line, file=sys.stderr)
            if lines:
                return USER_ERROR
            if group_never_formed(failed):
                print(
                    f"parabench: error: a worker was still outside its process group {JOIN_WITHIN_S:g} s after its "
                    "start, in two launches (its stacks are above): run again, or launch with torchrun "
                    "(`torchrun --nproc_per_node=N runner.py train ...`), whose workers are new processes, not forks",
                    file=sys.stderr,
                )
                return 1
            print(failed.format_msg(), file=sys.stderr)
            return 1
        except SignalException as stopped:  # the agent stopped its workers first
            return 128 + stopped.sigval
        finally:
            os.environ.pop(WORKER_ERRORS_ENV, None)
    return 0


def report_error(line: str) -> None:
    """Say a one-line error: into the launcher's folder from a worker it started (it prints each
    distinct line once), else on stderr."""
    errors, rank = os.environ.get(WORKER_ERRORS_ENV), os.environ.get("RANK")
    if errors and rank is not None and Path(errors).is_dir():
        with open(Path(errors) / f"rank_{int(rank):05d}", "a") as f:
            f.write(line + "\n")
        return
    print(line, file=sys.stderr)


def _a_worker_reported() -> bool:
    """Whether a worker of this launch has written its one-line error."""
    errors = os.environ.get(WORKER_ERRORS_ENV)
    return bool(errors) and Path(errors).is_dir() and any(Path(errors).glob("rank_*"))


def reported_elsewhere(exc: BaseException) -> bool:
    """Whether `exc` is this worker losing a peer that stopped with a one-line error already
    reported to the launcher: a symptom to end quietly on, not a second cause to print."""
    return _a_worker_reported() and PEER_LOST.search(f"{type(exc).__name__}: {exc}") is not None


def worker_errors(folder: Path) -> list[str]:
    """The distinct lines the workers reported, in rank order."""
    lines: list[str] = []
    for file in sorted(folder.glob("rank_*")):
        lines += [line for line in file.read_text().splitlines() if line and line not in lines]
    return lines


# What the agent and torch's process context log as they stop the workers: a failure with the
# agent's own traceback, and each surviving worker terminated.
_STOPPING_LOGS = {
    "torch.distributed.elastic.multiprocessing.api": "failed (exitcode",
    "torch.multiprocessing.spawn": "Terminating process",
}


@contextlib.contextmanager
def _quiet_user_errors() -> Iterator[None]:
    """Keep torchrun's agent and torch's process context from logging the workers' stop where a
    worker reported a one-line error (their failure table and lines stay for every other exit)."""

    def keep(record: logging.LogRecord) -> bool:
        starts = _STOPPING_LOGS.get(record.name, "")
        return not (starts and str(record.msg).startswith(starts) and _a_worker_reported())

    loggers = [logging.getLogger(name) for name in _STOPPING_LOGS]
    for logger in loggers:
        logger.addFilter(keep)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(keep)


def _launch_forked(nproc: int, runner_args: list[str]) -> None:
    """torchrun's standalone launch, as its command line would make it, with `forked_worker` as
    each worker's entry point and the fork start method, made again once where its process group
    never formed."""
    launch_forked_until_formed(
        torchrun_args(nproc, runner_args), forked_worker, runner_args, JOIN_WITHIN_S, "parabench"
    )


def launch_forked_until_formed(
    torchrun_argv: list[str], entry: Callable[..., object], entry_args: list[str], join_within_s: float, who: str
) -> None:
    """`launch_forked` with its workers' join bounded by `join_within_s`, made again once where a
    worker never joined its process group: such a launch did no work a second one would lose, and
    what blocked it (a lock a thread of this process held at a fork) need not happen twice. `who`
    names the launcher in the line that says so."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    for attempt in (1, 2):
        try:
            launch_forked(torchrun_argv, entry, entry_args, join_within_s=join_within_s)
            return
        except ChildFailedError as failed:
            if attempt == 2 or not group_never_formed(failed):
                raise
        print(
            f"{who}: the process group did not form within {join_within_s:g} s of the ranks' start "
            "(their stacks are above): launching again, once",
            file=sys.stderr,
            flush=True,
        )


def launch_forked(
    torchrun_argv: list[str],
    entry: Callable[..., object],
    entry_args: list[str],
    *,
    join_within_s: float | None = None,
) -> None:
    """torchrun's launch as `torchrun_argv` (its command line's arguments) makes it, each worker forked
    from this process to run `entry(*entry_args)`: what this process has imported, its workers have.
    Each starts once the last is forked (harness/train/fork_gate.py). `join_within_s`: a worker not in
    its process group that long after its start writes its stacks and ends (harness/train/join_watch.py)."""
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    with tempfile.TemporaryDirectory(prefix=LAUNCH_LOGS) as logs:
        args = parse_args(["--start-method=fork", f"--log-dir={logs}", *torchrun_argv])
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        config, _, _ = config_from_args(args)
        sys.stdout.flush()  # what is buffered here would be written again by every worker
        sys.stderr.flush()
        if join_within_s is not None:
            entry = watching_join(entry, join_within_s, Path(logs))
        try:
            elastic_launch(config, after_every_fork(entry, config.nproc_per_node))(*entry_args)
        except ChildFailedError as failed:
            if join_within_s is not None and group_never_formed(failed):
                print_stacks(Path(logs), join_within_s)
            raise


def in_forked_worker() -> bool:
    """Whether this process is a worker forked from the launching one (forked_worker): it returns
    from its run, and the multiprocessing module ends the process."""
    return _FORKED


def start_as_a_fresh_worker() -> None:
    """In a worker forked from the launching process: its own signal handling and exit handlers, the
    thread count torchrun's environment gives it and line-buffered output, as a fresh worker has."""
    import atexit
    import signal

    import torch

    for handled in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(handled, signal.SIG_DFL)  # the agent's own handlers stay the agent's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the launcher's exit handlers are the launcher's to run
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for stream in (sys.stdout, sys.stderr):  # a line at a time, as torchrun's `python -u` workers write
        stream.reconfigure(line_buffering=True)


def forked_worker(*runner_args: str) -> int:
    """One worker forked from the launching process: it starts as a fresh one would, its own
    signal handling and exit handlers, the thread count torchrun's environment gives it, then
    runs `runner.py <runner_args>` and returns its exit code (a failure exits with it)."""
    global _FORKED
    _FORKED = True
    start_as_a_fresh_worker()
    sys.path.insert(0, str(Path(RUNNER).parent))
    from runner import main

    try:
        code = main(list(runner_args))
    except Exception:
        time.sleep(FAILED_WORKER_GRACE_S)
        raise
    if code:
        time.sleep(FAILED_WORKER_GRACE_S)
        sys.exit(code)
    return 0
