"""The one check that a folder parabench is about to write into can be written: made if it
is missing and tried with a real file, so that a bad out_dir is one line before any process
starts, not a traceback from every worker minutes later."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

CHOOSE_ANOTHER = "choose a folder you can write to"


class FolderError(ValueError):
    """A folder that cannot be created or written (one line, says what to do)."""


def check_writable(path: str | Path, what: str | None = None, create: bool = True, fix: str = CHOOSE_ANOTHER) -> Path:
    """`path` (created with its parents when `create`), once a temporary file could be written
    in it and removed again. Raises FolderError naming the folder (`what`, default
    `out_dir=<path>`), why, and `fix`."""
    folder = Path(path).expanduser()
    what = what or f"out_dir={path}"
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file stands where the folder should be
            raise FolderError(f"{what} is a file, not a folder: {fix}") from None
        except OSError as exc:
            raise FolderError(f"{what} cannot be created ({_reason(exc)}): {fix}") from None
    elif not folder.is_dir():
        raise FolderError(f"{what} is not a folder: {fix}")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".parabench-write-check-"):
            pass
    except OSError as exc:
        raise FolderError(f"{what} cannot be written ({_reason(exc)}): {fix}") from None
    return folder


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file"
    return exc.strerror or type(exc).__name__
