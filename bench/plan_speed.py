#!/usr/bin/env python3
"""How long `plan` takes to answer one question: the questions the docs ask, each answered
in-process (after the imports, as a caller that asks several pays) and end to end (a fresh
interpreter, imports included, as one `runner.py plan` on the command line pays). The layout
search has its own benchmark (plan_search.py).

    python bench/plan_speed.py              # written to bench/results/plan_speed.md
    python bench/plan_speed.py --out -      # printed only

Each question is answered REPEATS times in-process; the best time stands (other work on a shared
machine only slows a run). A question where nothing fits takes longest: the answer then plans what
would make each strategy fit (more GPUs, checkpointing, offload, smaller micro-batches).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import runner  # noqa: E402

REPEATS = 3
GOAL_S = 1.0  # in-process seconds a question
QUESTIONS = [
    "model=llama3.1-8b gpus=8",
    "model=llama3.1-70b gpus=64 seq_len=8192 global_batch_tokens=4M",
    "model=llama3.1-405b gpus=1024 gpu=H100 seq_len=8192",
    "model=llama3.1-405b gpus=8 gpu=H100",
    "model=llama3.1-405b gpus=256 gpu=GB200 seq_len=8192",
    "model=llama3.1-405b gpus=256 gpu=MI300X seq_len=8192",
    "model=deepseek-v3 gpus=256 seq_len=4096",
]


def in_process(question: str, repeats: int = REPEATS) -> float:
    """The best of `repeats` answers to `question`, in seconds, its output discarded."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = runner.main(["plan", *question.split()])
        best = min(best, time.perf_counter() - started)
        if code != 0:
            raise SystemExit(f"plan {question}: exit status {code}")
    return best


def end_to_end(question: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "runner.py"), "plan", *question.split()],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_speed.md"), help="'-': print only")
    args = p.parse_args(argv)
    rows, slow = [], 0
    for question in QUESTIONS:
        seconds = in_process(question)
        slow += seconds > GOAL_S
        rows.append(f"| `{question}` | {seconds:.2f} | {end_to_end(question):.2f} |")
    command = shlex.join(["python", "bench/plan_speed.py", *argv])
    text = "\n".join(
        [
            "# How long plan takes a question",
            "",
            f"`{command}` ({os.cpu_count()} CPUs, in-process: best of {REPEATS} after the imports; end to end: "
            "one `runner.py plan` in a fresh interpreter, imports included)",
            "",
            "| question | in-process s | end to end s |",
            "|---|---:|---:|",
            *rows,
            "",
            f"{len(QUESTIONS) - slow} of {len(QUESTIONS)} questions answered in-process within {GOAL_S:.0f} s.",
            "",
        ]
    )
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
