"""Accelerate checkpoints (save_state/load_state): exact resume after a SIGKILL under
accelerate-ddp and accelerate-zero2, export from both, ZeRO-3 weights carried into
accelerate-zero3, and a world-size change refused for the ZeRO modes.

The straight runs and the zero3 checkpoint come from test_checkpoint_zero's session cache.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
from safetensors.torch import load_file

import runner
from tests.test_checkpoint import SUM_ORDER_RTOL, _loss_on_step, losses
from tests.test_checkpoint_zero import continued, killed_and_resumed, refuse_one_rank, straight_run

STRATEGIES = ("accelerate-ddp", "accelerate-zero2")

pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("accelerate", "deepspeed", "transformers")),
        reason="needs accelerate, deepspeed and transformers",
    ),
    pytest.mark.timeout(600),
]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_killed_rank_then_resume_matches_the_uninterrupted_run_bit_for_bit(strategy, tmp_path_factory, tmp_path):
    reference = losses(straight_run(strategy, tmp_path_factory.getbasetemp()))
    left, stdout = killed_and_resumed(strategy, tmp_path / "killed")
    assert left == ["step_10"]
    assert "resumed at step 10" in stdout and "model and optimizer state" in stdout
    assert losses(tmp_path / "killed") == reference


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_export_loads_strictly_and_gives_the_live_models_loss(strategy, tmp_path_factory, tmp_path):
    out = straight_run(strategy, tmp_path_factory.getbasetemp())
    target = tmp_path / f"{strategy}.safetensors"
    assert runner.main(["export", str(out / "checkpoints" / "step_10"), str(target)]) == 0
    weights = load_file(target)
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert _loss_on_step(weights, 10) == pytest.approx(losses(out)[11], rel=SUM_ORDER_RTOL)


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
