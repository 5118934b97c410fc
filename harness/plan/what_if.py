"""The recommendation's what-if on more GPUs: the same question on twice, four times ... the GPUs,
the global batch kept and split as each layout there can (Question.with_gpus). A GPU count whose
layout cannot take the question (the batch does not divide over its data-parallel ranks, a
strategy that stays inside one node) ends the search with the reason, never the question."""

from __future__ import annotations

from dataclasses import replace

from harness.plan.parallel.layout import LayoutError, reason_of
from harness.plan.predict import Question, StrategyPlan, plan_default

MAX_GPUS = 1024


def fewest_gpus(name: str, q: Question, limit: int = MAX_GPUS) -> tuple[int, StrategyPlan] | str | None:
    """The smallest power-of-two multiple of the GPU count, up to `limit`, at which `name` fits, with
    its plan; why the search stopped short where a GPU count cannot be laid out; None where none fits.
    The plans are of the memory alone (no step time): what is said of them is where one fits and what
    it holds there."""
    q = replace(q, timed=False)
    gpus = q.gpus * 2
    while gpus <= limit:
        try:
            p = plan_default(name, q.with_gpus(gpus))
        except LayoutError as exc:
            return f"not planned on {gpus} GPUs: {reason_of(name, exc)}"
        if p.fits:
            return gpus, p
        gpus *= 2
    return None


def skipped(plans: list[StrategyPlan], q: Question) -> dict[str, str]:
    """For each plan that does not fit, why its what-if on more GPUs stopped short, where it did."""
    stops = {p.name: fewest_gpus(p.name, q) for p in plans if p.fits is False}
    return {name: why for name, why in stops.items() if isinstance(why, str)}


def skipped_lines(plans: list[StrategyPlan], q: Question) -> list[str]:
    """skipped(), one line per reason."""
    names: dict[str, list[str]] = {}
    for name, why in skipped(plans, q).items():
        names.setdefault(why, []).append(name)
    return [f"What-if on more GPUs stops for {', '.join(n)}: {why}." for why, n in names.items()]
