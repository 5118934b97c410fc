"""bench/plan_vs_published.py's figures by layout kind, by scale and by card, its choices among
one job's published settings by kind, and the goals beside what the plan reaches now.

Works on the script's outcomes (each with `row`, `plan`, `skipped`, `error`, `memory_error`) and
its picks (a job's key, the plan's pick, the fastest published, the job's rows).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.layout_kinds import degrees, kinds_of, scale_of
from harness.common.hardware import gpu_spec
from harness.plan.published_accuracy import (
    KINDS,
    NEW_FAMILIES,
    SCALES,
    WORK_BUCKETS,
    card_family,
    work_bucket_of,
    work_per_op,
)

WITHIN = 0.15

# The plan's goals on published runs (each checked in goal_lines).
GOAL_MEDIAN = 0.10  # median |error| of tokens/s per GPU, in every layout kind and scale bucket
GOAL_WITHIN_SHARE = 0.75  # share of runs within WITHIN
GOAL_PICK_SHARE = 0.75  # share of jobs whose pick is the fastest published setting
GOAL_WORST_REGRET = 0.10
GOAL_MEMORY = 0.15  # median |error| of the published memory
GOAL_RAN_NOT_FIT = 0.03  # share of runs that ran planned not to fit
GOAL_FAMILY_MEDIAN = 0.15  # median |error| in each family of the cards added for 2026's clusters


@dataclass(frozen=True)
class Pick:
    """One job: its key, the plan's pick, the fastest as published, and every setting of it."""

    key: tuple
    pick: Any
    best: Any
    rows: list

    @property
    def regret(self) -> float:
        return self.best.published / self.pick.published - 1


def _row(name: str, outcomes: list) -> str:
    """A bucket's runs, how many are planned, and the planned ones' error."""
    errors = [o.error for o in outcomes if o.error is not None]
    if not errors:
        return f"| {name} | {len(outcomes)} | 0 | - | - | - |"
    return (
        f"| {name} | {len(outcomes)} | {len(errors)} | {statistics.median(abs(e) for e in errors):.1%} | "
        f"{sum(abs(e) <= WITHIN for e in errors) / len(errors):.0%} | {1 + statistics.median(errors):.3f} |"
    )


def _table(title: str, groups: dict[str, list]) -> list[str]:
    return [
        f"| {title} | runs | planned | median abs error | within 15% | median predicted / published |",
        "|---|---:|---:|---:|---:|---:|",
        *(_row(name, rows) for name, rows in groups.items()),
        "",
    ]


def by_kind(outcomes: list) -> dict[str, list]:
    """Each layout kind's runs (a run counts under every kind its layout has)."""
    return {kind: [o for o in outcomes if kind in kinds_of(o.row)] for kind in KINDS}


def by_scale(outcomes: list) -> dict[str, list]:
    return {scale: [o for o in outcomes if scale_of(o.row) == scale] for scale in SCALES}


def work_bucket(row: dict[str, str]) -> str:
    """The WORK_BUCKETS name of a row's work per GPU per layer op (micro-batch x sequence x width / tp:
    what a fixed cost per kernel or collective is measured against)."""
    tp = degrees(row["sharding"]).tp
    return work_bucket_of(work_per_op(int(row["micro_batch"]), int(row["seq_len"]), int(row["d_model"]), tp))


def by_work(outcomes: list) -> dict[str, list]:
    """The runs by work per GPU per layer op (WORK_BUCKETS)."""
    return {name: [o for o in outcomes if work_bucket(o.row) == name] for _, _, name in WORK_BUCKETS}


def by_card(outcomes: list) -> dict[str, list]:
    cards: dict[str, list] = {}
    for o in outcomes:
        cards.setdefault(o.row["gpu"], []).append(o)
    return dict(sorted(cards.items()))


def family_of(card: str) -> str:
    """The family a row's card belongs to (published_accuracy.card_family; NEW_FAMILIES are held to
    GOAL_FAMILY_MEDIAN)."""
    spec = gpu_spec(card)
    return "unknown" if spec is None else card_family(spec)


def by_family(outcomes: list) -> dict[str, list]:
    families: dict[str, list] = {}
    for o in outcomes:
        families.setdefault(family_of(o.row["gpu"]), []).append(o)
    return dict(sorted(families.items()))


def _figures(outcomes: list) -> dict[str, float] | None:
    errors = [o.error for o in outcomes if o.error is not None]
    if not errors:
        return None
    return {
        "runs": len(errors),
        "median_abs_error": round(statistics.median(abs(e) for e in errors), 4),
        "median_ratio": round(1 + statistics.median(errors), 4),
    }


def accuracy_figures(outcomes: list) -> dict[str, dict]:
    """The planned runs' median |error| and median predicted / published of tokens/s per GPU by layout
    kind, by kind within each scale, by work per GPU per layer op and by card family (the report's
    "Accuracy at a glance"): what a recommendation quotes (harness/plan/published_accuracy.py)."""
    kinds = by_kind(outcomes)
    return {
        "kinds": figures_of(kinds),
        "kinds_by_scale": {kind: figures_of(by_scale(rows)) for kind, rows in kinds.items()},
        "work": figures_of(by_work(outcomes)),
        "families": figures_of(by_family(outcomes)),
    }


def figures_of(buckets: dict[str, list]) -> dict[str, dict]:
    """Each bucket's planned runs, median |error| and median predicted / published (buckets with none left out)."""
    return {bucket: figures for bucket, rows in buckets.items() if (figures := _figures(rows))}


def breakdown_lines(outcomes: list, strategy_of: Callable[[dict[str, str]], str]) -> list[str]:
    """Tokens/s per GPU of every CSV together: all, by layout kind, by scale, by card, by strategy;
    the runs of a bucket the plan cannot plan are counted beside the planned ones."""
    strategies: dict[str, list] = {}
    for o in outcomes:
        strategies.setdefault(f"strategy {strategy_of(o.row)}", []).append(o)
    return [
        "### Accuracy at a glance (every CSV)",
        "",
        "Tokens/s per GPU, |predicted / published - 1|, over the runs the plan can plan (`runs` counts every "
        "run of the bucket, `planned` those planned; the others are listed with their reason under each CSV). "
        "Layout kinds overlap: a run with tensor, pipeline and context parallelism counts under each; TP "
        "inside a node means a tensor-parallel group within one node's GPUs, across nodes a larger one.",
        "",
        *_table("runs of", {"every CSV": outcomes}),
        *_table("layout kind", by_kind(outcomes)),
        *_table("scale", by_scale(outcomes)),
        *_table("work per GPU per layer op (w = micro-batch x sequence x width / tp)", by_work(outcomes)),
        *_table("card family", by_family(outcomes)),
        *_table("card", by_card(outcomes)),
        *_table("strategy", dict(sorted(strategies.items()))),
    ]


def _choice_row(name: str, picks: list[Pick]) -> str:
    if not picks:
        return f"| {name} | 0 | - | - | - |"
    regrets = [p.regret for p in picks]
    return (
        f"| {name} | {len(picks)} | {sum(r <= 0 for r in regrets) / len(regrets):.0%} | "
        f"{statistics.median(regrets):.1%} | {max(regrets):.1%} |"
    )


def choice_by_kind_lines(picks: list[Pick]) -> list[str]:
    """The plan's pick rate and regret over every job, and over the jobs whose published settings
    include each layout kind."""
    if not picks:
        return []
    return [
        "| jobs with a setting of kind | jobs | pick is the fastest | median regret | worst regret |",
        "|---|---:|---:|---:|---:|",
        _choice_row("all", picks),
        *(_choice_row(kind, [p for p in picks if any(kind in kinds_of(o.row) for o in p.rows)]) for kind in KINDS),
        "",
    ]


@dataclass(frozen=True)
class Goal:
    what: str
    target: str
    now: str
    met: bool


def goals(outcomes: list, picks: list[Pick]) -> list[Goal]:
    """The goals, each with what the plan reaches on these runs."""
    planned = [o for o in outcomes if o.error is not None]
    buckets = {**by_kind(planned), **by_scale(planned)}
    medians = {name: statistics.median(abs(o.error) for o in rows) for name, rows in buckets.items() if rows}
    over = [f"{name} {m:.1%}" for name, m in medians.items() if m > GOAL_MEDIAN]
    within = sum(abs(o.error) <= WITHIN for o in planned) / max(len(planned), 1)
    ran = [o for o in outcomes if o.plan is not None and o.plan.fits is not None]
    not_fit = sum(not o.plan.fits for o in ran) / max(len(ran), 1)
    memory = [abs(o.memory_error) for o in outcomes if o.memory_error is not None]
    out = [
        Goal(
            "median abs error of tokens/s per GPU in every layout kind and scale bucket",
            f"<= {GOAL_MEDIAN:.0%}",
            "over in " + ", ".join(over) if over else f"largest {max(medians.values(), default=0):.1%}",
            not over and bool(medians),
        ),
        Goal(
            "runs within 15%",
            f">= {GOAL_WITHIN_SHARE:.0%}",
            f"{within:.0%} of {len(planned)}",
            within >= GOAL_WITHIN_SHARE,
        ),
    ]
    if picks:
        rate = sum(p.regret <= 0 for p in picks) / len(picks)
        worst = max(p.regret for p in picks)
        out += [
            Goal(
                "jobs whose pick is the fastest",
                f">= {GOAL_PICK_SHARE:.0%}",
                f"{rate:.0%} of {len(picks)}",
                rate >= GOAL_PICK_SHARE,
            ),
            Goal("worst regret", f"<= {GOAL_WORST_REGRET:.0%}", f"{worst:.1%}", worst <= GOAL_WORST_REGRET),
        ]
    if memory:
        median = statistics.median(memory)
        now = f"{median:.1%} over {len(memory)} runs"
        out.append(
            Goal("median abs error of the published memory", f"<= {GOAL_MEMORY:.0%}", now, median <= GOAL_MEMORY)
        )
    families = {name: rows for name, rows in by_family(planned).items() if name in NEW_FAMILIES and rows}
    if families:
        errors = {name: statistics.median(abs(o.error) for o in rows) for name, rows in families.items()}
        over = [f"{name} {m:.1%}" for name, m in errors.items() if m > GOAL_FAMILY_MEDIAN]
        now = "over in " + ", ".join(over) if over else f"largest {max(errors.values()):.1%} ({len(errors)} families)"
        out.append(
            Goal(
                "median abs error of tokens/s per GPU in each new card family",
                f"<= {GOAL_FAMILY_MEDIAN:.0%}",
                now,
                not over,
            )
        )
    now = f"{not_fit:.1%} of {len(ran)}"
    out.append(
        Goal('runs that ran planned "does not fit"', f"<= {GOAL_RAN_NOT_FIT:.0%}", now, not_fit <= GOAL_RAN_NOT_FIT)
    )
    return out


def goal_lines(outcomes: list, picks: list[Pick]) -> list[str]:
    return [
        "### Goals",
        "",
        "| goal | target | now | met |",
        "|---|---|---|---|",
        *(f"| {g.what} | {g.target} | {g.now} | {'yes' if g.met else 'NO'} |" for g in goals(outcomes, picks)),
        "",
    ]
