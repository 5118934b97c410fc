"""The inputs that only a mixture of experts has a meaning for, refused in one line on a dense model.

`strategy_options.ep_size=` above 1 splits a mixture's experts over GPUs: `train` refuses it on a model
without experts (strategies/torch_mesh.py `_check_experts`), so a plan does too rather than answer for
the strategies it could still plan without it. `moe_imbalance=` is the busiest GPU's expert load over
the mean: a dense model has none, and a plan that quietly dropped it would answer another question.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.common.numbers import is_whole
from harness.plan.model.model_shape import PlanError, TransformerDims


def _expert_parallel_given(strategy_options: Mapping[str, Any]) -> list[str]:
    """Each `strategy_options` entry that sets ep_size above 1, as the user wrote it (a compare-wide
    `ep_size` or a strategy's own section's)."""
    given = [("", strategy_options.get("ep_size"))]
    given += [(f"{name}.", own.get("ep_size")) for name, own in strategy_options.items() if isinstance(own, Mapping)]
    return [f"strategy_options.{where}ep_size={value}" for where, value in given if is_whole(value) and value > 1]


def check_mixture_inputs(
    name: str, dims: TransformerDims | None, strategy_options: Mapping[str, Any], moe_imbalance: float
) -> None:
    """A PlanError (one line) for an input of a mixture of experts given for model `name` without experts."""
    if dims is not None and dims.moe is not None:
        return
    for option in _expert_parallel_given(strategy_options):
        raise PlanError(
            f"{option} splits a mixture of experts' experts over GPUs, and {name} has none (train refuses it): "
            "drop it, or plan a mixture such as mixtral-8x7b or qwen3-30b-a3b"
        )
    if moe_imbalance != 1.0:
        raise PlanError(
            f"moe_imbalance={moe_imbalance:g} is a mixture of experts' busiest GPU's expert load over the mean, and "
            f"{name} has no experts: leave it out"
        )
