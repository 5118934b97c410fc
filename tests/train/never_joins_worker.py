"""`forked_torchrun.py --join-within=<s> 2 never_joins_worker.py <dir> <launches>`: rank 1 of each of the
first <launches> launches (counted in <dir>/blocked) blocks before it joins the process group, as a
rank forked while a thread of the launcher held a lock that it then takes; in any later launch both
ranks join, and rank 0 writes <dir>/joined."""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist


def _block_forever() -> None:
    held = threading.Lock()
    held.acquire()
    held.acquire()  # no thread is left to release it


def main() -> None:
    folder, launches = Path(sys.argv[1]), int(sys.argv[2])
    blocked = folder / "blocked"
    if os.environ["RANK"] == "1" and len(blocked.read_text() if blocked.exists() else "") < launches:
        with blocked.open("a") as count:
            count.write("x")
        _block_forever()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    dist.barrier()
    if dist.get_rank() == 0:
        (folder / "joined").write_text("joined\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
