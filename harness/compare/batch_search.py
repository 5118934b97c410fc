"""The largest micro-batch a strategy fits on the devices, found exactly in a few probes.

The order (`next_size`, a pure function of the probes so far): start at the micro-batch the
planner predicts is the largest that fits (or the compare's, where it predicts none). If it
fits, try the next size up, then +2, +4, ... until one runs out of memory; if it does not fit,
try -1, -2, -4, ... until one fits; then bisect. The answer is the largest size that fitted,
with the next size up seen to run out of memory (or the search limit reached): with an exact
prediction, two probes. A failure that is not out-of-memory ends the search with its error.

Where the probes run (`search`): in jobs of `runner.py probe` (harness/compare/probe.py), which read
and extend the search file one probe at a time, so a job that dies loses nothing. Where the
backend recovers from an out-of-memory error and the world is one process, one job probes size
after size, freeing everything in between; otherwise, or once such a job died, each probe is a
job of its own, and a job that ran out of memory is that probe's answer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.compare.supervise import JobOutcome

CPU_SKIP_MESSAGE = (
    "batch search skipped: on CPU there is no device memory limit to find (a bigger batch grows into "
    "host RAM and swap rather than failing); run it on GPUs"
)
MAX_MICRO_BATCH = 4096  # stop growing here: beyond it the search would only measure the data set size
SEARCH_FILE = "search.json"
FITS, OOM, ERROR = "fits", "oom", "error"


@dataclass
class Probe:
    micro_batch: int
    result: str  # FITS, OOM or ERROR
    new_process: bool  # the first probe of its process (it paid the start-up), or one after others in it
    wall_time_s: float | None = None  # the probe's own; for one whose job died, the whole job's
    tokens_per_s: float | None = None
    peak_allocated_bytes: int | None = None  # None on a CPU
    error: str | None = None  # one line: why it failed (an error, or the out-of-memory message)


@dataclass
class Search:
    """One strategy's search, as the search file holds it between jobs."""

    strategy: str
    world_size: int
    fallback_start: int  # where to start when the planner predicts nothing: the compare's micro-batch
    job_time_s: float  # a job starts no further probe that might not end within this
    in_process: bool  # whether probes may follow one another in one process
    note: str | None = None  # why they may not (or no longer)
    limit: int = MAX_MICRO_BATCH
    predicted: int | None = None  # the planner's largest micro-batch; the first job fills it in
    prediction_note: str | None = None  # why there is no prediction
    start: int | None = None  # set with the prediction, before the first probe
    probes: list[Probe] = field(default_factory=list)
    error: str | None = None  # the search could not even start
    jobs: int = 0  # processes started (each runs one probe, or several in one process)
    wall_time_s: float | None = None  # the whole search, start-ups included

    def next_size(self) -> int | None:
        if self.error is not None or self.start is None:
            return None
        return next_size(self.probes, self.start, self.limit)

    def as_result(self) -> dict[str, Any]:
        """What results.json records: the search as it went, and its answer."""
        fits = [p for p in self.probes if p.result == FITS]
        best = max(fits, key=lambda p: p.micro_batch, default=None)
        failed = min((p.micro_batch for p in self.probes if p.result == OOM), default=None)
        largest = best.micro_batch if best else None
        errors = [f"micro_batch={p.micro_batch}: {p.error}" for p in self.probes if p.result == ERROR]
        return {
            **asdict(self),
            "largest_micro_batch": largest,
            # Only where it is the very next size: the proof that the largest is the limit.
            "next_size_failed": failed if failed is not None and failed == (largest or 0) + 1 else None,
            "hit_limit": largest == self.limit,
            "tokens_per_s": best.tokens_per_s if best else None,
            "peak_allocated_bytes": best.peak_allocated_bytes if best else None,
            "error": self.error or (errors[0] if errors else None),
        }


def next_size(probes: list[Probe], start: int, limit: int = MAX_MICRO_BATCH) -> int | None:
    """The micro-batch to probe next, or None once the answer is known (or an error ended the search)."""
    if any(p.result == ERROR for p in probes):
        return None
    start = min(max(1, start), limit)
    fitted = [p.micro_batch for p in probes if p.result == FITS]
    failed = [p.micro_batch for p in probes if p.result == OOM]
    best, too_big = max(fitted, default=None), min(failed, default=None)
    if best is not None and too_big is not None:
        return (best + too_big) // 2 if too_big - best > 1 else None
    if best is not None:  # everything so far fitted: grow by 1, 2, 4, ... past the start
        if best >= limit:
            return None
        return min(start + max(1, 2 * (best - start)), limit)
    if too_big is not None:  # nothing fitted yet: shrink the same way
        if too_big <= 1:
            return None
        return max(start - max(1, 2 * (start - too_big)), 1)
    return start


def load(path: Path) -> Search:
    data = json.loads(path.read_text())
    return Search(**{**data, "probes": [Probe(**p) for p in data["probes"]]})


def save(path: Path, search: Search) -> None:
    """Written whole and renamed into place: a reader never sees half a file."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(asdict(search), indent=2) + "\n")
    os.replace(partial, path)


def search(path: Path, initial: Search, launch: Callable[[], JobOutcome]) -> Search:
    """Start the search file at `initial` and launch probe jobs (`launch` runs one to its end) until
    the answer is known; returns the search as the file holds it then, with the time it took.
    Ctrl-C during a job raises KeyboardInterrupt."""
    started = time.monotonic()
    save(path, initial)
    while True:
        state = load(path)
        before = len(state.probes)
        if state.error is not None or (state.start is not None and state.next_size() is None):
            state.wall_time_s = time.monotonic() - started
            save(path, state)
            return state
        state.jobs += 1
        save(path, state)
        outcome = launch()
        if outcome.kind == "interrupted":
            raise KeyboardInterrupt
        state = load(path)
        if state.start is None:  # the job died before it could predict: no probe can run
            state.error = f"the probe job failed before its first probe: {outcome.message}"
        elif not outcome.ok:
            _job_died(state, outcome, first_of_job=len(state.probes) == before)
        elif len(state.probes) == before:
            size = state.next_size()
            state.probes.append(
                Probe(
                    size,
                    ERROR,
                    True,
                    outcome.wall_time_s,
                    error="the probe job exited without recording a probe: see its log",
                )
            )
        save(path, state)


def _job_died(state: Search, outcome: JobOutcome, first_of_job: bool) -> None:
    """A job ended in failure while probing the next size. After other probes in its process,
    that size is probed again in a process of its own (and every size after it); as its
    process's first probe, the job's end is the probe's answer."""
    size = state.next_size()
    if size is None:
        return  # it died after its last probe (in its exit): the answer stands
    if state.in_process and not first_of_job:
        state.in_process = False
        state.note = (
            f"the job probing in one process died at micro-batch {size} ({outcome.kind}: "
            f"{outcome.message}): a process per probe from there"
        )
        return
    if outcome.kind == "oom":
        state.probes.append(Probe(size, OOM, True, outcome.wall_time_s, error=outcome.message))
    else:
        state.probes.append(Probe(size, ERROR, True, outcome.wall_time_s, error=f"{outcome.kind}: {outcome.message}"))


def describe(result: dict[str, Any]) -> str:
    """One line for the sweep's progress view: the answer, the prediction, what it cost."""
    largest, failed = result["largest_micro_batch"], result["next_size_failed"]
    if largest is None:
        answer = "none fits" if result["probes"] else "no probe ran"
    elif result["hit_limit"]:
        answer = f"{largest} fits (the search limit)"
    else:
        answer = f"{largest} fits" + (f", {failed} does not" if failed is not None else "")
    predicted = result["predicted"]
    jobs = result["jobs"]
    cost = (
        f"predicted {predicted if predicted is not None else 'none'}; {len(result['probes'])} probes in "
        f"{jobs} process{'es' if jobs != 1 else ''}, {result['wall_time_s'] or 0:.0f} s"
    )
    return f"{answer} ({cost})" + (f"; {result['error']}" if result["error"] else "")
