#!/usr/bin/env python3
"""Framework overhead of parabench: `runner.py train` against a hand-written loop for the same
backend, side by side in one benchmark on one machine.

    python bench/overhead.py --group torch        # one named group (groups: --list)
    python bench/overhead.py --repeat 2           # every default run, each side twice, interleaved
    python bench/overhead.py --only single,zero3  # some runs (or all)
    python bench/overhead.py --list               # the runs and groups there are
    python bench/overhead.py --dry-run --only single,ddp,fsdp   # tiny model, CPU, fp32: checks the script

For each run it starts the hand-written loop (bench/handwritten/, which imports only models/
from parabench) and then `runner.py train` with the same model, batch, precision, optimizer,
data and steps, one process at a time, and reads tokens/s (wall time after warm-up, between two
synchronisations), peak allocated memory and MFU from each. Runs that share a hand-written
command (accelerate-X and native X) share its processes. With --repeat N the whole sequence runs
N times and each figure is the median, with the spread of tokens/s beside it. It prints a table
with the ratios the goals are set on (tokens/s >= 0.97 of hand-written, peak memory <= 1.03,
accelerate-X >= 0.97 of native X) and appends it as a dated section, with the command, device
and versions, to docs/benchmarks.md.

Adding a run (a preset, a fast-path option) is one `Run(...)` line in bench/runs.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: the checkout's packages come first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.launching import Clock, child_env, failure, launch, parse_hand  # noqa: E402
from bench.overhead_table import GIB, Results, Side, append_section, device_facts, section, to_json  # noqa: E402
from bench.runs import GROUPS, ROOT, RUNS, Run, Settings, hand_command, runner_command, select  # noqa: E402

RUNNER_FIGURES = (
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "peak_mem_allocated_bytes",
    "peak_mem_reserved_bytes",
    "final_loss",
    "device",
    "versions",
    "flops_per_token",
    "num_params",
    "steps",
)


def run_hand(run: Run, s: Settings, log: Path, clock: Clock, run_timeout: float, env: dict[str, str]) -> Side:
    cmd = hand_command(run, s)
    done = launch(cmd, log, clock, run_timeout, env)
    side = Side(wall_s=done.wall_s, command=shlex.join(cmd), log=str(log))
    if done.code is None and not done.output:
        side.status, side.reason = "skipped", done.reason
    elif done.code != 0 or (figures := parse_hand(done.output)) is None:
        side.status, side.reason = "failed", failure(done) or "printed no result line"
    else:
        side.status, side.figures = "ok", figures
    return side


def run_runner(run: Run, s: Settings, log: Path, clock: Clock, run_timeout: float, env: dict[str, str]) -> Side:
    out_dir = log.with_suffix("")  # runner-r1.log -> runner-r1/
    cmd = runner_command(run, s, out_dir)
    done = launch(cmd, log, clock, run_timeout, env)
    side = Side(wall_s=done.wall_s, command=shlex.join(cmd), log=str(log))
    summary_path = out_dir / "summary.json"
    if done.code is None and not done.output:
        side.status, side.reason = "skipped", done.reason
    elif done.code != 0 or not summary_path.is_file():
        side.status, side.reason = "failed", failure(done) or "wrote no summary.json"
    else:
        summary = json.loads(summary_path.read_text())
        side.status, side.figures = "ok", {k: summary.get(k) for k in RUNNER_FIGURES}
        if side.figures["tokens_per_s"] is None:
            side.status, side.reason = "failed", "summary.json has no tokens/s (too few steps after warm-up?)"
    return side


Progress = Callable[[str, str, Side, Clock], None]


def plan(runs: list[Run], repeat: int) -> list[tuple[str, Run, int]]:
    """The processes in order: for each repeat, run after run, its hand-written loop (unless a run
    before it in this repeat already ran the same command) then parabench."""
    tasks: list[tuple[str, Run, int]] = []
    for r in range(1, repeat + 1):
        started: set[tuple] = set()
        for run in runs:
            if run.hand_key not in started:
                started.add(run.hand_key)
                tasks.append(("hand", run, r))
            tasks.append(("runner", run, r))
    return tasks


def execute(
    runs: list[Run],
    s: Settings,
    work: Path,
    clock: Clock,
    run_timeout: float,
    jobs: int,
    repeat: int,
    one_thread: bool,
    progress: Progress,
) -> Results:
    """Every process of plan(); one at a time unless jobs > 1. Runs sharing a hand-written command
    share its list of outcomes (the same list object)."""
    env = child_env(one_thread)
    results: Results = {}
    hand_lists: dict[tuple, list[Side]] = {}
    for run in runs:
        results[run.name] = {"hand": hand_lists.setdefault(run.hand_key, []), "runner": []}
    lock = threading.Lock()

    def do(task: tuple[str, Run, int]) -> None:
        which, run, r = task
        if which == "hand":
            side = run_hand(run, s, work / run.name / f"handwritten-r{r}.log", clock, run_timeout, env)
        else:
            side = run_runner(run, s, work / run.name / f"runner-r{r}.log", clock, run_timeout, env)
        with lock:
            results[run.name][which].append(side)
            progress(run.name, "hand-written" if which == "hand" else "parabench", side, clock)

    tasks = plan(runs, repeat)
    if jobs <= 1:
        for task in tasks:
            do(task)
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(do, tasks))
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", help="comma-separated runs (see --list), or all; default: every group's runs")
    p.add_argument("--group", help=f"one named group, a few minutes on a GPU: {', '.join(GROUPS)}")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole sequence N times, interleaved; report medians and the spread (default 1)",
    )
    p.add_argument("--list", action="store_true", help="print the runs and groups and exit")
    p.add_argument("--dry-run", action="store_true", help="tiny model on the CPU in fp32, few steps: checks the script")
    p.add_argument("--model", help="model preset (default gpt2-124m; gpt-nano for --dry-run)")
    p.add_argument("--steps", type=int, help="steps per run (default 40; 4 for --dry-run)")
    p.add_argument("--warmup", type=int, help="steps left out of tokens/s (default 8; 1 for --dry-run)")
    p.add_argument("--micro-batch", type=int, help="sequences per step (default 16; 8 for --dry-run)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 1024; 32 for --dry-run)")
    p.add_argument(
        "--out",
        help="markdown file the dated section is appended to (default docs/benchmarks.md; "
        "none for --dry-run); '-' for none",
    )
    p.add_argument("--json", help="raw results as JSON (default <work-dir>/results.json)")
    p.add_argument("--work-dir", help="logs and run directories (default runs/bench/<time>)")
    p.add_argument(
        "--time-budget",
        type=float,
        help="seconds for the whole benchmark; runs that would start "
        "later are skipped (default 520; none for --dry-run)",
    )
    p.add_argument("--run-timeout", type=float, default=360.0, help="seconds one process may take (default 360)")
    p.add_argument("--jobs", type=int, default=1, help="processes at a time; only for --dry-run, timings need 1")
    p.add_argument("--note", default="", help="a line added to the section (what was installed, how)")
    args = p.parse_args(argv)
    if args.jobs > 1 and not args.dry_run:
        p.error("--jobs > 1 runs processes side by side on one GPU and spoils the timings: only with --dry-run")
    if args.repeat < 1:
        p.error(f"--repeat={args.repeat} must be at least 1")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    tiny = args.dry_run
    steps = args.steps or (4 if tiny else 40)
    warmup = args.warmup if args.warmup is not None else (1 if tiny else 8)
    if not 0 < warmup < steps:
        raise SystemExit(f"overhead.py: --warmup={warmup} must be above 0 and below --steps={steps}")
    micro = args.micro_batch or (8 if tiny else 16)
    return Settings(
        model=args.model or ("gpt-nano" if tiny else "gpt2-124m"),
        micro_batch=micro,
        seq_len=args.seq_len or (32 if tiny else 1024),
        steps=steps,
        warmup=warmup,
        # Enough sequences for every step to see new ones (no epoch boundary), and no more:
        # both sides build the synthetic set at start-up.
        data_samples=max(micro * steps, 64),
        precision="fp32" if tiny else "bf16",
        device="cpu" if tiny else "cuda",
    )


def print_list() -> None:
    grouped = {name: group for group, names in GROUPS.items() for name in names}
    for r in RUNS:
        print(
            f"{r.name:18} {grouped.get(r.name, '(--only)'):9} {r.kind:10} runner.py train {' '.join(r.runner)} | "
            f"handwritten/{r.script} {' '.join(r.hand)}" + (f" | held to {r.native}" if r.native else "")
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print_list()
        return 0
    runs = select(args.only, args.group)
    s = settings_from(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = Path(args.work_dir) if args.work_dir else ROOT / "runs" / "bench" / stamp
    work.mkdir(parents=True, exist_ok=True)
    budget = args.time_budget if args.time_budget is not None else (None if args.dry_run else 520.0)
    clock = Clock(budget if budget and budget > 0 else None)
    command = shlex.join(["python", "bench/overhead.py", *(sys.argv[1:] if argv is None else argv)])

    def progress(name: str, label: str, side: Side, clock: Clock) -> None:
        if side.status == "ok":
            tok, mem = side.get("tokens_per_s"), side.get("peak_mem_allocated_bytes")
            what = f"{tok:,.0f} tok/s" + (f", peak {mem / GIB:.2f} GiB" if mem else "")
        else:
            what = f"{side.status}: {side.reason} (log {side.log})"
        print(
            f"[{clock.elapsed():5.0f} s] {name:16} {label:12} {what} ({side.wall_s:.0f} s)", file=sys.stderr, flush=True
        )

    processes = len(plan(runs, args.repeat))
    print(f"overhead.py: {len(runs)} runs, {processes} processes, work dir {work}", file=sys.stderr, flush=True)
    results = execute(runs, s, work, clock, args.run_timeout, args.jobs, args.repeat, args.dry_run, progress)
    facts = device_facts(results)
    text = section(runs, results, s, command, facts, args.dry_run, clock.elapsed(), args.repeat, args.note)
    print(text)
    json_path = Path(args.json) if args.json else work / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(to_json(runs, results, s, facts), indent=2, default=str) + "\n")
    out = args.out if args.out is not None else (None if args.dry_run else str(ROOT / "docs" / "benchmarks.md"))
    if out and out != "-":
        append_section(Path(out), text)
        print(f"overhead.py: appended to {out}; raw results in {json_path}", file=sys.stderr)
    failed = [
        r.name for r in runs if any(side.status == "failed" for sides in results[r.name].values() for side in sides)
    ]
    if failed:
        print(f"overhead.py: failed: {', '.join(failed)} (logs under {work})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
