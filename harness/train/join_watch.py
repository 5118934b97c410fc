"""A bound on how long a forked worker may take to join its process group.

A fork copies only the thread that forks: a lock another thread of the launching process held at
that moment stays held in the worker, with no thread left to release it (harness/train/fork_gate.py
keeps torchrun's agent from forking while its store's thread is busy; no such care covers every
lock). A worker blocked that way before the rendezvous leaves its peers waiting there for the whole
process-group timeout, and nothing says where it stopped. Under `watching_join`, a worker still
outside its group `within_s` after its start writes every thread's stack to a file of its own, and
is ended by SIGALRM JOIN_GRACE_S later. Its peers, waiting in the rendezvous, write theirs and end
alike; the launcher prints the files rank by rank (`print_stacks`: every rank's at once on one
stderr would interleave mid-line), and they say which rank was stuck where. The launcher can tell
that end (`group_never_formed`) from any other, and a launch whose process group never formed did
no work that a second launch would lose.
"""

from __future__ import annotations

import faulthandler
import functools
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

# From the stacks written to the end: time for them to reach the log on a busy machine.
JOIN_GRACE_S = 2.0
NEVER_JOINED_EXIT = -signal.SIGALRM  # the worker's exit code, as torchrun's agent reports it

R = TypeVar("R")


STACKS = "stacks_rank_"  # each rank's file in the launcher's folder: STACKS + its rank


def watching_join(entry: Callable[..., R], within_s: float, stacks: Path) -> Callable[..., R]:
    """`entry`, bounded in a forked worker: its stacks at `within_s`, into its own file in `stacks`,
    and its end JOIN_GRACE_S later, unless torch.distributed.init_process_group has returned (or
    raised) by then, or `entry` has."""

    @functools.wraps(entry)
    def watched(*args: object) -> R:
        stop = _watch_join(within_s, stacks / f"{STACKS}{int(os.environ['RANK']):05d}")
        try:
            return entry(*args)
        finally:
            stop()

    return watched


def _watch_join(within_s: float, path: Path) -> Callable[[], None]:
    """Start the watch; what stops it (torch.distributed.init_process_group's return stops it too)."""
    import torch.distributed as dist

    join = dist.init_process_group
    stacks = path.open("w")  # open while the watch may write to it: faulthandler keeps its descriptor

    def stop() -> None:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        stacks.close()
        dist.init_process_group = join

    @functools.wraps(join)
    def joined(*args: object, **kwargs: object) -> object:
        try:
            return join(*args, **kwargs)
        finally:  # in the group, or out of it with the rendezvous' own error: not blocked before it
            stop()

    # Neither needs the GIL nor any lock a thread of the launcher could hold: the stacks come from
    # faulthandler's own thread, the end from the kernel (SIGALRM's default action).
    faulthandler.dump_traceback_later(within_s, file=stacks)
    signal.alarm(math.ceil(within_s + JOIN_GRACE_S))
    dist.init_process_group = joined
    return stop


def print_stacks(stacks: Path, within_s: float) -> None:
    """The stacks the ranks of a launch whose process group never formed wrote in `stacks`, rank by
    rank, on stderr."""
    for path in sorted(stacks.glob(f"{STACKS}*")):
        text = path.read_text().strip()
        if text:
            rank = int(path.name.removeprefix(STACKS))
            print(f"rank {rank}, outside its process group {within_s:g} s after its start:\n{text}", file=sys.stderr)


def group_never_formed(failed: ChildFailedError) -> bool:
    """Whether `watching_join` ended a worker of this failed launch: its process group never formed."""
    return any(failure.exitcode == NEVER_JOINED_EXIT for failure in failed.failures.values())
