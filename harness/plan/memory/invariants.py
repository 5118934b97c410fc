"""What every plan's memory must satisfy, whatever the question: no term below zero, and a peak
no lower than the model states the GPU holds through the step (its parameters, gradients and
optimizer state on the GPU). A plan that breaks one is a fault of the planner, not of the
question: it stops with the term named rather than print an impossible figure.
"""

from __future__ import annotations

from harness.plan.memory.activations import Activations
from harness.plan.memory.buffers import Buffers
from strategies.memory import MemoryBreakdown


class PlanInvariantError(RuntimeError):
    """A plan whose memory cannot be: a term below zero, or a peak below what must be resident."""


def memory_violations(
    states: MemoryBreakdown, acts: Activations | None, buffers: Buffers, peak: int | None, device: str = "cuda"
) -> list[str]:
    """Each broken invariant, in words (empty: the plan's memory is physically possible)."""
    found = []
    for category, by_device in states.as_dict().items():
        found += [f"{category} on {where}: {n} bytes" for where, n in by_device.items() if n < 0]
    if acts is not None:
        found += [
            f"activations ({part}): {n} bytes"
            for part, n in (("blocks", acts.blocks), ("head", acts.head), ("rebuilt", acts.rebuilt))
            if n < 0
        ]
    for phase in (buffers.backward, buffers.hooks, buffers.step):
        found += [f"buffer {name}: {n} bytes" for name, n in phase.items() if n < 0]
    resident = sum(getattr(states, c).get(device, 0) for c in ("params", "grads", "optimizer"))
    if peak is not None and peak < resident:
        found.append(f"peak {peak} bytes below the {resident} bytes of model states the GPU holds")
    return found


def check_memory(
    name: str, states: MemoryBreakdown, acts: Activations | None, buffers: Buffers, peak: int | None
) -> None:
    """Raise PlanInvariantError where `name`'s plan breaks an invariant."""
    found = memory_violations(states, acts, buffers, peak)
    if found:
        raise PlanInvariantError(f"plan of {name}: {'; '.join(found)}")
