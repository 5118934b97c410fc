"""bench/overhead.py's report: each side's figures over its repeats (median and spread), the
verdict against the goals, the markdown table and the dated section for docs/benchmarks.md."""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.runs import Run, Settings
from harness.common.units import GIB  # noqa: E402

GOAL_SPEED, GOAL_MEMORY = 0.97, 1.03


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


class Measured:
    """One side of a run over its repeats: the median of each figure over the processes that
    finished, and how far tokens/s spread."""

    def __init__(self, sides: list[Side]):
        self.sides = sides
        self.ok = [s for s in sides if s.status == "ok"]

    @property
    def status(self) -> str:
        if self.ok:
            return "ok"
        return next(
            (s.status for s in self.sides if s.status == "failed"), self.sides[0].status if self.sides else "skipped"
        )

    @property
    def reason(self) -> str:
        return next((s.reason for s in self.sides if s.status == self.status and s.reason), "not run")

    def get(self, key: str) -> Any:
        values = [s.figures.get(key) for s in self.ok if s.figures.get(key) is not None]
        if not values:
            return None
        if not all(isinstance(v, (int, float)) for v in values):
            return values[0]
        return statistics.median(values)

    def spread(self, key: str = "tokens_per_s") -> float | None:
        """(max - min) / median over the finished processes; None with fewer than two."""
        values = [s.figures[key] for s in self.ok if s.figures.get(key)]
        if len(values) < 2:
            return None
        return (max(values) - min(values)) / statistics.median(values)


Results = dict[str, dict[str, list[Side]]]  # run name -> "hand" | "runner" -> one Side per repeat


def measured(results: Results, name: str, which: str) -> Measured:
    return Measured(results.get(name, {}).get(which, []))


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


def native_ratio(run: Run, results: Results) -> float | None:
    """accelerate-X's parabench tokens/s over native X's, in the same benchmark."""
    if run.native is None:
        return None
    return _ratio(
        measured(results, run.name, "runner").get("tokens_per_s"),
        measured(results, run.native, "runner").get("tokens_per_s"),
    )


def verdict(run: Run, results: Results, judged: bool) -> str:
    hand, runner = measured(results, run.name, "hand"), measured(results, run.name, "runner")
    for label, side in (("hand-written", hand), ("parabench", runner)):
        if side.status != "ok":
            return f"{label} {side.status}: {side.reason}".replace("|", "/")
    if not judged:
        return "dry run: not judged"
    problems = [
        f"{len(failed)} of {len(side.sides)} {label} processes failed"
        for label, side in (("hand-written", hand), ("parabench", runner))
        if (failed := [s for s in side.sides if s.status == "failed"])
    ]
    speed = _ratio(runner.get("tokens_per_s"), hand.get("tokens_per_s"))
    memory = _ratio(runner.get("peak_mem_allocated_bytes"), hand.get("peak_mem_allocated_bytes"))
    if speed is not None and speed < GOAL_SPEED:
        problems.append(f"slower ({speed:.3f} < {GOAL_SPEED})")
    if memory is not None and memory > GOAL_MEMORY:
        problems.append(f"more memory ({memory:.3f} > {GOAL_MEMORY})")
    mfu = runner.get("mfu")
    if run.goal_mfu is not None and mfu is not None and mfu < run.goal_mfu:
        problems.append(f"MFU {mfu:.1%} < {run.goal_mfu:.0%}")
    if run.native is not None:
        against_native = native_ratio(run, results)
        if against_native is None:
            problems.append(f"no {run.native} run to compare with")
        elif against_native < GOAL_SPEED:
            problems.append(f"slower than {run.native} ({against_native:.3f} < {GOAL_SPEED})")
    return "; ".join(problems) or "meets the goals"


COLUMNS = (
    "run",
    "tok/s parabench",
    "tok/s hand-written",
    "speed ratio (goal >= 0.97)",
    "tok/s spread parabench / hand-written",
    "peak GiB parabench",
    "peak GiB hand-written",
    "memory ratio (goal <= 1.03)",
    "MFU parabench",
    "MFU hand-written",
    "tok/s vs native, parabench (goal >= 0.97)",
    "final loss parabench / hand-written",
    "verdict",
)


def _spread_cell(runner: Measured, hand: Measured) -> str:
    n = min(len(runner.ok), len(hand.ok))
    if n < 2:
        return f"n={n}"
    return f"{_fmt(runner.spread(), 'pct')} / {_fmt(hand.spread(), 'pct')} (n={len(runner.ok)}/{len(hand.ok)})"


def table(runs: list[Run], results: Results, judged: bool) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for run in runs:
        hand, runner = measured(results, run.name, "hand"), measured(results, run.name, "runner")
        cells = [
            run.name,
            _fmt(runner.get("tokens_per_s"), "tok"),
            _fmt(hand.get("tokens_per_s"), "tok"),
            _fmt(_ratio(runner.get("tokens_per_s"), hand.get("tokens_per_s")), "ratio"),
            _spread_cell(runner, hand),
            _fmt(runner.get("peak_mem_allocated_bytes"), "gib"),
            _fmt(hand.get("peak_mem_allocated_bytes"), "gib"),
            _fmt(_ratio(runner.get("peak_mem_allocated_bytes"), hand.get("peak_mem_allocated_bytes")), "ratio"),
            _fmt(runner.get("mfu"), "pct"),
            _fmt(hand.get("mfu"), "pct"),
            f"{_fmt(native_ratio(run, results), 'ratio')} ({run.native})" if run.native else "",
            f"{_fmt(runner.get('final_loss'), 'loss')} / {_fmt(hand.get('final_loss'), 'loss')}",
            verdict(run, results, judged),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings(runs: list[Run], results: Results) -> list[str]:
    """Derived lines: what each fast-path option does, and how far tuning moves ZeRO-3 towards ZeRO-2."""
    out: list[str] = []
    names = {r.name for r in runs}

    def tok(name: str, which: str) -> float | None:
        return measured(results, name, which).get("tokens_per_s")

    for which, label in (("runner", "parabench"), ("hand", "hand-written")):
        z2, z3, z3t = (tok(n, which) for n in ("zero2", "zero3", "zero3-tuned"))
        if {"zero2", "zero3", "zero3-tuned"} <= names and z2 and z3 and z3t:
            closed = (
                f"tuning closes {(z3t - z3) / (z2 - z3):.0%} of it"
                if z2 > z3
                else "untuned ZeRO-3 is not slower than ZeRO-2 here: no gap to close"
            )
            out.append(
                f"ZeRO-3 tuned vs untuned ({label}): {z3t:,.0f} vs {z3:,.0f} tok/s, ZeRO-2 {z2:,.0f}; "
                f"gap to ZeRO-2 {1 - z3 / z2:.1%} untuned, {1 - z3t / z2:.1%} tuned ({closed})"
            )
    for fast, base in (
        ("single+compile", "single"),
        ("ddp+compile", "ddp"),
        ("single+ac", "single"),
        ("fsdp-grad-op", "fsdp"),
        ("fsdp+compile", "fsdp"),
    ):
        if {fast, base} <= names:
            a, b = tok(fast, "runner"), tok(base, "runner")
            ma = measured(results, fast, "runner").get("peak_mem_allocated_bytes")
            mb = measured(results, base, "runner").get("peak_mem_allocated_bytes")
            if a and b:
                mem = f", peak memory {ma / GIB:.2f} vs {mb / GIB:.2f} GiB" if ma and mb else ""
                out.append(f"{fast} against {base} (parabench): {a / b:.2f}x tokens/s{mem}")
    return out


def device_facts(results: Results) -> dict[str, str]:
    facts: dict[str, str] = {"python": platform.python_version()}
    for sides in results.values():
        for side in (s for group in sides.values() for s in group):
            if side.status != "ok":
                continue
            facts.setdefault("device", side.figures.get("device") or "")
            for name, version in (side.figures.get("versions") or {}).items():
                if version:
                    facts.setdefault(name, version)
            for name in ("torch", "deepspeed"):
                if side.figures.get(name):
                    facts.setdefault(name, side.figures[name])
    for name in ("torch", "deepspeed", "accelerate"):
        if name not in facts:
            try:
                from importlib.metadata import version

                facts[name] = version(name)
            except Exception:
                facts[name] = "not installed"
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            if smi.returncode == 0 and smi.stdout.strip():
                facts["nvidia-smi"] = smi.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


def section(
    runs: list[Run],
    results: Results,
    s: Settings,
    command: str,
    facts: dict[str, str],
    dry_run: bool,
    elapsed: float,
    repeat: int,
    note: str,
) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"## {now}: framework overhead on {facts.get('device') or 'unknown device'}"
    if dry_run:
        title += " (dry run: tiny model on the CPU, checks the script, measures nothing)"
    versions = ", ".join(f"{k} {facts[k]}" for k in ("torch", "deepspeed", "accelerate", "python") if k in facts)
    lines = [
        title,
        "",
        f"Command: `{command}`",
        "",
        f"Device: {facts.get('device') or 'unknown'}"
        + (f" (nvidia-smi: {facts['nvidia-smi']})" if "nvidia-smi" in facts else "")
        + f"; {versions}.",
        "",
        f"Settings (both sides): model {s.model}, micro-batch {s.micro_batch} = global batch, world size "
        f"{s.world_size}, sequence {s.seq_len}, {s.precision}, AdamW (lr {s.lr}, betas {s.beta1}/{s.beta2}, weight "
        f"decay {s.weight_decay} on matrices), clipping {s.grad_clip}, {s.steps} steps of which the first {s.warmup} "
        f"are left out of tokens/s; same seed, same synthetic data in the same order. Peak memory is "
        f"torch.cuda.max_memory_allocated of the process; MFU = tokens/s x (6N + 12LHQT) / peak bf16 FLOP/s "
        f"(989e12 on H100 SXM). Each side ran {repeat} time(s), hand-written and parabench interleaved run after "
        f"run; figures are medians, the spread is (max - min) / median of tokens/s. accelerate-X is held to native "
        f"X's hand-written loop (the same processes) and to native X's parabench tokens/s. "
        f"Whole benchmark: {elapsed:.0f} s.",
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


def to_json(runs: list[Run], results: Results, s: Settings, facts: dict[str, str]) -> dict[str, Any]:
    return {
        "settings": s.__dict__,
        "facts": facts,
        "runs": {
            r.name: {which: [side.__dict__ for side in sides] for which, sides in results[r.name].items()} for r in runs
        },
    }
