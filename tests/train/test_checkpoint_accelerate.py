"""Accelerate checkpoints (save_state/load_state): ZeRO-3 weights carried into
accelerate-zero3. Exact resume after a SIGKILL, export, and a world-size change refused for
accelerate-ddp and accelerate-zero2 are checked in test_checkpoint_zero, beside the ZeRO stages'.

The zero3 checkpoint comes from test_checkpoint_zero's session cache.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.train.test_checkpoint import SUM_ORDER_RTOL, losses
from tests.train.test_checkpoint_zero import continued, straight_run

pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("accelerate", "deepspeed", "transformers")),
        reason="needs accelerate, deepspeed and transformers",
    ),
    pytest.mark.timeout(600),
]


@pytest.mark.extended  # a carry across formats runs on every change in test_checkpoint_zero (zero3 -> ddp)
def test_zero3_weights_carried_into_accelerate_zero3_set_the_fp32_master_copy(tmp_path_factory):
    """zero3 -> accelerate-zero3 is a change of format: weights only, Adam afresh, exactly what
    zero3 -> ddp does. The two curves agree at every step only if the carried weights reached
    DeepSpeed's fp32 master partitions too: the optimizer steps those, and a stale master copy
    would overwrite the carried weights at the first step (the loss jumps by ~0.4)."""
    base = tmp_path_factory.getbasetemp()
    source = straight_run("zero3", base) / "checkpoints" / "step_10"
    out, stdout = continued("accelerate-zero3", source, base)
    assert "weights only" in stdout
    under_ddp, _ = continued("ddp", source, base)
    continued_losses, reference = losses(out), losses(under_ddp)
    assert sorted(continued_losses) == sorted(reference) == list(range(11, 21))
    for step, loss in continued_losses.items():
        assert loss == pytest.approx(reference[step], rel=SUM_ORDER_RTOL), step
