"""One compare at a time in an out_dir: a lock the compare holds for its whole life, and its
jobs' leaders and the workers they fork with it (they inherit the descriptor), so that a compare
started again right after one was killed waits until the killed one's last job has stopped
writing there.

The lock is the kernel's (flock): released when the last process holding it ends, however it
ends, so a killed compare never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Callable

from configs.schema import ConfigError

LOCK_FILE = ".compare.lock"
# Long enough for torchrun to stop its workers after the compare above it was killed.
WAIT_S = 30.0


class OutDirBusy(ConfigError):
    """Another compare (or the job of a compare just killed) is still writing into the out_dir."""


class OutDirLock:
    """Holds `<out_dir>/.compare.lock` from acquire() until this process (and every job leader
    that inherited `fd`) has ended."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self, wait_s: float = WAIT_S, on_wait: Callable[[], None] | None = None) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"cannot write into {self.path.parent} ({exc.strerror}): give a writable out_dir"
            ) from None
        deadline = time.monotonic() + wait_s
        waited = False
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                os.close(fd)
                raise OutDirBusy(
                    f"another compare is running into {self.path.parent} (or the job of one just stopped is still "
                    "ending): wait for it to end, or give another out_dir"
                )
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            time.sleep(0.2)
        self.fd = fd


def is_locked(out_dir: Path) -> bool:
    """Whether a compare (or a job of one) holds `out_dir`'s lock right now."""
    path = out_dir / LOCK_FILE
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)  # which lets go of the lock where this took it


def _try_lock(fd: int) -> bool:
    """True once this descriptor holds the lock, or where the filesystem has no locks to take
    (a Lustre mount without flock): the lock is a guard, not a condition for running."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            return True
        raise
    return True
