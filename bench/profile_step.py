#!/usr/bin/env python3
"""What parabench adds to a training step, without a GPU: `runner.py train` and the hand-written
loop for the same backend, each under torch.profiler on the CPU (gloo, world size 2, gpt-nano,
fp32 unless --precision bf16) for a few steady-state steps, compared on the collectives each
step calls and the host time each step spends outside the backend.

    python bench/profile_step.py                              # the default strategies
    python bench/profile_step.py --only zero2,accelerate-zero2

Both sides mark their steps alike (profile_steps= for the runner, --profile-steps for the loops in
bench/handwritten/) and both traces are read by the same function, harness.train.profiling.summarize:
collectives are counted once per call, by kind; host time outside the backend is the step's wall
time less the time in which the step's thread runs a torch operator or a collective is in flight
(see harness/train/profiling.py). accelerate-X is held to native X's hand-written loop. The section,
dated, with the command and versions, is appended to bench/results/profile_cpu.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the checkout's packages come first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.launching import Clock, child_env, failure, launch  # noqa: E402
from bench.runs import ROOT, Run, Settings, hand_command, runner_command, select  # noqa: E402
from harness.train.profiling import summarize  # noqa: E402

DEFAULT = (
    "ddp",
    "accelerate-ddp",
    "fsdp",
    "accelerate-fsdp",
    "zero1",
    "accelerate-zero1",
    "zero2",
    "accelerate-zero2",
    "zero3",
    "accelerate-zero3",
)
RESULTS = ROOT / "bench" / "results" / "profile_cpu.md"
WORLD_SIZE = 2


@dataclass
class Profiled:
    """One side's profile: per-step figures of every rank, or why there are none."""

    steps: list[dict[str, Any]] = field(default_factory=list)  # summarize()'s steps, all ranks
    collectives: dict[str, float] = field(default_factory=dict)  # rank 0, median per step
    error: str = ""

    def median(self, key: str) -> float | None:
        return statistics.median(s[key] for s in self.steps) if self.steps else None


def read_traces(folder: Path, ranks: int) -> Profiled:
    profiled = Profiled()
    for rank in range(ranks):
        trace = folder / f"rank{rank}.trace.json"
        if not trace.is_file():
            return Profiled(error=f"no {trace}")
        summary = summarize(json.loads(trace.read_text()))
        profiled.steps += summary["steps"]
        if rank == 0:
            profiled.collectives = summary["median"].get("collectives", {})
    return profiled


def profile(
    run: Run,
    which: str,
    s: Settings,
    steps: list[int],
    work: Path,
    env: dict[str, str],
    timeout: float,
    runner_args: list[str],
) -> Profiled:
    """One side of `run` under the profiler; its traces read back."""
    folder = work / run.name / which
    if which == "hand":
        cmd = hand_command(run, s, ["--profile-steps", ",".join(map(str, steps)), "--profile-dir", str(folder)])
        traces = folder
    else:
        cmd = runner_command(run, s, folder, [f"profile_steps=[{','.join(map(str, steps))}]", *runner_args])
        traces = folder / "profile"
    print(f"profile_step.py: {run.name} {which}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    done = launch(cmd, work / run.name / f"{which}.log", Clock(None), timeout, env)
    if done.code != 0:
        return Profiled(error=failure(done) or "no exit status")
    return read_traces(traces, s.world_size)


def _collectives(counts: dict[str, float]) -> str:
    return ", ".join(f"{kind} {n:g}" for kind, n in counts.items() if n) or "none"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def table(rows: list[tuple[Run, Profiled, Profiled]]) -> str:
    lines = [
        "| strategy | hand-written loop | collectives per step, parabench | collectives per step, hand-written "
        "| operators per step, parabench / hand-written | step ms, parabench / hand-written "
        "| host ms outside the backend, parabench / hand-written | host ms added by parabench |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, runner, hand in rows:
        if runner.error or hand.error:
            why = "; ".join(
                f"{label} failed: {side.error}"
                for label, side in (("parabench", runner), ("hand-written", hand))
                if side.error
            )
            lines.append(f"| {run.name} | {run.script} {' '.join(run.hand)} | {why.replace('|', '/')} | | | | | |")
            continue
        added = runner.median("host_ms") - hand.median("host_ms")
        lines.append(
            " | ".join(
                [
                    f"| {run.name}",
                    f"{run.script} {' '.join(run.hand)}".strip(),
                    _collectives(runner.collectives),
                    _collectives(hand.collectives),
                    f"{runner.median('operators'):g} / {hand.median('operators'):g}",
                    f"{_ms(runner.median('wall_ms'))} / {_ms(hand.median('wall_ms'))}",
                    f"{_ms(runner.median('host_ms'))} / {_ms(hand.median('host_ms'))}",
                    f"{added:+.2f} |",
                ]
            )
        )
    return "\n".join(lines)


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "deepspeed", "accelerate"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found + [f"python {platform.python_version()}"])


def section(rows: list[tuple[Run, Profiled, Profiled]], s: Settings, steps: list[int], command: str, note: str) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## {now}: per-step profile on the CPU",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), gloo; {versions()}.",
        "",
        f"Settings (both sides): model {s.model}, world size {s.world_size}, micro-batch {s.micro_batch} per rank, "
        f"sequence {s.seq_len}, {s.precision}, AdamW, clipping {s.grad_clip}, OMP_NUM_THREADS=1; steps "
        f"{steps[0]}-{steps[-1]} of {s.steps} under torch.profiler. Collectives: the calls of rank 0 in a step "
        f"(median over the profiled steps), by kind. Operators: the top-level torch operators a step calls. "
        f"Operators, step and host ms: medians over the profiled steps of both "
        f"ranks; host ms outside the backend = the step's wall time less the time in which its thread runs a "
        f"torch operator or a collective is in flight (harness/train/profiling.py).",
    ]
    if note:
        lines += ["", note]
    lines += ["", table(rows), ""]
    return "\n".join(lines) + "\n"


def append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(
            "# What parabench adds to a step, on the CPU\n\n"
            "`bench/profile_step.py`'s output, newest last: `runner.py train` against the hand-written loop of\n"
            "the same backend under torch.profiler (see the script's docstring for what is counted). CPU\n"
            "timings on a shared machine are noisy: compare within a section.\n"
        )
    with path.open("a") as f:
        f.write("\n" + text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(DEFAULT), help=f"comma-separated runs (default {','.join(DEFAULT)})")
    p.add_argument("--steps", type=int, default=16, help="steps per run (default 16)")
    p.add_argument("--profile", type=int, default=8, help="steps profiled, those before the last (default 8)")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per rank and step (default 4)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="both sides' precision (default fp32)")
    p.add_argument(
        "--out",
        default=str(RESULTS),
        help=f"markdown file the section is appended to (default {RESULTS.relative_to(ROOT)}); '-' for none",
    )
    p.add_argument("--work-dir", help="logs, traces and run directories (default runs/profile/<time>)")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds one process may take (default 300)")
    p.add_argument(
        "--runner-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more runner.py option for every parabench side (repeatable), e.g. to try a setting",
    )
    p.add_argument("--note", default="", help="a line added to the section (what changed since the last one)")
    args = p.parse_args(argv)
    if not 0 < args.profile < args.steps - 2:
        p.error(f"--profile={args.profile} must leave at least 3 unprofiled steps of --steps={args.steps}")
    runs = select(args.only)
    s = Settings(
        model="gpt-nano",
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        steps=args.steps,
        warmup=2,
        data_samples=max(args.micro_batch * WORLD_SIZE * args.steps, 64),
        precision=args.precision,
        device="cpu",
        world_size=WORLD_SIZE,
    )
    # The last steps before the last one: the runner's final metrics flush (two all-reduces and a
    # host sync at the last step) is the end of the run, not part of a step.
    steps = list(range(args.steps - args.profile, args.steps))
    work = (
        Path(args.work_dir)
        if args.work_dir
        else ROOT / "runs" / "profile" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    )
    env = child_env(one_thread=True)
    hands: dict[tuple, Profiled] = {}
    rows = []
    for run in runs:
        if run.hand_key not in hands:
            hands[run.hand_key] = profile(run, "hand", s, steps, work, env, args.run_timeout, [])
        rows.append(
            (run, profile(run, "runner", s, steps, work, env, args.run_timeout, args.runner_arg), hands[run.hand_key])
        )
    command = shlex.join(["python", "bench/profile_step.py", *(sys.argv[1:] if argv is None else argv)])
    text = section(rows, s, steps, command, args.note)
    print(text)
    if args.out != "-":
        append(Path(args.out), text)
        print(f"profile_step.py: appended to {args.out}; traces under {work}", file=sys.stderr)
    return 1 if any(r.error or h.error for _, r, h in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
