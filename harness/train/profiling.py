"""`profile_steps=[n,...]`: torch.profiler around chosen steps of the training loop, and what a
step costs read from the trace.

Each rank writes <out_dir>/profile/rank<r>.trace.json (a Chrome trace: chrome://tracing,
https://ui.perfetto.dev) and rank<r>.summary.json, which says per profiled step:

- collectives: the collectives this rank called, by kind (all_reduce, all_gather,
  reduce_scatter, broadcast, ...), each call once: the outermost c10d operator of the call, not
  the ops nested in it (a coalesced call is one) nor the backend's own events on its threads;
- operators: the top-level torch operators the step's thread called (those not inside another);
- wall_ms: the step's wall time (the annotation wraps the loop's whole step);
- backend_ms: the part of it in which the step's thread runs a torch operator (forward, backward,
  optimizer, collective calls: every top-level operator event) or a collective is in flight on
  the communication backend's threads (gloo's / NCCL's own events);
- host_ms: wall_ms - backend_ms, the host time outside the backend: Python and host work
  between operators (the loop's own code, a backend's Python bookkeeping, batch slicing),
  during which no computation or communication of the step progresses.

bench/profile_step.py reads the traces of `runner.py train` and of the hand-written loops
(bench/handwritten/, which profile their steps with this same StepProfiler) with the same
function, summarize().
Profiling slows the profiled steps: take throughput from a run without it.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from pathlib import Path
from typing import Any, ContextManager, Iterator, Sequence

import torch

# The user annotation around each profiled step, numbered from 1 as metrics.jsonl numbers steps.
STEP_MARK = "train_step#"
_STEP_RE = re.compile(re.escape(STEP_MARK) + r"(\d+)$")
# Namespaces of the dispatcher's collective operators (torch.distributed's calls, and the
# functional collectives DTensor and compiled graphs use).
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Events a communication backend records on its own threads while a collective runs.
_IN_FLIGHT_PREFIXES = ("gloo:", "nccl:")


class StepProfiler:
    """Profiles the 1-based steps `steps` (consecutive) of this rank; a no-op when empty."""

    def __init__(self, steps: Sequence[int], out_dir: Path, rank: int, device: torch.device):
        self.steps = list(steps)
        self.out_dir, self.rank, self.device = out_dir, rank, device
        self._profile: torch.profiler.profile | None = None

    def step(self, index: int) -> ContextManager:
        """The context of the loop's step `index` (0-based)."""
        number = index + 1
        if number not in self.steps:
            return contextlib.nullcontext()
        return self._profiled(number)

    @contextlib.contextmanager
    def _profiled(self, number: int) -> Iterator[None]:
        if number == self.steps[0]:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities)
            self._profile.start()
        with torch.profiler.record_function(f"{STEP_MARK}{number}"):
            yield
        if number == self.steps[-1] and self._profile is not None:
            self._profile.stop()
            self._write()

    def _write(self) -> None:
        assert self._profile is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"rank{self.rank}.trace.json"
        self._profile.export_chrome_trace(str(trace))
        self._profile = None
        summary = summarize(json.loads(trace.read_text()))
        (self.out_dir / f"rank{self.rank}.summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def collective_kind(op_name: str) -> str | None:
    """The collective an operator name calls ("c10d::_reduce_scatter_base_" -> "reduce_scatter"),
    or None for an operator that is not one (waits included)."""
    namespace, _, name = op_name.partition("::")
    if namespace not in _COLLECTIVE_NAMESPACES or not name:
        return None
    base = name.strip("_")
    compact = base.replace("_", "")
    if compact.startswith(("wait", "wraptensor")):  # waits, and the functional collectives' autograd wrapper
        return None
    for pattern, kind in (
        ("reducescatter", "reduce_scatter"),
        ("allreduce", "all_reduce"),
        ("allgather", "all_gather"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("send", "send_recv"),
        ("recv", "send_recv"),
    ):
        if pattern in compact:
            return kind
    for kind in ("reduce", "gather", "scatter"):
        if compact.startswith(kind):
            return kind
    return base  # another c10d operator: shown under its own name rather than dropped


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e3  # trace times are microseconds


def _outermost(events: list[dict]) -> list[dict]:
    """The events not nested in another of `events` on the same thread."""
    kept: list[dict] = []
    ends: dict[Any, float] = {}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] + e["dur"] <= ends.get(e["tid"], float("-inf")):
            continue
        kept.append(e)
        ends[e["tid"]] = e["ts"] + e["dur"]
    return kept


def summarize(trace: dict) -> dict[str, Any]:
    """Per-step collectives and host time of a Chrome trace (see the module's docstring), and the
    median over its steps."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    marks = [(int(m.group(1)), e) for e in events if (m := _STEP_RE.match(e.get("name", "")))]
    steps = []
    for number, mark in sorted(marks, key=lambda x: x[0]):
        start, stop = mark["ts"], mark["ts"] + mark["dur"]

        def inside(e: dict, start: float = start, stop: float = stop) -> bool:
            return e["ts"] < stop and e["ts"] + e["dur"] > start

        ops = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == mark["tid"] and inside(e)]
        in_flight = [
            e
            for e in events
            if e.get("cat") == "user_annotation" and inside(e) and e.get("name", "").startswith(_IN_FLIGHT_PREFIXES)
        ]
        busy = [(max(e["ts"], start), min(e["ts"] + e["dur"], stop)) for e in ops + in_flight]
        calls = _outermost(
            [e for e in events if e.get("cat") == "cpu_op" and inside(e) and collective_kind(e["name"]) is not None]
        )
        collectives: dict[str, int] = {}
        for e in calls:
            kind = collective_kind(e["name"])
            collectives[kind] = collectives.get(kind, 0) + 1
        wall_ms, backend_ms = mark["dur"] / 1e3, _union_ms(busy)
        steps.append(
            {
                "step": number,
                "operators": len(_outermost(ops)),
                "wall_ms": wall_ms,
                "backend_ms": backend_ms,
                "host_ms": wall_ms - backend_ms,
                "collectives": dict(sorted(collectives.items())),
            }
        )
    return {"steps": steps, "median": _median(steps)}


def _median(steps: list[dict]) -> dict[str, Any]:
    if not steps:
        return {}
    kinds = sorted({k for s in steps for k in s["collectives"]})
    return {
        **{key: statistics.median(s[key] for s in steps) for key in ("operators", "wall_ms", "backend_ms", "host_ms")},
        "collectives": {k: statistics.median(s["collectives"].get(k, 0) for s in steps) for k in kinds},
    }
