#!/usr/bin/env python3
"""How well a calibrated plan predicts a size it was not calibrated on.

    python bench/calibration_check.py runs/compare-gpt2-124m runs/compare-gpt2-350m

Fits the planner's speed factors to the first compare (`plan calibrate=`), predicts every
strategy the second compare ran, at its settings (model, micro-batch, precision, world size),
and prints predicted against measured tokens/s, efficiency against `single` (tokens/s over
single's) and peak allocated memory, with the errors and the goals: each efficiency within 25%
of the measured one, each peak within 5%. Needs no GPU itself: both folders may come back from
a GPU machine. Appends the table, dated, with the command, to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.plan.predict import plan_strategy  # noqa: E402
from harness.plan.speed.calibration import calibrate_from, question_for, read_measurements  # noqa: E402

EFFICIENCY_GOAL, MEMORY_GOAL = 0.25, 0.05
from harness.common.units import GIB  # noqa: E402


def check(calibration: Path, measured: Path) -> tuple[list[str], bool]:
    """The table's lines, and whether every strategy met both goals."""
    factors, _ = calibrate_from(calibration)
    settings, measurements, _ = read_measurements(measured)
    lines = [
        f"Calibrated on `{calibration}` ({factors.basis}); predicted for `{measured}` ({settings.model}, "
        f"micro-batch {settings.micro_batch} x {settings.seq_len}, {settings.precision}, "
        f"{settings.world_size} x {settings.device}).",
        "",
        "| strategy | tokens/s predicted | measured | error | efficiency vs single predicted | measured | error "
        "| peak GiB predicted | measured | error | goals |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = []
    for m in measurements:
        plan = plan_strategy(m.strategy, question_for(settings, m, factors))
        tokens = settings.micro_batch * settings.grad_accum * settings.seq_len * (m.world_size or settings.world_size)
        rows.append((m, plan, tokens / m.step_s))
    single = next(((p.time.tokens_per_s, measured) for m, p, measured in rows if m.strategy == "single"), None)
    all_met = True
    for m, plan, measured_speed in rows:
        speed_error = plan.time.tokens_per_s / measured_speed - 1
        if single:
            predicted_eff, measured_eff = plan.time.tokens_per_s / single[0], measured_speed / single[1]
            eff_error = predicted_eff / measured_eff - 1
            efficiency = f"{predicted_eff:.3f} | {measured_eff:.3f} | {eff_error:+.1%}"
        else:
            eff_error, efficiency = None, "n/a | n/a | n/a"
        memory_error = plan.peak_bytes / m.peak_bytes - 1 if plan.peak_bytes and m.peak_bytes else None
        met = (
            eff_error is not None
            and abs(eff_error) <= EFFICIENCY_GOAL
            and memory_error is not None
            and abs(memory_error) <= MEMORY_GOAL
        )
        all_met &= met
        lines.append(
            f"| {m.strategy} | {plan.time.tokens_per_s:,.0f} | {measured_speed:,.0f} | {speed_error:+.1%} | "
            f"{efficiency} | "
            + (
                f"{plan.peak_bytes / GIB:.2f} | {m.peak_bytes / GIB:.2f} | {memory_error:+.1%} | "
                if memory_error is not None
                else "n/a | n/a | n/a | "
            )
            + ("met" if met else "missed")
            + " |"
        )
    lines += [
        "",
        f"Goals: efficiency against single within {EFFICIENCY_GOAL:.0%} of the measured one, peak within "
        f"{MEMORY_GOAL:.0%}, for every strategy: " + ("met." if all_met else "not met."),
    ]
    return lines, all_met


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("calibration", type=Path, help="the compare (or train) out_dir to calibrate on")
    p.add_argument("measured", type=Path, help="a compare at another size: what the plan is held to")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_calibration_check.md"))
    args = p.parse_args(argv)
    lines, met = check(args.calibration, args.measured)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        "\n".join(
            [f"## {now}", "", f"Command: `{shlex.join(['python', 'bench/calibration_check.py', *argv])}`", "", *lines]
        )
        + "\n"
    )
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        header = "# A calibrated plan against a size it was not calibrated on\n\n"
        out.write_text((out.read_text() if out.exists() else header) + "\n" + text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
