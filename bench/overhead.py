#!/usr/bin/env python3
"""Framework overhead of parabench (issue 7): `runner.py train` against a hand-written
loop for the same backend, side by side in one run on one machine.

    python bench/overhead.py                      # every default run, on the GPU
    python bench/overhead.py --only single,zero3  # some of them
    python bench/overhead.py --list               # the runs there are
    python bench/overhead.py --dry-run --only single,ddp,fsdp   # tiny model, CPU, fp32: checks the script

For each run it starts the hand-written loop (bench/handwritten/, which imports only
models/ from parabench) and then `runner.py train` with the same model, batch,
precision, optimizer, data and steps, one process at a time, and reads tokens/s
(wall time after warm-up, between two synchronisations), peak allocated memory and
MFU from each. It prints a table of both, with the ratios issue 7 sets goals for
(tokens/s >= 0.97 of hand-written, peak memory <= 1.03), and appends it as a dated
section, with the command, device and versions, to docs/benchmarks.md.

Adding a run (a preset, a fast-path option) is one `Run(...)` line in RUNS.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HAND = ROOT / "bench" / "handwritten"
PRESETS = ROOT / "bench" / "presets"
GIB = 1024 ** 3
GOAL_SPEED, GOAL_MEMORY, GOAL_COMPILE_MFU = 0.97, 1.03, 0.40


@dataclass(frozen=True)
class Run:
    """One line of the table: a runner configuration and the hand-written loop it is held to."""

    name: str
    runner: tuple[str, ...]  # key=value overrides for `runner.py train`
    script: str  # bench/handwritten/<script>
    hand: tuple[str, ...] = ()  # extra arguments of the hand-written loop
    torchrun: bool = True  # the hand-written loop runs under torchrun (world size 1)
    default: bool = True  # in the set run when --only is not given
    group: str = "strategy"  # "strategy" (the overhead goal) or "fast path"
    goal_mfu: float | None = None  # an MFU goal for the parabench side
    note: str = ""


RUNS: list[Run] = [
    # Every strategy, eager: parabench against the same backend written by hand.
    Run("single", ("strategy=single",), "plain.py", torchrun=False),
    Run("ddp", ("strategy=ddp",), "ddp.py"),
    Run("fsdp", ("strategy=fsdp",), "fsdp.py"),
    Run("zero1", ("strategy=zero1",), "zero.py", ("--stage", "1")),
    Run("zero2", ("strategy=zero2",), "zero.py", ("--stage", "2")),
    Run("zero3", ("strategy=zero3",), "zero.py", ("--stage", "3")),
    # Fast-path options parabench has now (configs/schema.py, registered names, deepspeed_config),
    # each against the same option by hand. Cheapest first: if the time budget runs out, the
    # compile runs (about a minute each) are the ones skipped.
    Run("zero3-tuned", ("strategy=zero3", "deepspeed_config=bench/presets/zero3_tuned.json"), "zero.py",
        ("--stage", "3", "--ds-config", "bench/presets/zero3_tuned.json"), group="fast path",
        note="bench/presets/zero3_tuned.json merged over each side's DeepSpeed config"),
    Run("single+ac", ("strategy=single", "activation_checkpointing=true"), "plain.py",
        ("--activation-checkpointing",), torchrun=False, group="fast path"),
    Run("fsdp-grad-op", ("strategy=fsdp-grad-op",), "fsdp.py", ("--no-reshard-after-forward",), group="fast path",
        note="FSDP2 reshard_after_forward=False (gathered parameters kept from forward to backward)"),
    Run("single+compile", ("strategy=single", "compile=true"), "plain.py", ("--compile",), torchrun=False,
        group="fast path", goal_mfu=GOAL_COMPILE_MFU,
        note="both sides compile the whole model, loss included"),
    Run("ddp+compile", ("strategy=ddp", "compile=true"), "ddp.py", ("--compile",), group="fast path",
        goal_mfu=GOAL_COMPILE_MFU,
        note="both sides compile the whole model, then wrap it (nanoGPT's order)"),
    # Not in the default set (they would not fit one 10-minute command with the rest): --only NAME.
    Run("fsdp+compile", ("strategy=fsdp", "compile=true"), "fsdp.py", ("--compile",), group="fast path",
        default=False, note="both sides compile per block before sharding"),
    Run("accelerate-ddp", ("strategy=accelerate-ddp",), "ddp.py", default=False),
    Run("accelerate-fsdp", ("strategy=accelerate-fsdp",), "fsdp.py", default=False),
    Run("accelerate-zero1", ("strategy=accelerate-zero1",), "zero.py", ("--stage", "1"), default=False),
    Run("accelerate-zero2", ("strategy=accelerate-zero2",), "zero.py", ("--stage", "2"), default=False),
    Run("accelerate-zero3", ("strategy=accelerate-zero3",), "zero.py", ("--stage", "3"), default=False),
]
RUN_NAMES = {r.name: r for r in RUNS}


@dataclass
class Settings:
    """What both sides of every run share."""

    model: str
    micro_batch: int
    seq_len: int
    steps: int
    warmup: int
    data_samples: int
    precision: str
    device: str
    lr: float = 1e-3
    min_lr: float = 1e-4
    lr_warmup: int = 2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 1337

    def runner_args(self, out_dir: Path) -> list[str]:
        return [
            f"model={self.model}", f"precision={self.precision}", f"device={self.device}", "nproc=1",
            f"seq_len={self.seq_len}", f"batch_size={self.micro_batch}", f"micro_batch={self.micro_batch}",
            f"steps={self.steps}", f"timing_warmup={self.warmup}", f"data_samples={self.data_samples}",
            f"lr={self.lr}", f"min_lr={self.min_lr}", f"warmup_steps={self.lr_warmup}",
            f"weight_decay={self.weight_decay}", f"beta1={self.beta1}", f"beta2={self.beta2}",
            f"grad_clip={self.grad_clip}", f"seed={self.seed}",
            # One flush at the end of warm-up and one at the last step: no other host sync.
            f"log_every={self.steps + 1000}", f"out_dir={out_dir}",
        ]

    def hand_args(self) -> list[str]:
        return [
            "--model", self.model, "--precision", self.precision, "--device", self.device,
            "--seq-len", str(self.seq_len), "--micro-batch", str(self.micro_batch),
            "--steps", str(self.steps), "--warmup", str(self.warmup), "--data-samples", str(self.data_samples),
            "--lr", str(self.lr), "--min-lr", str(self.min_lr), "--lr-warmup", str(self.lr_warmup),
            "--weight-decay", str(self.weight_decay), "--beta1", str(self.beta1), "--beta2", str(self.beta2),
            "--grad-clip", str(self.grad_clip), "--seed", str(self.seed),
        ]


@dataclass
class Side:
    """One process's outcome: its figures, or why there are none."""

    status: str = "pending"  # ok | failed | skipped
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    wall_s: float = 0.0
    command: str = ""
    log: str = ""

    def get(self, key: str) -> Any:
        return self.figures.get(key) if self.status == "ok" else None


# --------------------------------------------------------------------------- running


class Clock:
    """The whole benchmark's time budget: a process starts only with time left, and is cut at the budget."""

    def __init__(self, budget_s: float | None):
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.elapsed()


def child_env(dry_run: bool) -> dict[str, str]:
    env = dict(os.environ)
    # A launcher's variables in our own environment would make runner.py join that job.
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if dry_run:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _launch(cmd: list[str], log_path: Path, clock: Clock, run_timeout: float, env: dict[str, str]) -> tuple[int | None, str, float, str]:
    """Run `cmd` with stdout+stderr into `log_path`; returns (returncode or None if cut, output, wall s, reason)."""
    left = clock.left()
    if left is not None and left < 20:
        return None, "", 0.0, f"time budget spent ({clock.budget_s:.0f} s)"
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
            _stop(proc)
            return None, log_path.read_text(), time.monotonic() - started, f"cut after {timeout:.0f} s"
        except BaseException:
            _stop(proc)
            raise
    return proc.returncode, log_path.read_text(), time.monotonic() - started, ""


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process we started: SIGTERM (torchrun passes it on to its workers), then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _last_error(output: str) -> str:
    """The line that says what went wrong: the last `SomeError: ...` line, else the last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith("$ ")]
    for line in reversed(lines):
        if re.match(r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b", line) or line.startswith("parabench: error"):
            return line[:200]
    return (lines[-1] if lines else "no output")[:200]


def _parse_hand(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        start = line.find('{"bench"')
        if start >= 0:
            try:
                return json.loads(line[start:])
            except json.JSONDecodeError:
                continue
    return None


def run_hand(run: Run, s: Settings, work: Path, clock: Clock, run_timeout: float, env: dict[str, str]) -> Side:
    script = str(HAND / run.script)
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"] if run.torchrun \
        else [sys.executable]
    cmd = [*prefix, script, *s.hand_args(), *run.hand]
    log = work / run.name / "handwritten.log"
    code, output, wall, cut = _launch(cmd, log, clock, run_timeout, env)
    side = Side(wall_s=wall, command=shlex.join(cmd), log=str(log))
    if code is None and not output:
        side.status, side.reason = "skipped", cut
    elif code != 0 or (figures := _parse_hand(output)) is None:
        side.status = "failed"
        side.reason = cut or (f"exit {code}: {_last_error(output)}" if code else "printed no result line")
    else:
        side.status, side.figures = "ok", figures
    return side


def run_runner(run: Run, s: Settings, work: Path, clock: Clock, run_timeout: float, env: dict[str, str]) -> Side:
    out_dir = work / run.name / "runner"
    cmd = [sys.executable, str(ROOT / "runner.py"), "train", *s.runner_args(out_dir), *run.runner]
    log = work / run.name / "runner.log"
    code, output, wall, cut = _launch(cmd, log, clock, run_timeout, env)
    side = Side(wall_s=wall, command=shlex.join(cmd), log=str(log))
    summary_path = out_dir / "summary.json"
    if code is None and not output:
        side.status, side.reason = "skipped", cut
    elif code != 0 or not summary_path.is_file():
        side.status = "failed"
        side.reason = cut or (f"exit {code}: {_last_error(output)}" if code else "wrote no summary.json")
    else:
        summary = json.loads(summary_path.read_text())
        side.status, side.figures = "ok", {k: summary.get(k) for k in (
            "tokens_per_s", "step_time_s", "mfu", "peak_mem_allocated_bytes", "peak_mem_reserved_bytes",
            "final_loss", "device", "versions", "flops_per_token", "num_params", "steps",
        )}
        if side.figures["tokens_per_s"] is None:
            side.status, side.reason = "failed", "summary.json has no tokens/s (too few steps after warm-up?)"
    return side


def execute(runs: list[Run], s: Settings, work: Path, clock: Clock, run_timeout: float, jobs: int,
            dry_run: bool, progress) -> dict[str, dict[str, Side]]:
    """Both sides of every run; hand-written first, then parabench, one process at a time unless jobs > 1."""
    env = child_env(dry_run)
    results: dict[str, dict[str, Side]] = {r.name: {} for r in runs}
    tasks = [(r, side) for r in runs for side in ("hand", "runner")]
    lock = threading.Lock()

    def do(task: tuple[Run, str]) -> None:
        run, which = task
        fn = run_hand if which == "hand" else run_runner
        side = fn(run, s, work, clock, run_timeout, env)
        with lock:
            results[run.name][which] = side
            progress(run, which, side, clock)

    if jobs <= 1:
        for task in tasks:
            do(task)
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(do, tasks))
    return results


# --------------------------------------------------------------------------- reporting


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "tok":
        return f"{value:,.0f}"
    if kind == "gib":
        return f"{value / GIB:.2f}"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "loss":
        return f"{value:.4f}"
    return str(value)


def verdict(run: Run, hand: Side, runner: Side, judged: bool) -> str:
    for label, side in (("hand-written", hand), ("parabench", runner)):
        if side.status != "ok":
            return f"{label} {side.status}: {side.reason}".replace("|", "/")
    if not judged:
        return "dry run: not judged"
    problems = []
    speed = _ratio(runner.get("tokens_per_s"), hand.get("tokens_per_s"))
    memory = _ratio(runner.get("peak_mem_allocated_bytes"), hand.get("peak_mem_allocated_bytes"))
    if speed is not None and speed < GOAL_SPEED:
        problems.append(f"slower ({speed:.3f} < {GOAL_SPEED})")
    if memory is not None and memory > GOAL_MEMORY:
        problems.append(f"more memory ({memory:.3f} > {GOAL_MEMORY})")
    mfu = runner.get("mfu")
    if run.goal_mfu is not None and mfu is not None and mfu < run.goal_mfu:
        problems.append(f"MFU {mfu:.1%} < {run.goal_mfu:.0%}")
    return "; ".join(problems) or "meets the goals"


HEADER = ("| run | tok/s parabench | tok/s hand-written | speed ratio (goal >= 0.97) | peak GiB parabench | "
          "peak GiB hand-written | memory ratio (goal <= 1.03) | MFU parabench | MFU hand-written | "
          "final loss parabench / hand-written | verdict |")


def table(runs: list[Run], results: dict[str, dict[str, Side]], judged: bool) -> str:
    lines = [HEADER, "|" + "---|" * HEADER.count(" |")]
    for run in runs:
        hand, runner = results[run.name]["hand"], results[run.name]["runner"]
        lines.append("| " + " | ".join([
            run.name,
            _fmt(runner.get("tokens_per_s"), "tok"),
            _fmt(hand.get("tokens_per_s"), "tok"),
            _fmt(_ratio(runner.get("tokens_per_s"), hand.get("tokens_per_s")), "ratio"),
            _fmt(runner.get("peak_mem_allocated_bytes"), "gib"),
            _fmt(hand.get("peak_mem_allocated_bytes"), "gib"),
            _fmt(_ratio(runner.get("peak_mem_allocated_bytes"), hand.get("peak_mem_allocated_bytes")), "ratio"),
            _fmt(runner.get("mfu"), "pct"),
            _fmt(hand.get("mfu"), "pct"),
            f"{_fmt(runner.get('final_loss'), 'loss')} / {_fmt(hand.get('final_loss'), 'loss')}",
            verdict(run, hand, runner, judged),
        ]) + " |")
    return "\n".join(lines)


def _tok(results, name: str, which: str) -> float | None:
    side = results.get(name, {}).get(which)
    return side.get("tokens_per_s") if side else None


def findings(runs: list[Run], results: dict[str, dict[str, Side]]) -> list[str]:
    """Derived lines: what each fast-path option does, and how far tuning moves ZeRO-3 towards ZeRO-2."""
    out: list[str] = []
    names = {r.name for r in runs}
    for which, label in (("runner", "parabench"), ("hand", "hand-written")):
        z2, z3, z3t = (_tok(results, n, which) for n in ("zero2", "zero3", "zero3-tuned"))
        if {"zero2", "zero3", "zero3-tuned"} <= names and z2 and z3 and z3t:
            closed = (f"tuning closes {(z3t - z3) / (z2 - z3):.0%} of it" if z2 > z3
                      else "untuned ZeRO-3 is not slower than ZeRO-2 here: no gap to close")
            out.append(f"ZeRO-3 tuned vs untuned ({label}): {z3t:,.0f} vs {z3:,.0f} tok/s, ZeRO-2 {z2:,.0f}; "
                       f"gap to ZeRO-2 {1 - z3 / z2:.1%} untuned, {1 - z3t / z2:.1%} tuned ({closed})")
    for fast, base in (("single+compile", "single"), ("ddp+compile", "ddp"), ("single+ac", "single"),
                       ("fsdp-grad-op", "fsdp"), ("fsdp+compile", "fsdp")):
        if {fast, base} <= names:
            a, b = _tok(results, fast, "runner"), _tok(results, base, "runner")
            ma = results[fast]["runner"].get("peak_mem_allocated_bytes")
            mb = results[base]["runner"].get("peak_mem_allocated_bytes")
            if a and b:
                mem = f", peak memory {ma / GIB:.2f} vs {mb / GIB:.2f} GiB" if ma and mb else ""
                out.append(f"{fast} against {base} (parabench): {a / b:.2f}x tokens/s{mem}")
    return out


def device_facts(results: dict[str, dict[str, Side]]) -> dict[str, str]:
    facts: dict[str, str] = {"python": platform.python_version()}
    for sides in results.values():
        for side in sides.values():
            if side.status != "ok":
                continue
            facts.setdefault("device", side.figures.get("device") or "")
            for name, version in (side.figures.get("versions") or {}).items():
                if version:
                    facts.setdefault(name, version)
            if side.figures.get("torch"):
                facts.setdefault("torch", side.figures["torch"])
            if side.figures.get("deepspeed"):
                facts.setdefault("deepspeed", side.figures["deepspeed"])
    for name in ("torch", "deepspeed", "accelerate"):
        if name not in facts:
            try:
                from importlib.metadata import version

                facts[name] = version(name)
            except Exception:
                facts[name] = "not installed"
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            if smi.returncode == 0 and smi.stdout.strip():
                facts["nvidia-smi"] = smi.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


def section(runs: list[Run], results, s: Settings, command: str, facts: dict[str, str], dry_run: bool,
            elapsed: float, note: str) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"## {now}: framework overhead on {facts.get('device') or 'unknown device'}"
    if dry_run:
        title += " (dry run: tiny model on the CPU, checks the script, measures nothing)"
    versions = ", ".join(f"{k} {facts[k]}" for k in ("torch", "deepspeed", "accelerate", "python") if k in facts)
    lines = [
        title, "",
        f"Command: `{command}`", "",
        f"Device: {facts.get('device') or 'unknown'}"
        + (f" (nvidia-smi: {facts['nvidia-smi']})" if "nvidia-smi" in facts else "") + f"; {versions}.", "",
        f"Settings (both sides): model {s.model}, micro-batch {s.micro_batch} = global batch, world size 1, "
        f"sequence {s.seq_len}, {s.precision}, AdamW (lr {s.lr}, betas {s.beta1}/{s.beta2}, weight decay "
        f"{s.weight_decay} on matrices), clipping {s.grad_clip}, {s.steps} steps of which the first {s.warmup} "
        f"are left out of tokens/s; same seed, same synthetic data in the same order. Peak memory is "
        f"torch.cuda.max_memory_allocated of the process; MFU = tokens/s x (6N + 12LHQT) / peak bf16 FLOP/s "
        f"(989e12 on H100 SXM). Whole benchmark: {elapsed:.0f} s.",
    ]
    if note:
        lines += ["", note]
    lines += ["", table(runs, results, judged=not dry_run), ""]
    notes = [f"{r.name}: {r.note}" for r in runs if r.note]
    derived = findings(runs, results)
    if derived or notes:
        lines += [*(f"- {line}" for line in derived + notes), ""]
    return "\n".join(lines) + "\n"


def append_section(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or not path.read_text().strip():
        path.write_text(
            "# Benchmarks\n\n"
            "Figures measured on real devices, each section with the command that made it. Compare\n"
            "figures only within one section: absolute numbers drift between machines and runs.\n\n"
        )
    with path.open("a") as f:
        f.write("\n" + text)


def to_json(runs: list[Run], results, s: Settings, facts: dict[str, str]) -> dict[str, Any]:
    return {
        "settings": s.__dict__,
        "facts": facts,
        "runs": {r.name: {which: side.__dict__ for which, side in results[r.name].items()} for r in runs},
    }


# --------------------------------------------------------------------------- command line


def select(only: str | None) -> list[Run]:
    if not only:
        return [r for r in RUNS if r.default]
    if only == "all":
        return list(RUNS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUN_NAMES]
    if unknown:
        raise SystemExit(f"overhead.py: unknown run {', '.join(unknown)}: the runs are {', '.join(RUN_NAMES)} (or all)")
    return [RUN_NAMES[n] for n in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated runs (see --list), or all; default: every default run")
    p.add_argument("--list", action="store_true", help="print the runs and exit")
    p.add_argument("--dry-run", action="store_true", help="tiny model on the CPU in fp32, few steps: checks the script")
    p.add_argument("--model", help="model preset (default gpt2-124m; gpt-nano for --dry-run)")
    p.add_argument("--steps", type=int, help="steps per run (default 40; 4 for --dry-run)")
    p.add_argument("--warmup", type=int, help="steps left out of tokens/s (default 8; 1 for --dry-run)")
    p.add_argument("--micro-batch", type=int, help="sequences per step (default 16; 8 for --dry-run)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 1024; 32 for --dry-run)")
    p.add_argument("--out", help="markdown file the dated section is appended to (default docs/benchmarks.md; "
                                 "none for --dry-run); '-' for none")
    p.add_argument("--json", help="raw results as JSON (default <work-dir>/results.json)")
    p.add_argument("--work-dir", help="logs and run directories (default runs/bench/<time>)")
    p.add_argument("--time-budget", type=float, help="seconds for the whole benchmark; runs that would start "
                                                     "later are skipped (default 520; none for --dry-run)")
    p.add_argument("--run-timeout", type=float, default=360.0, help="seconds one process may take (default 360)")
    p.add_argument("--jobs", type=int, default=1, help="processes at a time; only for --dry-run, timings need 1")
    p.add_argument("--note", default="", help="a line added to the section (what was installed, how)")
    args = p.parse_args(argv)
    if args.jobs > 1 and not args.dry_run:
        p.error("--jobs > 1 runs processes side by side on one GPU and spoils the timings: only with --dry-run")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for r in RUNS:
            flags = "" if r.default else "  (not in the default set)"
            print(f"{r.name:18} {r.group:10} runner.py train {' '.join(r.runner)} | "
                  f"handwritten/{r.script} {' '.join(r.hand)}{flags}")
        return 0
    runs = select(args.only)
    s = settings_from(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = Path(args.work_dir) if args.work_dir else ROOT / "runs" / "bench" / stamp
    work.mkdir(parents=True, exist_ok=True)
    budget = args.time_budget if args.time_budget is not None else (None if args.dry_run else 520.0)
    clock = Clock(budget if budget and budget > 0 else None)
    command = shlex.join(["python", "bench/overhead.py", *(sys.argv[1:] if argv is None else argv)])

    def progress(run: Run, which: str, side: Side, clock: Clock) -> None:
        label = "hand-written" if which == "hand" else "parabench"
        if side.status == "ok":
            tok, mem = side.get("tokens_per_s"), side.get("peak_mem_allocated_bytes")
            what = f"{tok:,.0f} tok/s" + (f", peak {mem / GIB:.2f} GiB" if mem else "")
        else:
            what = f"{side.status}: {side.reason} (log {side.log})"
        print(f"[{clock.elapsed():5.0f} s] {run.name:16} {label:12} {what} ({side.wall_s:.0f} s)",
              file=sys.stderr, flush=True)

    print(f"overhead.py: {len(runs)} runs x 2 processes, work dir {work}", file=sys.stderr, flush=True)
    results = execute(runs, s, work, clock, args.run_timeout, args.jobs, args.dry_run, progress)
    facts = device_facts(results)
    text = section(runs, results, s, command, facts, args.dry_run, clock.elapsed(), args.note)
    print(text)
    json_path = Path(args.json) if args.json else work / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(to_json(runs, results, s, facts), indent=2, default=str) + "\n")
    out = args.out if args.out is not None else (None if args.dry_run else str(ROOT / "docs" / "benchmarks.md"))
    if out and out != "-":
        append_section(Path(out), text)
        print(f"overhead.py: appended to {out}; raw results in {json_path}", file=sys.stderr)
    failed = [r.name for r in runs if any(side.status == "failed" for side in results[r.name].values())]
    if failed:
        print(f"overhead.py: failed: {', '.join(failed)} (logs under {work})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
