"""Which of a pipeline stage's critical-path communication scales with its blocks. The stage is
planned as the fullest GPU's blocks with the head and the loss (pipeline_context.py); a GPU with
fewer blocks runs fewer of each block's exchanges, so the slowest GPU's micro-batch is its compute
plus its own blocks' share of them. Told apart from each collective's own fields: tensor
parallelism's collectives in the critical path run TP_ROOT_CALLS calls for the embedding and the
head beside the blocks', every call priced alike (fabric.collective_seconds: `calls` equal shares of
the payload), so the blocks' share of their seconds is their calls'; a mixture's expert all-to-alls
run in its MoE blocks alone; async TP's unhidden copies are those of the blocks' fused matmuls; the
wait tensor parallelism across nodes adds (SharedCards) is its tensor-parallel collectives' and
scales as they do. The embedding's and the head's calls run on the GPU that holds each, one of the
TP_ROOT_CALLS apiece (`root_recurring_s`). What else a micro-step runs in its critical path is not a
block's and stays the planned stage's."""

from __future__ import annotations

from collections.abc import Callable

from harness.plan.network.comm import TP_ROOT_CALLS, Collective, SharedCards
from harness.plan.network.expert_comm import DISPATCH_WHAT
from harness.plan.network.fabric import Topology
from harness.plan.speed.step_time import StepTime


def _share(c: Collective, plain: Callable[[Collective], float], topology: Topology, host_bytes_per_s: float) -> float:
    """The share of `c`'s seconds that `plain` gives a collective of its own; a SharedCards wait, its
    tensor-parallel collectives' shares weighted by their seconds (the wait scales as they do)."""
    if isinstance(c, SharedCards):
        tensor = [
            (_share(t, plain, topology, host_bytes_per_s), t.seconds(topology, host_bytes_per_s))
            for t in c.tensor_parallel
        ]
        total = sum(seconds for _, seconds in tensor)
        return sum(share * seconds for share, seconds in tensor) / total if total > 0 else 0.0
    return plain(c)


def _blocks_part(c: Collective) -> float:
    if c.what.startswith(DISPATCH_WHAT):
        return 1.0
    if c.what.startswith("tensor-parallel") and c.calls > 0:
        return max(0, c.calls - TP_ROOT_CALLS) / c.calls
    return 0.0


def _roots_part(c: Collective) -> float:
    if c.what.startswith("tensor-parallel") and c.calls > 0:
        return min(c.calls, TP_ROOT_CALLS) / c.calls
    return 0.0


def _critical_path(collectives: list[Collective]) -> list[Collective]:
    """The collectives every micro-step runs in its critical path."""
    return [c for c in collectives if c.window is None and c.per_micro_step]


def block_share(c: Collective, topology: Topology, host_bytes_per_s: float) -> float:
    """The share of `c`'s seconds that a stage's blocks run (0 for what does not scale with them)."""
    return _share(c, _blocks_part, topology, host_bytes_per_s)


def block_recurring_s(
    t: StepTime, collectives: list[Collective], topology: Topology, host_bytes_per_s: float, micro_steps: int
) -> float:
    """Of `t.recurring_comm_s` (step_time's: async TP's unhidden copies and the critical-path
    collectives every micro-step runs), the seconds a step that the planned stage's blocks run."""
    exposed = _critical_path(collectives)
    listed = sum(c.seconds(topology, host_bytes_per_s) for c in exposed)
    copies = max(0.0, t.recurring_comm_s - micro_steps * listed)  # async TP's, beside the blocks' fused matmuls
    blocks = sum(block_share(c, topology, host_bytes_per_s) * c.seconds(topology, host_bytes_per_s) for c in exposed)
    return copies + micro_steps * blocks


def root_recurring_s(
    collectives: list[Collective], topology: Topology, host_bytes_per_s: float, micro_steps: int
) -> float:
    """Of the critical-path collectives every micro-step runs, the seconds a step of the embedding's and
    the head's tensor-parallel calls (TP_ROOT_CALLS of each, one apiece), which the planned stage runs
    both of and a pipeline's first GPU only the embedding's, its last only the head's."""
    return micro_steps * sum(
        _share(c, _roots_part, topology, host_bytes_per_s) * c.seconds(topology, host_bytes_per_s)
        for c in _critical_path(collectives)
    )
