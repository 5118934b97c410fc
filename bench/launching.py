"""Starting the bench scripts' processes: each in the checkout's environment, its output in a
log file, cut at a timeout or at the whole benchmark's time budget, stopped with its workers."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.runs import ROOT


class Clock:
    """The whole benchmark's time budget: a process starts only with time left, and is cut at the budget."""

    def __init__(self, budget_s: float | None):
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.elapsed()


def child_env(one_thread: bool) -> dict[str, str]:
    """This environment for a child, with the checkout first on PYTHONPATH; `one_thread` for the
    CPU runs (several processes share few cores)."""
    env = dict(os.environ)
    # A launcher's variables in our own environment would make runner.py join that job.
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "TORCHELASTIC_RUN_ID",
    ):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if one_thread:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class Launched:
    code: int | None  # None: not started, or cut
    output: str
    wall_s: float
    reason: str  # why it was not started or was cut; "" otherwise


def launch(cmd: list[str], log_path: Path, clock: Clock, run_timeout: float, env: dict[str, str]) -> Launched:
    """Run `cmd` with stdout+stderr into `log_path`, within the timeout and what is left of the budget."""
    left = clock.left()
    if left is not None and left < 20:
        return Launched(None, "", 0.0, f"time budget spent ({clock.budget_s:.0f} s)")
    timeout = run_timeout if left is None else min(run_timeout, left)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        # In our own process group: whatever stops this script stops the runs too.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            return Launched(None, log_path.read_text(), time.monotonic() - started, f"cut after {timeout:.0f} s")
        except BaseException:
            stop(proc)
            raise
    return Launched(proc.returncode, log_path.read_text(), time.monotonic() - started, "")


def stop(proc: subprocess.Popen) -> None:
    """Stop a process we started: SIGTERM (torchrun passes it on to its workers), then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def last_error(output: str) -> str:
    """The line that says what went wrong: the last `SomeError: ...` line, else the last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith("$ ")]
    for line in reversed(lines):
        if re.match(r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b", line) or line.startswith("parabench: error"):
            return line[:200]
    return (lines[-1] if lines else "no output")[:200]


def failure(done: Launched) -> str:
    """Why a finished launch is not a result (empty when it exited 0)."""
    return done.reason or (f"exit {done.code}: {last_error(done.output)}" if done.code else "")


def parse_hand(output: str) -> dict[str, Any] | None:
    """The JSON line a hand-written loop prints (bench/handwritten/_common.report)."""
    for line in reversed(output.splitlines()):
        start = line.find('{"bench"')
        if start >= 0:
            try:
                return json.loads(line[start:])
            except json.JSONDecodeError:
                continue
    return None
