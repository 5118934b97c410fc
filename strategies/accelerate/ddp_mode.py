"""`accelerate-ddp`: Accelerate driving DistributedDataParallel (MULTI_CPU over gloo on a CPU)."""

from __future__ import annotations

from typing import Any

from strategies.accelerate.driver import AccelerateStrategy
from strategies.base import Preset
from strategies.plan_model import PlanModel


class AccelerateDDPStrategy(AccelerateStrategy):
    description = "Accelerate driving DistributedDataParallel"
    presets = (
        Preset("accelerate-ddp", description, plan=PlanModel("torch", 0, via_accelerate=True, data_parallel=True)),
    )

    @property
    def mode(self) -> str:
        return "ddp"

    @classmethod
    def recovers_from_oom(cls, options: dict[str, Any]) -> bool:
        return True  # teardown frees the Accelerator and resets its process-wide state

    def _handlers(self) -> list[Any]:
        from accelerate.utils import DistributedDataParallelKwargs

        # As the native ddp and a hand-written DDP loop: gradients live in the all-reduce buckets,
        # one copy of them, not a second one DDP copies into every step (torch's default).
        return [DistributedDataParallelKwargs(gradient_as_bucket_view=True)]
