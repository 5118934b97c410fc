"""The largest micro-batch the planner predicts a run fits on its GPUs: where the batch search
(harness/compare/batch_search.py) starts.

A search start wants the best guess of where the device really runs out. SEARCH_FRACTION leaves
5% of the card for what the predicted peak allocated does not hold: the CUDA context (about 0.5
GiB, under 1% of an 80 GB card), cuBLAS and NCCL workspaces, and the caching allocator's
fragmentation (under memory pressure it releases its cached blocks before it gives up, so what
remains is the waste inside the segments in use). The search is exact whatever the start: a
start off by a few sizes costs a few probes, not a wrong answer.
"""

from __future__ import annotations

from dataclasses import replace

from harness.plan.backends import model_of
from harness.plan.predict import Question, plan_strategy

SEARCH_FRACTION = 0.95


def largest_micro_batch(name: str, question: Question, *, limit: int, fraction: float = SEARCH_FRACTION) -> int | None:
    """The largest micro-batch (grad_accum=1), `limit` at most, whose predicted peak allocated
    memory is within `fraction` of the question's GPU memory: 0 where not even one sequence is
    predicted to fit, None where the planner has no model of the strategy or no estimate of its
    activations."""
    if model_of(name) is None:
        return None
    usable = fraction * question.capacity_bytes

    def peak(micro_batch: int) -> int | None:
        return plan_strategy(name, replace(question, micro_batch=micro_batch, grad_accum=1)).peak_bytes

    first = peak(1)
    if first is None:
        return None
    if first > usable:
        return 0
    fits, too_big = 1, None  # peak grows with the micro-batch: double past the limit, then bisect
    while too_big is None and fits < limit:
        size = min(2 * fits, limit)
        if peak(size) <= usable:
            fits = size
        else:
            too_big = size
    while too_big is not None and too_big - fits > 1:
        middle = (fits + too_big) // 2
        if peak(middle) <= usable:
            fits = middle
        else:
            too_big = middle
    return fits
