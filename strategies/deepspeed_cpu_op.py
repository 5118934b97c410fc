"""DeepSpeed's shared-memory communication op on a CPU, built before DeepSpeed asks for it.

On a CPU, DeepSpeed compiles a small op with torch's JIT extension loader the first time a process
group comes up. The loader guards a build with a lock file and waits for it without end: a build
killed midway (Ctrl-C, a job's time limit) leaves the file behind, and every later DeepSpeed run on
the machine then hangs without a word. Here one process per node builds while its peers wait at a
barrier, and a lock older than any build takes is cleared, with a line saying so.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

# The op builds in about 30 s on 2 idle cores: a lock this old belongs to no live build.
STALE_LOCK_S = 600.0
_POLL_S = 1.0


def build_cpu_comm_op(local_rank: int) -> None:
    """Build (or find built) the op on local rank 0, then release the node's other ranks."""
    import deepspeed.ops
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False) and local_rank == 0:
        wait_for_build_lock(Path(_build_directory(builder.NAME)) / "lock")
        # DeepSpeed's build notices go where the libraries' other output goes, not on stdout.
        with contextlib.redirect_stdout(sys.stderr):
            builder.load(verbose=False)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def wait_for_build_lock(lock: Path, stale_after_s: float = STALE_LOCK_S) -> None:
    """Return once `lock` is gone, removing it when it is older than any build takes."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > stale_after_s:
            print(
                f"parabench: removed {lock}, left {age / 60:.0f} min ago by an interrupted build of DeepSpeed's CPU op",
                file=sys.stderr,
            )
            lock.unlink(missing_ok=True)
            return
        time.sleep(_POLL_S)


def _build_directory(name: str) -> str:
    """Where torch's extension loader builds `name` (TORCH_EXTENSIONS_DIR or its default root)."""
    from torch.utils import cpp_extension

    return cpp_extension._get_build_directory(name, verbose=False)
