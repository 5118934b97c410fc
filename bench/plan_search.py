#!/usr/bin/env python3
"""How fast the planner answers: a plain `plan` on the questions the docs ask, and the layout search
on Llama 3.1 70B over 256 H100s (32 nodes of 8), every layout the registered strategies allow. Each
is timed in-process (after the imports, as a caller that asks several pays) and end to end (a fresh
interpreter, imports included, as one `runner.py plan` on the command line pays).

    python bench/plan_search.py              # written to bench/results/plan_search.md
    python bench/plan_search.py --out -      # printed only

A plain question where nothing fits takes longest: its answer plans what would make each strategy
fit (more GPUs, checkpointing, offload, smaller micro-batches), and where none of those does, which
layouts of any strategy would (the search's, on up to 64 GPUs for the 405B at 128K tokens). The
search's two questions are Llama 3's own (4M tokens of 8192) and 16M tokens of 1024, whose larger
per-rank share gives each layout more micro-batch splits. Everything runs REPEATS times in-process;
the best time stands (other work on a shared machine only slows a run).
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
from harness.plan.plan_cli import PlanConfig, strategy_names  # noqa: E402
from harness.plan.search.layout_search import search  # noqa: E402
from harness.plan.search.search_cli import search_question  # noqa: E402

REPEATS = 3
PLAIN_GOAL_S = 1.0  # in-process seconds a plain question
PLAIN = [
    "model=llama3.1-8b gpus=8",
    "model=llama3.1-70b gpus=64 seq_len=8192 global_batch_tokens=4M",
    "model=llama3.1-405b gpus=1024 gpu=H100 seq_len=8192",
    "model=llama3.1-405b gpus=8 gpu=H100",
    "model=llama3.1-405b gpus=8 seq_len=131072",
    "model=llama3.1-405b gpus=256 gpu=GB200 seq_len=8192",
    "model=llama3.1-405b gpus=256 gpu=MI300X seq_len=8192",
    "model=deepseek-v3 gpus=256 seq_len=4096",
]
SEARCHED = [
    {"model": "llama3.1-70b", "gpus": 256, "seq_len": 8192, "global_batch_tokens": "4M"},
    {"model": "llama3.1-70b", "gpus": 256, "seq_len": 1024, "global_batch_tokens": "16M"},
]


def in_process(question: str, repeats: int = REPEATS) -> float:
    """The best of `repeats` plain answers to `question`, in seconds, its output discarded."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = runner.main(["plan", *question.split()])
        best = min(best, time.perf_counter() - started)
        if code != 0:
            raise SystemExit(f"plan {question}: exit status {code}")
    return best


def searched(options: dict) -> tuple[int, int, float, str]:
    """(layouts planned, layouts that fit, best seconds, the winner) of one search."""
    cfg = PlanConfig(**options, search=True)
    q, global_batch = search_question(cfg)
    names = strategy_names(cfg, q.gpus)
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = search(q, names, global_batch)
        best = min(best, time.perf_counter() - started)
    return result.planned, len(result.ranked), best, result.ranked[0].arguments() if result.ranked else "nothing fits"


def end_to_end(args: list[str]) -> float:
    """Seconds one `runner.py plan <args>` takes in a fresh interpreter, imports included."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "runner.py"), "plan", *args],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    return time.perf_counter() - started


def plain_lines() -> list[str]:
    rows, within = [], 0
    for question in PLAIN:
        seconds = in_process(question)
        within += seconds <= PLAIN_GOAL_S
        rows.append(f"| `{question}` | {seconds:.2f} | {end_to_end(question.split()):.2f} |")
    return [
        "## A plain plan",
        "",
        "| question | in-process s | end to end s |",
        "|---|---:|---:|",
        *rows,
        "",
        f"{within} of {len(PLAIN)} questions answered in-process within {PLAIN_GOAL_S:.0f} s.",
        "",
    ]


def search_lines() -> list[str]:
    rows = []
    for options in SEARCHED:
        planned, fit, seconds, winner = searched(options)
        args = [f"{k}={v}" for k, v in options.items()]
        rows.append(
            f"| `{' '.join(args)}` | {planned:,} | {fit:,} | {seconds:.2f} | {planned / seconds:,.0f} | "
            f"{end_to_end(['search=true', *args]):.2f} | `{winner}` |"
        )
    return [
        "## The layout search",
        "",
        "| question | layouts planned | fit | search s | layouts/s | end to end s | fastest that fits |",
        "|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_search.md"), help="'-': print only")
    args = p.parse_args(argv)
    command = shlex.join(["python", "bench/plan_search.py", *argv])
    text = "\n".join(
        [
            "# How fast the planner answers",
            "",
            f"`{command}` ({os.cpu_count()} CPUs; in-process: best of {REPEATS} after the imports; end to end: one "
            "`runner.py plan` in a fresh interpreter, imports included)",
            "",
            *plain_lines(),
            *search_lines(),
        ]
    )
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
