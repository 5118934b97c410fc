"""A micro-step's compute work as the planner plans it, on the options the speed tests share."""

from __future__ import annotations

from harness.common.hardware import GPUS
from harness.plan.speed.compute import ComputeWork, compute_work


def step_work(shape, **overrides) -> ComputeWork:
    """compute_work of `shape` at micro-batch 16 x 1,024, bf16 under autocast, eager, no checkpointing,
    flash attention, on an H100, with `overrides` in place of any of them."""
    base = dict(
        micro_batch=16,
        seq_len=1024,
        precision="bf16",
        mixed_precision="autocast",
        compiled=False,
        checkpointing="none",
        fused_loss=False,
        attention="flash",
        gpu=GPUS["H100"],
        optimizer_params=shape.params,
        engine="torch",
    )
    return compute_work(shape, **{**base, **overrides})
