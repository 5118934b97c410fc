"""The precisions a plan prices that `train` does not run: said beside the table, as the strategy
options' what-ifs are (planned_options.what_if_lines), so that a plan in fp8 or fp4 does not read as a
run parabench can measure.

The planner prices fp8 for every strategy (torchao's float8 or TransformerEngine's, as published runs
train), but `train` runs torchao's float8 only where the strategy says it does (Strategy.fp8_refusal:
DeepSpeed's engines and DataParallel do not; the torch mesh's, not beside tensor parallel,
strategies/torch_mesh.py), and has no fp4 at all (configs/schema.py's PRECISIONS).
"""

from __future__ import annotations

import re

from configs.schema import PRECISIONS
from harness.plan.parallel.layout import is_mesh_preset
from harness.plan.predict import StrategyPlan

# A torch mesh preset with tp in its mesh says why it does not train fp8 beside tensor parallel.
WITH_TP = {"mesh_dims": "tp"}
ADVICE = r"[:;] compare it with precision=bf16$"  # a compare's advice, not the plan's


def fp8_refusal(p: StrategyPlan) -> str | None:
    """Why `train` would not run plan `p` with precision=fp8, as the strategy says it; None where it would
    (or where `p` is not a registered strategy's: a published run's layout)."""
    from strategies.registry import default_registry

    registry = default_registry()
    name = p.backend.measured_as
    if name not in registry.names():
        return None
    entry = registry.get(name)
    if entry.cls is None:  # not installed here: no precision of it runs, which `runner.py list` says
        return None
    if not is_mesh_preset(p.backend):
        return entry.fp8_refusal()
    # torch_mesh.py refuses fp8 by the run's tp, whatever its preset's mesh names
    return entry.cls.fp8_refusal(WITH_TP) if p.layout.tp > 1 else None


def precision_lines(precision: str, plans: list[StrategyPlan]) -> list[str]:
    """A line for each reason `train` would not run these plans at `precision`: what the plan priced
    there is the planner's what-if, which no compare can measure yet."""
    if precision not in PRECISIONS:
        return [
            f"precision={precision} is a what-if of the planner: train runs {', '.join(PRECISIONS)}, so no "
            "compare can measure it yet."
        ]
    if precision != "fp8":
        return []
    refused: dict[str, list[str]] = {}
    for p in plans:
        why = fp8_refusal(p)
        if why is not None and p.name not in refused.get(why, []):
            refused.setdefault(why, []).append(p.name)
    return [
        f"precision=fp8 is a what-if of the planner for {', '.join(names)}: train refuses it there (each "
        f"{re.sub(ADVICE, '', why)}), so no compare can measure it yet."
        for why, names in refused.items()
    ]
