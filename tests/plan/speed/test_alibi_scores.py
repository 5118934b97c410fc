"""Megatron-DeepSpeed's ALiBi through baddbmm's beta (alibi_scores.py): the bias copied into every
score and read back by the matmul, in each forward, beside the unfused attention only."""

from __future__ import annotations

import pytest

from harness.plan.speed.alibi_scores import ALIBI_SCORE_BYTES
from harness.plan.speed.compute import memory_bytes_per_s
from tests.plan.test_published import _planned_row


def _work(tail: str):
    q, plan = _planned_row(
        f"megatron tp=2 pp=1 dp=4 ddp {tail}", activation_checkpointing="true", micro_batch="2", grad_accum="1"
    )
    return q, plan.time.work


def test_alibi_adds_a_copy_and_a_read_of_every_score_in_each_forward():
    q, plain = _work("attention=fused_softmax")
    _, alibi = _work("attention=fused_softmax alibi")
    dims = q.shape.dims
    forward = 2 * (dims.heads // 2) * 2048 * 2048 * dims.layers * ALIBI_SCORE_BYTES / memory_bytes_per_s(q.gpu)
    assert alibi.attention_s - plain.attention_s == pytest.approx(2 * forward)  # full checkpointing: twice
    assert alibi.recompute_s - plain.recompute_s == pytest.approx(forward)
    assert alibi.backward_s == pytest.approx(plain.backward_s + forward)  # the recomputed forward, no gradient


def test_a_fused_attention_kernel_takes_its_bias_inside():
    _, plain = _work("attention=flash")
    _, alibi = _work("attention=flash alibi")
    assert alibi == plain
