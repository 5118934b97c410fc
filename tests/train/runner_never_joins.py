"""`python runner_never_joins.py <dir> <launches> <join_within_s> <runner.py args...>`: runner.py's own
forked launch, with rank 1 of each of the first <launches> launches (counted in <dir>/blocked) blocked
before it joins its process group, as a rank forked while a thread of the launcher held a lock that it
then takes, and the launcher's bound on that join set to <join_within_s>."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import harness.train.distributed as distributed
import harness.train.launch as launch
from runner import main
from tests.train.never_joins_worker import _block_forever


def _blocking_rank_1(folder: Path, launches: int):
    join = distributed.init_distributed

    def init_distributed(*args: object, **kwargs: object):
        blocked = folder / "blocked"
        if os.environ["RANK"] == "1" and len(blocked.read_text() if blocked.exists() else "") < launches:
            with blocked.open("a") as count:
                count.write("x")
            _block_forever()
        return join(*args, **kwargs)

    return init_distributed


if __name__ == "__main__":
    folder, launches, within_s, *runner_args = sys.argv[1:]
    distributed.init_distributed = _blocking_rank_1(Path(folder), int(launches))
    launch.JOIN_WITHIN_S = float(within_s)
    sys.exit(main(runner_args))
