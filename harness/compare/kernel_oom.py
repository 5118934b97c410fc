"""Whether the kernel's OOM killer killed a job: what tells its SIGKILL from any other.

Host memory has no out-of-memory exception: when a CPU run (or a GPU run's host side) outgrows the
machine, the kernel's OOM killer sends one of its processes SIGKILL, and the job reads as "killed by
SIGKILL". Linux counts those kills: cgroup v2's memory.events `oom_kill` for the cgroup the job runs
in (Documentation/admin-guide/cgroup-v2.rst), cgroup v1's memory.oom_control `oom_kill`, and
/proc/vmstat's `oom_kill` for the whole machine (kernel 4.13 and later). A count that grew while
the job ran, beside its SIGKILL, is the OOM killer's; where no count is readable, available memory
seen near zero while the job ran is taken as the sign instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CGROUP_ROOT = Path("/sys/fs/cgroup")
NEAR_ZERO = 0.02  # of the machine's memory, available: what only a machine about to OOM-kill shows


def _field(path: Path, name: str) -> int | None:
    """The value of `name` in a file of `name value` lines; None where unreadable."""
    try:
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == name and words[1].isdigit():
                return int(words[1])
    except OSError:
        return None
    return None


def _own_cgroup_files() -> list[Path]:
    """The files that count this process's cgroup's OOM kills (v2, then v1), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            files.append(CGROUP_ROOT / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            files.append(CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.oom_control")
    return files


def oom_kill_count() -> int | None:
    """OOM kills so far in this process's cgroup, else on the machine; None where none is readable."""
    for file in [*_own_cgroup_files(), Path("/proc/vmstat")]:
        count = _field(file, "oom_kill")
        if count is not None:
            return count
    return None


MEMINFO = Path("/proc/meminfo")


def available_bytes() -> int | None:
    """The memory the machine can give new allocations without swapping (/proc/meminfo's MemAvailable)."""
    available = _field(MEMINFO, "MemAvailable:")
    return None if available is None else available * 1024


def available_share() -> float | None:
    """The machine's available memory as a share of all of it (/proc/meminfo); None where unreadable."""
    total, available = _field(MEMINFO, "MemTotal:"), _field(MEMINFO, "MemAvailable:")
    return available / total if total and available is not None else None


@dataclass
class OomWatch:
    """Watches one job: the OOM-kill count before and after it, the least available memory while it ran.
    The readers are parameters so that a test can play an OOM kill without exhausting memory."""

    count: Callable[[], int | None] = oom_kill_count
    available: Callable[[], float | None] = available_share
    before: int | None = None
    lowest: float | None = None

    def start(self) -> None:
        self.before = self.count()

    def poll(self) -> None:
        share = self.available()
        if share is not None:
            self.lowest = share if self.lowest is None else min(self.lowest, share)

    def killed(self) -> bool:
        """Whether the OOM killer killed something while the job ran."""
        after = self.count()
        if self.before is not None and after is not None:
            return after > self.before
        return self.lowest is not None and self.lowest < NEAR_ZERO
