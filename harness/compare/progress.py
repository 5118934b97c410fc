"""The sweep's live view: which strategy runs, its step and loss, and what is left.

On a terminal one status line is redrawn in place (a bar over the whole sweep);
elsewhere (a pipe, a CI log) every change is a plain line of its own. The step
and loss come from the run's metrics.jsonl as it grows, so the view needs
nothing from the training processes but the file they write anyway.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import TextIO


class MetricsTail:
    """The newest complete line of a metrics.jsonl that another process is appending to."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""
        self.last: dict | None = None

    def poll(self) -> bool:
        """Read what was appended since the last call; True when a new step arrived."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return False
        if len(chunk) == 0:
            return False
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        newest = None
        for line in lines:
            try:
                newest = json.loads(line)
            except ValueError:
                continue  # a line another writer truncated: the next flush brings a whole one
        if newest is None:
            return False
        self.last = newest
        return True


class SweepProgress:
    def __init__(self, names: list[str], total_steps: int, stream: TextIO | None = None, live: bool | None = None):
        self.names = names
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.done = 0
        self.current: str | None = None
        self._tail: MetricsTail | None = None
        self._started = 0.0

    def start(self, name: str, metrics_path: Path) -> None:
        self.current = name
        self._tail = MetricsTail(metrics_path)
        self._started = time.monotonic()
        if not self.live:
            self._line(f"[{self.done + 1}/{len(self.names)}] {name}: running")
        else:
            self._redraw()

    def poll(self) -> None:
        """Called while the run goes on: show a new step when its metrics file grew."""
        if self._tail is None:
            return
        grew = self._tail.poll()
        if self.live:
            self._redraw()
        elif grew and self._tail.last:
            row = self._tail.last
            self._line(f"    {self.current}: step {row['step']}/{self.total_steps}  loss {row['loss']:.4f}")

    def finish(self, name: str, status: str, detail: str) -> None:
        """A strategy is over (ran, failed or was skipped): a permanent line, then the bar again. One
        that never started (skipped) still takes its number, so a log counts every strategy."""
        if self.current is None and not self.live:
            self._line(f"[{self.done + 1}/{len(self.names)}] {name}: {status}")
        self.done += 1
        self.current, self._tail = None, None
        self._line(f"  {_MARKS.get(status, '-')} {name:<18} {status:<11} {detail}")
        if self.live and self.done < len(self.names):
            self._redraw()

    def note(self, message: str) -> None:
        self._line(message)

    def _left(self) -> list[str]:
        return self.names[self.done + (1 if self.current else 0) :]

    def _redraw(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        bar_width = 20
        filled = round(bar_width * self.done / max(1, len(self.names)))
        parts = [f"[{'#' * filled}{'.' * (bar_width - filled)}] {self.done}/{len(self.names)}"]
        if self.current:
            step = ""
            if self._tail and self._tail.last:
                row = self._tail.last
                step = f" step {row['step']}/{self.total_steps} loss {row['loss']:.4f}"
            parts.append(f"{self.current}{step} {time.monotonic() - self._started:.0f}s")
        left = self._left()
        if left:
            parts.append("left: " + " ".join(left))
        text = " | ".join(parts)
        self._write("\r" + text[: width - 1].ljust(width - 1))

    def _line(self, text: str) -> None:
        clear = ""
        if self.live:
            width = shutil.get_terminal_size((100, 20)).columns
            clear = "\r" + " " * (width - 1) + "\r"  # the status line first
        self._write(clear + text + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:
            # The terminal hung up (EIO) under a write: the SIGHUP it sends stops the sweep, and
            # its handler moves the output elsewhere (harness/compare/stop_signals.py).
            pass


_MARKS = {"ok": "+", "kept": "=", "failed": "x", "skipped": "-", "interrupted": "!", "not run": "-"}
