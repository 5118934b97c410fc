"""How much of the plan's miss on published runs rests on the host's pace: every published run planned
at each eager rate the planner's sources measured (harness/plan/speed/host_issue.py), the default and
the two slower hosts, and the goals' buckets at each.

The host's issue time per kernel is the one input of a host-bound micro-step that the published runs
do not state (which CPU, which torch): the plan prices an x86 server's 24 us under torch 2.11 for
every x86 host (2.75 times that for a Grace CPU). This script does not choose among the rates: it
shows, bucket by bucket, what each would give, so a reader sees which figures of
bench/results/plan_vs_published.md depend on it (those where each GPU's work per op is small) and
which do not. A user who knows their host's pace gives it to the plan as `host_us_per_kernel=`.

    python bench/host_pace.py            # writes bench/results/host_pace.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plan_vs_published import goal_runs, picks_of, plan_rows, read_rows, runs_csvs  # noqa: E402
from bench.published_breakdown import by_family, by_kind, by_scale, by_work  # noqa: E402

# The eager rates the planner's sources measured (host_issue.py cites each): an x86 host's pace.
PACES = (
    (24.0, "8 x B200, torch 2.11 (huggingface/lerobot#4612): the default"),
    (31.0, "a cloud L4 host (roboflow/rf-detr#1410)"),
    (45.0, "a workstation's A6000 (facebookresearch/sam2#768)"),
)


def _cell(outcomes: list) -> str:
    errors = [o.error for o in outcomes if o.error is not None]
    if not errors:
        return "-"
    median = statistics.median(abs(e) for e in errors)
    return f"{median:.1%} ({1 + statistics.median(errors):.2f})"


def _choosing(outcomes: list) -> str:
    picks = picks_of(outcomes)
    if not picks:
        return "-"
    fastest = sum(p.regret <= 0 for p in picks) / len(picks)
    return f"{fastest:.0%}, worst {max(p.regret for p in picks):.1%}"


def pace_table(by_pace: dict[float, list]) -> list[str]:
    """One row a bucket, one column a pace: median |error| of tokens/s per GPU (median planned / published)."""
    paces = list(by_pace)
    header = "| runs of | " + " | ".join(f"{pace:g} us a kernel" for pace in paces) + " |"
    lines = [header, "|---|" + "---:|" * len(paces)]
    groups = [("every CSV", {pace: outcomes for pace, outcomes in by_pace.items()})]
    for split in (by_kind, by_scale, by_work, by_family):
        split_by_pace = {pace: split(outcomes) for pace, outcomes in by_pace.items()}
        for bucket in split_by_pace[paces[0]]:
            groups.append((bucket, {pace: split_by_pace[pace].get(bucket, []) for pace in paces}))
    for name, outcomes in groups:
        lines.append(f"| {name} | " + " | ".join(_cell(outcomes[pace]) for pace in paces) + " |")
    within = [
        sum(abs(o.error) <= 0.15 for o in rows if o.error is not None) / max(sum(o.error is not None for o in rows), 1)
        for rows in by_pace.values()
    ]
    lines.append("| runs within 15% | " + " | ".join(f"{w:.0%}" for w in within) + " |")
    lines.append(
        "| jobs whose pick is the fastest, worst regret | "
        + " | ".join(_choosing(outcomes) for outcomes in by_pace.values())
        + " |"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/host_pace.md", help="'-': print only")
    args = p.parse_args(argv)
    paths = runs_csvs()
    by_pace = {
        pace: goal_runs([(path, plan_rows(read_rows(path), host_us_per_kernel=pace)) for path in paths])
        for pace, _ in PACES
    }
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = shlex.join(["python", "bench/host_pace.py", *argv])
    lines = [
        "# The plan on published runs at each host pace its sources measured",
        "",
        f"{now}; `{command}`. Every run of bench/data's CSVs, as bench/plan_vs_published.py plans it, with an "
        "x86 host's eager pace of (a Grace host's at 2.75 times it):",
        "",
        *(f"- {pace:g} us a kernel: {source}" for pace, source in PACES),
        "",
        "Each cell: the median |error| of tokens/s per GPU (the median planned / published). The runs do not "
        "state their host, so no column is the right one for all of them; the plan prices the first.",
        "",
        *pace_table(by_pace),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
