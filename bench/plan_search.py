#!/usr/bin/env python3
"""How fast the layout search plans: Llama 3.1 70B on 256 H100s (32 nodes of 8), every layout the
registered strategies allow, timed in-process (after imports and the model's shape) and end to end
as `runner.py plan search=true` runs it (a fresh interpreter, imports included).

    python bench/plan_search.py              # written to bench/results/plan_search.md
    python bench/plan_search.py --out -      # printed only

Two questions: Llama 3's own (4M tokens of 8192), and 16M tokens of 1024, whose larger per-rank
share gives each layout more micro-batch splits (over 1,000 layouts). Each is searched REPEATS times;
the best time stands (other work on a shared machine only slows a run).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.plan.plan_cli import PlanConfig, strategy_names  # noqa: E402
from harness.plan.search.layout_search import search  # noqa: E402
from harness.plan.search.search_cli import search_question  # noqa: E402

REPEATS = 3
QUESTIONS = [
    {"model": "llama3.1-70b", "gpus": 256, "seq_len": 8192, "global_batch_tokens": "4M"},
    {"model": "llama3.1-70b", "gpus": 256, "seq_len": 1024, "global_batch_tokens": "16M"},
]


def _timed(options: dict) -> tuple[int, int, float, str]:
    """(layouts planned, layouts that fit, best seconds, the winner)."""
    cfg = PlanConfig(**options, search=True)
    q, global_batch = search_question(cfg)
    names = strategy_names(cfg, q.gpus)
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = search(q, names, global_batch)
        best = min(best, time.perf_counter() - started)
    return result.planned, len(result.ranked), best, result.ranked[0].arguments() if result.ranked else "nothing fits"


def _end_to_end(options: dict) -> float:
    args = [f"{k}={v}" for k, v in options.items()]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "runner.py"), "plan", "search=true", *args],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_search.md"), help="'-': print only")
    args = p.parse_args(argv)
    rows = []
    for options in QUESTIONS:
        planned, fit, seconds, winner = _timed(options)
        question = " ".join(f"{k}={v}" for k, v in options.items())
        rows.append(
            f"| `{question}` | {planned:,} | {fit:,} | {seconds:.2f} | {planned / seconds:,.0f} | "
            f"{_end_to_end(options):.2f} | `{winner}` |"
        )
    command = shlex.join(["python", "bench/plan_search.py", *argv])
    text = "\n".join(
        [
            "# The layout search's speed",
            "",
            f"`{command}` ({os.cpu_count()} CPUs, best of {REPEATS}; end to end: one `runner.py plan "
            "search=true` in a fresh interpreter, imports included)",
            "",
            "| question | layouts planned | fit | search s | layouts/s | end to end s | fastest that fits |",
            "|---|---:|---:|---:|---:|---:|---|",
            *rows,
            "",
        ]
    )
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
