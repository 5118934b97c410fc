"""How a compare stops: Ctrl-C, SIGTERM (a scheduler's preemption, `kill`) and SIGHUP (the
terminal went away: an ssh session dropped) each stop the running job, skip the rest and still
write results.json and the report for what finished.

The handler only takes note; the sweep acts on it where it can stop cleanly: the running job's
supervisor checks at every poll (and stops the job's whole tree), and the sweep checks before
it starts a job. So a signal never cuts the writing of a result file short, and a second one
changes nothing.

After a hangup the terminal is gone: a write to it fails (EIO), so what the compare still has
to say goes to `<out_dir>/compare.log` instead.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HANGUP_LOG = "compare.log"


class StopSignals:
    """While entered, a stop signal sets `requested`; check() then raises KeyboardInterrupt
    (what run_job and the sweep treat as Ctrl-C).

    SIGINT is caught even where it was ignored: a shell without job control starts background
    commands with SIGINT ignored, and Python keeps an ignored SIGINT ignored. SIGHUP is not
    where it was ignored (nohup)."""

    def __init__(self, out_dir: Path):
        self.log_path = out_dir / HANGUP_LOG
        self.requested: str | None = None  # the signal's name, once one came
        self._terminal_fds: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        # Known now: after a hangup isatty() fails like every other call on the terminal.
        self._terminal_fds = [fd for fd in (1, 2) if os.isatty(fd)]
        # An ignored SIGHUP stays ignored: `nohup` asked for the compare to outlive its terminal.
        caught = [sig for sig in STOP_SIGNALS if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN)]
        self._previous = {sig: signal.signal(sig, self._handle) for sig in caught}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def check(self) -> None:
        """Raise KeyboardInterrupt once a stop signal came."""
        if self.requested:
            raise KeyboardInterrupt

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and self._terminal_fds:
            self._leave_the_terminal()
        self.requested = self.requested or signal.Signals(signum).name

    def _leave_the_terminal(self) -> None:
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # os.write, not print: the handler may run in the middle of a print to the same stream.
        os.write(
            log, b"parabench: the terminal hung up (SIGHUP): the compare stops; what it says from here on is here\n"
        )
        for fd in self._terminal_fds:
            os.dup2(log, fd)
        os.close(log)
        self._terminal_fds = []
