"""The largest micro-batch a strategy fits on the devices, found by doubling then bisecting.

Each probe is a short run at one micro-batch; an out-of-memory failure means "does
not fit", any other failure ends that strategy's search with the error. The search
stops bisecting once the gap is within 1/16 of the size found (a few percent of
batch is not worth another run).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

CPU_SKIP_MESSAGE = (
    "batch search skipped: on CPU there is no device memory limit to find (a bigger batch grows into "
    "host RAM and swap rather than failing); run it on GPUs"
)
MAX_MICRO_BATCH = 4096  # stop doubling here: beyond it the search would only measure the data set size


@dataclass
class Probe:
    micro_batch: int
    fits: bool
    oom: bool = False
    tokens_per_s: float | None = None
    error: str | None = None  # a failure that is not out-of-memory


@dataclass
class BatchSearchResult:
    strategy: str
    largest_micro_batch: int | None = None  # None: not even the smallest probe fitted
    tokens_per_s: float | None = None  # at largest_micro_batch
    hit_limit: bool = False  # still fitting at MAX_MICRO_BATCH
    error: str | None = None
    probes: list[dict] = field(default_factory=list)


def largest_fitting(strategy: str, probe: Callable[[int], Probe], start: int, limit: int = MAX_MICRO_BATCH) -> BatchSearchResult:
    """Double from `start` until a probe runs out of memory, then bisect between the last fit and it."""
    result = BatchSearchResult(strategy)
    best: Probe | None = None
    too_big: int | None = None

    def run(micro_batch: int) -> Probe | None:
        outcome = probe(micro_batch)
        result.probes.append({"micro_batch": micro_batch, "fits": outcome.fits, "oom": outcome.oom,
                              "tokens_per_s": outcome.tokens_per_s, "error": outcome.error})
        if not outcome.fits and not outcome.oom:
            result.error = f"micro_batch={micro_batch}: {outcome.error}"
            return None
        return outcome

    size = max(1, start)
    while size <= limit:
        outcome = run(size)
        if outcome is None:
            return _finish(result, best)
        if not outcome.fits:
            too_big = size
            break
        best, size = outcome, size * 2
    if too_big is None:
        result.hit_limit = True
        return _finish(result, best)
    low = best.micro_batch if best else 0
    while too_big - low > max(1, low // 16):
        middle = (low + too_big) // 2
        outcome = run(middle)
        if outcome is None:
            return _finish(result, best)
        if outcome.fits:
            best, low = outcome, middle
        else:
            too_big = middle
    return _finish(result, best)


def _finish(result: BatchSearchResult, best: Probe | None) -> BatchSearchResult:
    if best is not None:
        result.largest_micro_batch, result.tokens_per_s = best.micro_batch, best.tokens_per_s
    return result
