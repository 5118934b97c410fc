"""Accelerate checkpoints (save_state/load_state): ZeRO-3 weights carried into
accelerate-zero3, and a world-size change refused for the ZeRO modes. Exact resume after
a SIGKILL and export for accelerate-ddp and accelerate-zero2 are checked in
test_checkpoint_zero, beside the ZeRO stages'.

The straight runs and the zero3 checkpoint come from test_checkpoint_zero's session cache.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.train.test_checkpoint import SUM_ORDER_RTOL, losses
from tests.train.test_checkpoint_zero import continued, refuse_one_rank, straight_run

pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("accelerate", "deepspeed", "transformers")),
        reason="needs accelerate, deepspeed and transformers",
    ),
    pytest.mark.timeout(600),
]


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


def test_a_world_size_change_is_refused_in_one_line_for_the_zero_modes(tmp_path_factory):
    checkpoint = straight_run("accelerate-zero2", tmp_path_factory.getbasetemp()) / "checkpoints" / "step_10"
    assert "saved by 2 ranks and accelerate-zero2 cannot reshard it to 1: resume with nproc=2" in refuse_one_rank(
        "accelerate-zero2", checkpoint
    )
