"""How the pipeline runtime cuts a model's blocks into stages, without torch, so that the cut
(models/stage_plan.py) and the planner (harness/plan/parallel/pipeline_cost.py) count the same
blocks on each stage."""

from __future__ import annotations


def blocks_per_stage(n_blocks: int, stages: int) -> list[range]:
    """The blocks of each stage, in order: as even as they go, the earlier stages one more."""
    base, extra = divmod(n_blocks, stages)
    out, start = [], 0
    for stage in range(stages):
        size = base + (1 if stage < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out
