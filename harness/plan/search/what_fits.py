"""Where nothing asked fits: the layouts that would, from the search itself (every strategy the
planner models, with the tensor, pipeline and context-parallel sizes each takes, every split of
the batch and every checkpointing mode), on the GPUs asked, else on the fewest power-of-two
multiple of them up to MAX_GPUS; or, where none does, how far the leanest still is."""

from __future__ import annotations

from dataclasses import dataclass

from harness.plan.model.model_shape import PlanError
from harness.plan.parallel.backends import planner_models
from harness.plan.predict import Question
from harness.plan.recommendation import shortfall
from harness.plan.search.layout_search import Searched, distinct, gib, largest_part, search

MAX_GPUS = 1024
SHOWN = 3  # layouts named, one per strategy, fastest first


@dataclass(frozen=True)
class WhatFits:
    fitting: list[Searched]  # the fastest that fits of each strategy, fastest first; empty: none up to MAX_GPUS
    leanest: Searched | None  # where none fits: the leanest layout planned on any GPU count tried

    def lines(self, asked: int) -> list[str]:
        if self.fitting:
            gpus = self.fitting[0].gpus
            where = "on these GPUs" if gpus == asked else f"on {gpus} GPUs (none fits on fewer)"
            named = "; ".join(
                f"{s.arguments()} ({gib(s.peak_bytes)} per GPU, {s.tokens_per_s_per_gpu:,.0f} tokens/s per GPU)"
                for s in self.fitting
            )
            return [f"Layouts that fit {where}: {named}."]
        if self.leanest is None:
            return [f"No layout the planner knows can take this batch on up to {MAX_GPUS:,} GPUs."]
        if self.leanest.plan.gpu_fits and self.leanest.plan.host_fits is False:  # the card holds it, its host not
            return [
                f"No layout the planner knows fits on up to {MAX_GPUS:,} GPUs: the leanest, {self.leanest.arguments()} "
                f"on {self.leanest.gpus} GPUs, {shortfall(self.leanest.plan)}."
            ]
        part, nbytes = largest_part(self.leanest)
        return [
            f"No layout the planner knows (tensor, pipeline or context parallel, every strategy, micro-batch and "
            f"checkpointing) fits on up to {MAX_GPUS:,} GPUs: the leanest, {self.leanest.arguments()} on "
            f"{self.leanest.gpus} GPUs, needs "
            f"{gib(self.leanest.plan.peak_bytes)} per GPU (largest part: {part} {gib(nbytes)}); a card with more "
            "memory or a shorter seq_len is needed."
        ]


def planned_strategies(gpus: int) -> list[str]:
    """Every strategy the planner models that runs on `gpus` GPUs (`single` runs on one)."""
    return [name for name, model in planner_models().items() if gpus == 1 or not model.one_process]


def what_fits(q: Question, global_batch: int, names: list[str] | None = None) -> WhatFits:
    """The fastest layout of each of `names` (default: every strategy the planner models) that fits
    `global_batch` sequences on `q`'s GPUs, else on the fewest power-of-two multiple of them that any
    layout fits, up to MAX_GPUS (a batch the question did not give growing with them, Question.with_gpus)."""
    names = names if names is not None else planned_strategies(q.gpus)
    gpus, leanest = q.gpus, None
    while gpus <= MAX_GPUS:
        asked = q.with_gpus(gpus) if gpus != q.gpus else q
        batch = asked.global_batch if q.batch_defaulted else global_batch
        try:
            result = search(asked, names, batch, time_fitting_only=True)
        except PlanError:  # no layout can take the batch on this many GPUs: neither on more
            break
        if result.ranked:
            best_of: dict[str, Searched] = {}
            for found, _ in distinct(result.ranked, len(result.ranked)):
                best_of.setdefault(found.strategy, found)
            return WhatFits(list(best_of.values())[:SHOWN], None)
        leanest = min([*result.too_large, *([leanest] if leanest else [])], key=lambda s: s.peak_bytes, default=None)
        gpus *= 2
    return WhatFits([], leanest)
