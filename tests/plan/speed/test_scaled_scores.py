"""An unfused attention that scales its scores and masks them with masked_fill in passes of their own
(scaled_scores.py): 4 more bytes a score element each forward and 8 each backward than the `math`
rate holds, two more kernels a layer each way, beside the unfused attention only."""

from __future__ import annotations

import pytest

from harness.plan.speed.compute import memory_bytes_per_s
from harness.plan.speed.scaled_scores import (
    SCALED_SCORES_BACKWARD_BYTES,
    SCALED_SCORES_FORWARD_BYTES,
    scaled_scores_kernels,
)
from tests.plan.test_published import _planned_row


def _plan(tail: str, checkpointing: str = "false"):
    return _planned_row(
        f"megatron tp=2 pp=1 dp=4 ddp {tail}", activation_checkpointing=checkpointing, micro_batch="2", grad_accum="1"
    )


def test_the_scale_and_the_mask_pass_over_every_score_forward_and_backward():
    q, plain = _plan("attention=math")
    _, scaled = _plan("attention=math scaled_scores")
    dims = q.shape.dims
    per_byte = 2 * (dims.heads // 2) * 2048 * 2048 * dims.layers / memory_bytes_per_s(q.gpu)
    a, b = plain.time.work, scaled.time.work
    assert b.forward_s - a.forward_s == pytest.approx(SCALED_SCORES_FORWARD_BYTES * per_byte)
    assert b.backward_s - a.backward_s == pytest.approx(SCALED_SCORES_BACKWARD_BYTES * per_byte)
    assert b.recompute_s == a.recompute_s
    assert scaled.time.host.kernels - plain.time.host.kernels == 4 * dims.layers


def test_full_checkpointing_runs_the_scale_and_the_mask_again():
    q, plain = _plan("attention=math", "true")
    _, scaled = _plan("attention=math scaled_scores", "true")
    dims = q.shape.dims
    forward = SCALED_SCORES_FORWARD_BYTES * 2 * (dims.heads // 2) * 2048 * 2048 * dims.layers
    assert scaled.time.work.recompute_s - plain.time.work.recompute_s == pytest.approx(
        forward / memory_bytes_per_s(q.gpu)
    )
    assert scaled_scores_kernels(dims.layers, recomputed=True).again == 2 * dims.layers


def test_a_fused_attention_kernel_scales_and_masks_inside():
    _, plain = _plan("attention=flash")
    _, scaled = _plan("attention=flash scaled_scores")
    assert scaled.time == plain.time
