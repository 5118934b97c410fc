"""Run one launcher job to its end, whatever happens to it, and say how it ended.

The job gets its own session (so its own process group), but that is not the whole
tree: torchrun starts every worker in a session of its own. So the supervisor also
keeps a record of the job's descendants (from /proc, refreshed while it polls) and a
timeout or Ctrl-C stops all of them (SIGTERM, then SIGKILL after a grace period);
stragglers are killed even after a clean exit. While a job runs the supervisor is a
child subreaper (Linux): a worker forked just as its launcher died is adopted by the
supervisor rather than by init, so it is found and stopped too. Should the supervisor itself
die (SIGKILL, which it cannot catch), the job's leader gets SIGTERM from the kernel (a parent-death
signal), and torchrun stops its workers as it does on any SIGTERM. A failure is classified from
the exit status and the log as one of FAILURE_KINDS, with a one-line message and the log's last lines;
a SIGKILL from the kernel's OOM killer (kernel_oom.py tells it from another) is out of memory too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from harness.common.peer_lost import PEER_LOST
from harness.compare.kernel_oom import OomWatch

FAILURE_KINDS = ("oom", "crash", "signal", "timeout", "interrupted")
LOG_TAIL_LINES = 40
GRACE_S = 5.0  # from SIGTERM to SIGKILL for the job's processes
INTERRUPTED = "stopped by Ctrl-C (or SIGTERM or SIGHUP to compare)"
KERNEL_OOM = "out of memory (killed by the kernel's OOM killer)"

# Device out-of-memory as PyTorch, the CUDA caching allocator, cuBLAS/cuDNN and DeepSpeed word it.
_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|HIP out of memory|out of memory on device",
)
# torchrun's failure summary: each failed worker's exit code (negative: a signal).
_WORKER_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b|parabench: error:).*"
)


@dataclass
class JobOutcome:
    returncode: int | None
    kind: str | None  # None: the job exited 0; else one of FAILURE_KINDS
    message: str
    log_tail: list[str] = field(default_factory=list)
    wall_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.kind is None


def run_job(
    cmd: list[str],
    *,
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_interval_s: float = 0.5,
    grace_s: float = GRACE_S,
    pass_fds: tuple[int, ...] = (),
    append_log: bool = False,
    oom_advice: str = "",
    oom_watch: OomWatch | None = None,
) -> JobOutcome:
    """Run `cmd` with stdout and stderr into `log_path` (after what it holds, with `append_log`);
    never raises for the job's own failure. `pass_fds` are inherited by the job's leader.
    `oom_advice`: what to lower should the kernel's OOM killer kill it (`oom_watch` tells).

    Ctrl-C (KeyboardInterrupt) while it runs stops the job and returns kind "interrupted".
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    own_children = _children_of(os.getpid())  # there before the job: not the job's
    watch = oom_watch or OomWatch()
    watch.start()
    with _adopting_orphans() as adopting:
        with log_path.open("ab" if append_log else "wb") as log:
            log.write(f"$ {shlex.join(cmd)}\n".encode())  # the log says how to run the job again
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                pass_fds=pass_fds,
                preexec_fn=_stopped_with(os.getpid()),
            )
        stopped_for: str | None = None
        tree = ProcessTree(proc.pid, adopted_by=os.getpid() if adopting else None, not_the_job=own_children)
        try:
            while not _exited(proc.pid):
                tree.refresh()
                if time.monotonic() - started > timeout_s:
                    stopped_for = "timeout"
                    break
                if on_poll is not None:
                    on_poll()
                watch.poll()
                _wait_for_exit(proc.pid, poll_interval_s)
        except KeyboardInterrupt:
            stopped_for = "interrupted"
        finally:
            _stop_tree(proc, tree, grace_s)
    wall = time.monotonic() - started
    text = _read_tail(log_path)
    tail = _without_launcher_traceback(text.splitlines())[-LOG_TAIL_LINES:]
    killed_for_memory = stopped_for is None and proc.returncode != 0 and watch.killed()
    kind, message = classify(proc.returncode, text, stopped_for, timeout_s, killed_for_memory, oom_advice)
    return JobOutcome(proc.returncode, kind, message, tail, wall)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stopped_with(supervisor: int) -> Callable[[], None] | None:
    """For the job's child process before it runs the job: SIGTERM it when `supervisor` dies.
    The job lives in a session of its own, so nothing else would stop it; torchrun answers
    SIGTERM by stopping its workers. None where prctl is missing (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != supervisor:  # the supervisor died before the signal was set
            os._exit(128 + signal.SIGTERM)

    return set_parent_death_signal


# How soon a job's end is seen: the leader's exit is checked this often between the polls
# (a waitid each, no /proc walk), so a short run does not wait out a whole poll interval.
EXIT_CHECK_S = 0.02


def _wait_for_exit(pid: int, seconds: float) -> None:
    """Return when the leader `pid` has exited or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(EXIT_CHECK_S)


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the exited leader a zombie: its pid, hence the group id, cannot be
    # reused before _stop_tree has signalled the group.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class ProcessTree:
    """The job's processes: its leader's group and every descendant seen so far.

    Workers that torchrun put in sessions of their own are found through their
    parent links while the launcher lives, and after it died through the supervisor
    that adopted them (`adopted_by`); they are remembered with their start time, so
    a later signal never reaches an unrelated process that reused a pid.
    """

    def __init__(self, leader: int, adopted_by: int | None = None, not_the_job: set[int] = frozenset()):
        self.leader = leader
        self.adopted_by = adopted_by
        self.not_the_job = set(not_the_job) | {leader}
        self.known: dict[int, int] = {}  # pid -> start time (clock ticks after boot)

    def refresh(self) -> None:
        table = _process_table()
        frontier = [self.leader]
        if self.adopted_by is not None:
            frontier.append(self.adopted_by)
        while frontier:
            parent = frontier.pop()
            for pid, (ppid, _, start) in table.items():
                if ppid == parent and pid not in self.known and pid not in self.not_the_job:
                    self.known[pid] = start
                    frontier.append(pid)

    def reap_adopted(self, timeout_s: float = 5.0) -> None:
        """Collect the exit status of the killed orphans this process adopted (no zombies left)."""
        if self.adopted_by is None:
            return
        pending = set(self.known)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue  # still dying
                except ChildProcessError:
                    pass  # not our child: its own parent reaps it
                pending.discard(pid)
            if pending:
                time.sleep(0.05)

    def alive(self) -> list[tuple[int, bool]]:
        """(pid, leads its own process group) of each known descendant still running."""
        table = _process_table()
        # A pid whose start time changed belongs to another process now: leave it alone.
        return [
            (pid, table[pid][1] == pid) for pid, start in self.known.items() if pid in table and table[pid][2] == start
        ]

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the leader's group and to every known descendant still alive."""
        _signal_group(self.leader, sig)
        for pid, leads_group in self.alive():
            # A worker leading its own group may have children of its own (data loaders): the group holds them.
            if leads_group:
                _signal_group(pid, sig)
            else:
                _signal_pid(pid, sig)


def _process_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, process group, start time) of every live, non-zombie process (Linux /proc)."""
    table: dict[int, tuple[int, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table  # no /proc (not Linux): the leader's group is all that can be stopped
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        # The command name sits in parentheses and may hold spaces: the fields follow the last ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def _stop_tree(proc: subprocess.Popen, tree: ProcessTree, grace_s: float) -> None:
    """SIGTERM the job's processes if its leader still runs, then SIGKILL whatever is left."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
    try:
        if not _exited(proc.pid):
            tree.refresh()
            tree.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and not (_exited(proc.pid) and not tree.alive()):
                time.sleep(0.1)
        # Workers that outlive their launcher, or ignore SIGTERM, are still in the tree; one
        # forked as the launcher died has been adopted by now, and this refresh finds it.
        tree.refresh()
        tree.signal(signal.SIGKILL)
        proc.wait()
        tree.reap_adopted()
    finally:
        signal.signal(signal.SIGINT, previous)


def _children_of(parent: int) -> set[int]:
    return {pid for pid, (ppid, _, _) in _process_table().items() if ppid == parent}


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37  # linux/prctl.h


@contextlib.contextmanager
def _adopting_orphans() -> Iterator[bool]:
    """While inside, this process adopts its orphaned descendants (a Linux child subreaper);
    yields False where it cannot (then the leader's group and the descendants seen are what
    can be stopped)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        yield False
        return
    before = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0) != 0:
        yield False
        return
    adopting = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield adopting
    finally:
        if adopting and not before.value:
            prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is gone already


def _signal_pid(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def is_out_of_memory_message(text: str) -> bool:
    """Whether `text` words a device out-of-memory error (as the log classification reads it)."""
    return _OOM.search(text) is not None


def classify(
    returncode: int | None,
    log_text: str,
    stopped_for: str | None,
    timeout_s: float,
    oom_killed: bool = False,
    oom_advice: str = "",
) -> tuple[str | None, str]:
    """(kind, one-line message) for a finished job; kind None means success. `oom_killed`: the
    kernel's OOM killer killed something while it ran, so a SIGKILL among its processes is that."""
    if stopped_for == "timeout":
        return "timeout", f"still running after timeout_s={timeout_s:g}: all its processes were killed"
    if stopped_for == "interrupted":
        return "interrupted", INTERRUPTED
    if returncode == 0:
        return None, "exited 0"
    oom = _last_match_line(log_text, _OOM)
    if oom:
        return "oom", shorten(oom)
    if oom_killed and _signal_number(returncode, log_text) == signal.SIGKILL:
        lower = f": lower {oom_advice}" if oom_advice else ""
        return "oom", f"{KERNEL_OOM}{lower}"
    # A worker's own exception is the cause even when the failure table shows a signal: a
    # process that raised may still abort in its C++ teardown ("terminate called ...") while
    # its peer's store or sockets go away, and torchrun SIGTERMs the survivors.
    cause = _last_exception_line(log_text, skip=PEER_LOST)
    if cause is None:
        signum = _signal_number(returncode, log_text)
        if signum is not None:
            return "signal", f"a process was killed by {_signal_name(signum)} (signal {signum})"
        cause = _last_exception_line(log_text)  # a peer-lost error, with no signal to blame
    detail = f": {shorten(cause)}" if cause else ""
    return "crash", f"exited with code {returncode}{detail}"


def _signal_number(returncode: int | None, log_text: str) -> int | None:
    if returncode is not None and returncode < 0:
        return -returncode
    # Under torchrun the launcher exits 1 and lists each failed worker's exit code. A
    # SIGTERM there is torchrun's own doing (it stops the survivors when one worker fails),
    # and may even be "first observed": the signal that matters is any other.
    codes = [int(code) for code in _WORKER_EXIT.findall(log_text)]
    signals = [-code for code in codes if code < 0 and -code != signal.SIGTERM]
    return signals[0] if signals else None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _last_match_line(text: str, pattern: re.Pattern) -> str | None:
    for line in reversed(text.splitlines()):
        if pattern.search(line):
            return line.strip()
    return None


def _last_exception_line(text: str, skip: re.Pattern | None = None) -> str | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        # The launcher's own ChildFailedError says only that a child failed: keep looking for the child's.
        if _EXCEPTION_LINE.match(line) and "ChildFailedError" not in line and not (skip and skip.search(line)):
            return line
    return None


def _without_launcher_traceback(lines: list[str]) -> list[str]:
    """Drop torchrun's own traceback: it says only that a worker failed, and would push the
    worker's traceback out of the tail; its failure table after it (exit codes, ranks) stays."""
    ends = [i for i, line in enumerate(lines) if "ChildFailedError" in line]
    if not ends:
        return lines
    starts = [i for i, line in enumerate(lines[: ends[-1]]) if line.startswith("Traceback (most recent call last)")]
    return lines[: starts[-1]] + lines[ends[-1] + 1 :] if starts else lines


def shorten(line: str, limit: int = 300) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _read_tail(path: Path, max_bytes: int = 256_000) -> str:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - max_bytes))
        return f.read().decode("utf-8", errors="replace")
