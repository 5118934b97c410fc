"""`forked_torchrun.py <nproc> fork_order_worker.py`: each rank writes `started` into the file that
FORK_ORDER_LOG names, and the launcher writes `forking` there before each fork, SLOW_FORK_S after a
rank that started at once would have written its line (this script's body, which the launcher runs
once to preload its imports, sets that up there)."""

from __future__ import annotations

import os
import time

LOG_ENV = "FORK_ORDER_LOG"
SLOW_FORK_S = 0.5  # a busy machine's time between two forks, made certain


def _append(line: str) -> None:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")


def _before_fork() -> None:
    time.sleep(SLOW_FORK_S)
    _append("forking")


if __name__ == "__main__":  # a rank
    _append("started")
else:  # the launcher, preloading
    os.register_at_fork(before=_before_fork)
