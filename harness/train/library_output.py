"""What the libraries say, out of the terminal: stdout carries parabench's own lines (the
header, the steps, its warnings), stderr everything the libraries print (Python warnings,
their loggers, DeepSpeed's notices, torch's C++ warnings), and a lone `train` run sends its
stderr into <out_dir>/log.txt. With verbose=true stderr stays on the terminal. A compare's
runs keep theirs (verbose=true): the compare already writes a run's whole output to its
log.txt and shows only its own progress lines.

Errors are still seen: the terminal's stderr is back in place before an exception leaves the
run, so the traceback and `parabench: error:` lines print there (and a copy goes to the log),
and a fatal signal's Python stack (faulthandler) goes to the terminal as well.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterator

LOG_FILE = "log.txt"


def loggers_to_stderr() -> None:
    """Point every logging handler that writes to stdout at stderr instead (DeepSpeed's logs to
    stdout): called once libraries that may have made such handlers are imported."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # placeholders in the dict have none
            if type(handler) is logging.StreamHandler and handler.stream in (sys.stdout, sys.__stdout__):
                handler.setStream(sys.stderr)


@contextlib.contextmanager
def warnings_once() -> Iterator[None]:
    """Each distinct warning written once: some, such as torch's deprecation of a collective
    DeepSpeed calls, come back every step. On the way out, how often each came."""
    seen: dict[tuple, int] = {}
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        key = (category, str(message), filename, lineno)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original
        for (category, message, _, _), count in seen.items():
            if count > 1:
                print(f"(came {count} times: {category.__name__}: {_shortened(message)})", file=sys.stderr)


@contextlib.contextmanager
def library_output(out_dir: str | Path, verbose: bool, rank: int) -> Iterator[None]:
    """Inside: library output on stderr, and stderr (file descriptor 2, so C++ writes too) appended
    to <out_dir>/log.txt unless `verbose`. Rank 0 names the log on the terminal at the end
    if anything was written to it."""
    loggers_to_stderr()
    if verbose:
        with warnings_once():
            yield
        return
    log_path = Path(out_dir) / LOG_FILE
    with _stderr_into(log_path, rank) as grew, warnings_once():
        yield
    if rank == 0 and grew():
        print(f"library output: {log_path} (verbose=true prints it here)", flush=True)


@contextlib.contextmanager
def _stderr_into(log_path: Path, rank: int) -> Iterator[Callable[[], bool]]:
    """File descriptor 2 appended to `log_path` while inside (every rank appends to the same file);
    yields a function telling whether anything was written to it since."""
    sys.stderr.flush()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if rank == 0:  # one line per run: the file takes every run into the same out_dir
        os.write(log_fd, f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n".encode())
    written_before = os.fstat(log_fd).st_size
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    # A crash's Python stack (and a SIGUSR1 dump where runner.py asked for one) still on the terminal.
    fatal_was_on, usr1_was_on = faulthandler.is_enabled(), faulthandler.unregister(signal.SIGUSR1)
    faulthandler.enable(file=terminal)
    if usr1_was_on:
        faulthandler.register(signal.SIGUSR1, file=terminal, all_threads=True)
    try:
        yield lambda: log_path.stat().st_size > written_before
    except BaseException:
        traceback.print_exc()  # the log's copy; the terminal gets it once stderr is back
        raise
    finally:
        sys.stderr.flush()
        os.dup2(terminal.fileno(), 2)
        if fatal_was_on:
            faulthandler.enable()
        else:
            faulthandler.disable()
        if usr1_was_on:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        terminal.close()


def _shortened(message: str, limit: int = 100) -> str:
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
