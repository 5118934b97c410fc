#!/usr/bin/env python3
"""Predicted against measured peak allocated GPU memory: `runner.py train` for
every strategy at world size 1, bf16, two micro-batch sizes, gpt2-124m and gpt2-350m, and
the plan's prediction each run records in its summary.json beside what it measured.

    python bench/plan_vs_measured.py                                  # the whole table (GPU)
    python bench/plan_vs_measured.py --models gpt2-124m --strategies single,ddp,zero3
    python bench/plan_vs_measured.py --dry-run                         # tiny model on the CPU: checks the script

Prints a table of predicted, measured and the error (the goal: within 10%), and appends
it as a dated section, with the command, device and versions, to bench/results/plan_vs_measured.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness.common.units import GIB  # noqa: E402
from harness.compare.compare_cli import predicted  # noqa: E402

GOAL = 0.10  # |predicted / measured - 1|


def strategies_here(device: str) -> list[str]:
    from strategies.registry import default_registry

    return [e.name for e in default_registry().entries() if e.available and e.unsupported_reason(device) is None]


def train(model: str, micro_batch: int, strategy: str, args: argparse.Namespace, out_dir: Path) -> dict:
    """One world-size-1 run; its summary (or the error) as a dict."""
    overrides = [
        f"strategy={strategy}",
        f"model={model}",
        f"precision={args.precision}",
        f"seq_len={args.seq_len}",
        f"micro_batch={micro_batch}",
        f"batch_size={micro_batch}",
        f"steps={args.steps}",
        f"log_every={args.steps}",
        "timing_warmup=1",
        f"data_samples={max(64, micro_batch * args.steps)}",
        f"device={args.device}",
        "nproc=1",
        f"out_dir={out_dir}",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "runner.py"), "train", *overrides],
        capture_output=True,
        text=True,
        timeout=args.timeout,
        env=env,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        return {"failed": (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]}
    summary = json.loads((out_dir / "summary.json").read_text())
    summary["prediction"] = predicted(out_dir)  # what `runner.py plan` says of the same run
    return summary


def row(model: str, micro_batch: int, strategy: str, summary: dict) -> dict:
    if "failed" in summary:
        return {"model": model, "micro_batch": micro_batch, "strategy": strategy, "failed": summary["failed"]}
    predicted = summary["prediction"]["peak_mem_allocated_bytes"]
    measured = summary["peak_mem_allocated_bytes"]
    error = predicted / measured - 1 if predicted and measured else None
    return {
        "model": model,
        "micro_batch": micro_batch,
        "strategy": strategy,
        "predicted": predicted,
        "measured": measured,
        "error": error,
        "device": summary["device"],
        "versions": summary["versions"],
    }


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | micro-batch | strategy | predicted GiB | measured GiB | error | within 10% |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['model']} | {r['micro_batch']} | {r['strategy']} | - | - | - | failed: {r['failed']} |")
            continue
        err = r["error"]
        verdict = "-" if err is None else ("yes" if abs(err) <= GOAL else "NO")
        lines.append(
            f"| {r['model']} | {r['micro_batch']} | {r['strategy']} | {_gib(r['predicted'])} | "
            f"{_gib(r['measured'])} | {'-' if err is None else f'{err:+.1%}'} | {verdict} |"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2-124m,gpt2-350m")
    p.add_argument("--micro-batches", default="4,8")
    p.add_argument("--strategies", help="comma-separated (default: every strategy that runs on the device)")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=4, help="steps per run; the peak is reached by the second")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="gpt-nano on the CPU in fp32: checks the script only (prints, appends nothing)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_vs_measured.md"))
    args = p.parse_args()
    args.device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        args.models, args.micro_batches, args.precision, args.seq_len, args.steps = "gpt-nano", "2,4", "fp32", 32, 2
    strategies = args.strategies.split(",") if args.strategies else strategies_here(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for micro_batch in map(int, args.micro_batches.split(",")):
                for strategy in strategies:
                    out_dir = Path(tmp) / f"{model}-{micro_batch}-{strategy}"
                    r = row(model, micro_batch, strategy, train(model, micro_batch, strategy, args, out_dir))
                    rows.append(r)
                    print("\n".join(table([r])[2:]), flush=True)
    lines = table(rows)
    print("\n".join(lines))
    failed = any("failed" in r for r in rows)
    if args.dry_run:
        return int(failed)
    done = [r for r in rows if "versions" in r]
    facts = f"device {done[0]['device']}, versions {done[0]['versions']}" if done else "no run finished"
    title = f"## {dt.datetime.now():%Y-%m-%d %H:%M}"
    command = "python bench/plan_vs_measured.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    section = [
        title,
        "",
        f"`{command.strip()}` | {args.precision}, seq {args.seq_len}, world size 1 | {facts}",
        "",
        *lines,
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        if out.stat().st_size == 0:
            f.write(
                "# Predicted against measured peak allocated memory\n\n"
                "Written by bench/plan_vs_measured.py; the prediction is what `runner.py plan` computes "
                "(harness/plan/), recorded in each run's summary.json.\n\n"
            )
        f.write("\n".join(section) + "\n")
    print(f"appended to {out}")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
