"""Forked workers that start only once every worker of their launch is forked.

torchrun's agent forks its workers one after another, from a process whose rendezvous stores each
run a server thread. A worker that starts at once connects to the agent's store while the agent
forks the next one: the server thread, accepting that connection, can be holding glibc's resolver
lock (it looks up the peer's address by name), and a fork copies the lock held, with no thread in
the new worker to release it. That worker's own connection to the store resolves "localhost"
(getaddrinfo) and blocks on the lock for ever, before the process group's rendezvous, while its
peers wait there for the whole process-group timeout. Held back until the last fork, no worker
talks to the store while the agent forks: its server threads wait on their sockets, holding nothing.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
from typing import Callable, TypeVar

# From a worker's start to its launch's last fork: a few milliseconds a worker, even on a busy machine.
FORKS_WITHIN_S = 120.0

R = TypeVar("R")


def after_every_fork(entry: Callable[..., R], nproc: int) -> Callable[..., R]:
    """`entry`, for `nproc` workers forked from this process: each runs it once all of them are forked."""
    forked = multiprocessing.get_context("fork").Barrier(nproc)

    @functools.wraps(entry)
    def gated(*args: object) -> R:
        try:
            forked.wait(FORKS_WITHIN_S)
        except threading.BrokenBarrierError:
            raise RuntimeError(
                f"not every one of this launch's {nproc} workers was forked within {FORKS_WITHIN_S:g} s of this one"
            ) from None
        return entry(*args)

    return gated
