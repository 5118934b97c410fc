"""The largest micro-batch a strategy fits: the plan's own (its table's column, named by the
recommendation), and where the batch search (harness/compare/batch_search.py) starts.

The plan's limit is the largest micro-batch whose predicted peak, with the caching allocator's
reserve, is within the card as `capacity.py` decides it, at the question's sequence length,
checkpointing and accumulation. Only the activations and the buffers that follow the tokens
change with the micro-batch, so each size is priced without planning the rest again.

A search start wants the best guess of where the device really runs out. SEARCH_FRACTION leaves
5% of the card for what the predicted peak allocated does not hold: the CUDA context (about 0.5
GiB, under 1% of an 80 GB card), cuBLAS and NCCL workspaces, and the caching allocator's
fragmentation (under memory pressure it releases its cached blocks before it gives up, so what
remains is the waste inside the segments in use). The search is exact whatever the start: a
start off by a few sizes costs a few probes, not a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from harness.plan.parallel.backends import model_of
from harness.plan.parallel.layout import LayoutError
from harness.plan.parallel.pipeline_context import runtime_of
from harness.plan.predict import (
    Question,
    StrategyPlan,
    memory_at,
    on_host_bytes,
    plan_backend,
    plan_fits,
    plan_strategy,
    prepared,
)

SEARCH_FRACTION = 0.95
PLAN_LIMIT = 4096  # sequences: the table's column says "4096+" beyond


def _largest(fits: Callable[[int], bool], limit: int) -> int:
    """The largest size in 1..limit for which `fits` holds (it holds for every smaller one); 0 if none."""
    if not fits(1):
        return 0
    good, too_big = 1, None  # double past the limit, then bisect
    while too_big is None and good < limit:
        size = min(2 * good, limit)
        if fits(size):
            good = size
        else:
            too_big = size
    while too_big is not None and too_big - good > 1:
        middle = (good + too_big) // 2
        if fits(middle):
            good = middle
        else:
            too_big = middle
    return good


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

    if peak(1) is None:
        return None
    return _largest(lambda size: peak(size) <= usable, limit)


def fitting_micro_batch(plan: StrategyPlan, question: Question, limit: int = PLAN_LIMIT) -> int | None:
    """The largest micro-batch per data-parallel rank, `limit` at most, that `plan`'s strategy fits
    at the question's accumulation; 0: not even one sequence; None: its activations are unknown."""
    if plan.peak_bytes is None:
        return None
    # The question as the plan priced it: a backend without expert parallelism holds the experts among
    # the rest (predict.prepared), so their gradients and gathers are priced at every micro-batch too.
    asked = prepared(plan.backend, replace(question, grad_accum=plan.grad_accum, global_batch=None))[1]

    if plan.layout.pp > 1 or plan.layout.cp > 1:  # each stage's or sequence shard's own peak
        # A pipeline's local batch is whole rounds of its micro-batches: microbatches=, or by default one a
        # stage for parabench's own strategies (pipeline_of).
        runs = plan.backend.options.get("microbatches") or (plan.layout.pp if runtime_of(plan.backend) else 1)
        unit = int(runs) if plan.layout.pp > 1 else 1

        def split_fits(rounds: int) -> bool:
            try:
                return plan_backend(plan.backend, replace(asked, micro_batch=rounds * unit)).fits is True
            except LayoutError:  # a local batch the pipeline's schedule cannot run
                return False

        return _largest(split_fits, max(1, limit // unit)) * unit

    def fits(micro_batch: int) -> bool:
        memory = memory_at(plan.backend, replace(asked, micro_batch=micro_batch), plan.layout, plan.states)
        # The host as well: saved activations offloaded to it grow with the micro-batch.
        on_host = on_host_bytes(plan.states, memory.activations)
        return plan_fits(plan.headroom, memory.peak, plan.host, on_host) is True

    return _largest(fits, limit)


def accumulated(name: str, q: Question, plan: StrategyPlan) -> StrategyPlan | None:
    """`plan` (its data-parallel rank's whole share of the global batch at once, which does not fit)
    at the largest micro-batch that divides the share and fits, accumulating the rest, as a run whose
    batch is given sets its micro-batch and gradient accumulation; None where not even one sequence
    a micro-step fits, or its activations are unknown. A micro-batch that does not fit in a step of
    its own does not fit beside accumulation either, so only those up to that size are tried."""
    largest = fitting_micro_batch(plan, q)
    share = plan.micro_batch
    for micro_batch in range(min(largest or 0, share - 1), 0, -1):
        if share % micro_batch:
            continue
        smaller = plan_strategy(name, replace(q, micro_batch=micro_batch, split_global_batch=False))
        if smaller.fits:
            return smaller
    return None


def micro_batch_limit(largest: int) -> str:
    """A limit as the table and the recommendation say it: the search stops at PLAN_LIMIT."""
    return f"{largest}+" if largest >= PLAN_LIMIT else str(largest)
