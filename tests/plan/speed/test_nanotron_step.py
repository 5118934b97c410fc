"""nanotron's step (nanotron_step.py): its fp32 cast of the logits and cross-entropy for compute.py's eager
loss, its FP32GradientAccumulator's passes over the gradients and parameters, nothing else changed."""

from __future__ import annotations

import pytest

from bench import plan_vs_published as published
from harness.plan.speed.compute import LOSS_BYTES_PER_LOGIT, memory_bytes_per_s
from harness.plan.speed.nanotron_step import (
    ACCUMULATE_BYTES_PER_PARAM,
    COPY_BACK_BYTES_PER_PARAM,
    DDP_BUCKET_BYTES_PER_PARAM,
    GLU_SPLIT_BACKWARD_BYTES,
    LOSS_BACKWARD_BYTES_PER_LOGIT,
    LOSS_FORWARD_BYTES_PER_LOGIT,
    ZERO_BYTES_PER_PARAM,
)
from tests.plan.test_published import _megatron_row

TP, MICRO_BATCH, SEQ = 2, 2, 2048


def _planned(token: bool):
    sharding = f"megatron tp={TP} pp=1 dp=4 ddp attention=flash" + (" nanotron" if token else "")
    row = _megatron_row(sharding, micro_batch=str(MICRO_BATCH), mp_mode="fp32 main parameters and gradient reduction")
    q, plan, skipped = published.question(row)
    assert skipped is None and plan is not None and plan.time is not None and plan.time.work is not None
    return q, plan.time.work


def test_the_loss_is_the_casts_and_the_five_passes_over_fp32_logits():
    # cast 2 + 4; max 4; subtract 4 + 4; exp 4 + 4; sum 4; divide 4 + 4. Backward: multiply 4 + 4; cast 4 + 2.
    assert (LOSS_FORWARD_BYTES_PER_LOGIT, LOSS_BACKWARD_BYTES_PER_LOGIT) == (38, 14)
    assert LOSS_FORWARD_BYTES_PER_LOGIT + LOSS_BACKWARD_BYTES_PER_LOGIT > LOSS_BYTES_PER_LOGIT["eager"]


def test_nanotron_adds_its_loss_and_its_fp32_accumulation_to_megatrons_step():
    q, plain = _planned(token=False)
    _, nanotron = _planned(token=True)
    bandwidth = memory_bytes_per_s(q.gpu)
    dims = q.shape.dims
    logits = MICRO_BATCH * SEQ * dims.vocab / dims.head_split(TP)
    params = q.shape.params / TP
    loss_forward = LOSS_FORWARD_BYTES_PER_LOGIT * logits / bandwidth
    assert nanotron.loss_s == pytest.approx(loss_forward + LOSS_BACKWARD_BYTES_PER_LOGIT * logits / bandwidth)
    assert nanotron.forward_s - plain.forward_s == pytest.approx(loss_forward - plain.loss_s / 3)
    accumulate = ACCUMULATE_BYTES_PER_PARAM * params / bandwidth
    assert not dims.gated_mlp  # a GPT: no gate to split
    assert nanotron.elementwise_s - plain.elementwise_s == pytest.approx(accumulate)
    # dp 4, no ZeRO: every parameter stepped, and copied into DDP's bucket
    step = (ZERO_BYTES_PER_PARAM + COPY_BACK_BYTES_PER_PARAM + DDP_BUCKET_BYTES_PER_PARAM) * params / bandwidth
    assert nanotron.optimizer_s - plain.optimizer_s == pytest.approx(step)
    assert (nanotron.matmul_s, nanotron.attention_s) == (plain.matmul_s, plain.attention_s)


def test_a_gated_mlps_split_gradients_are_concatenated_in_the_backward():
    row = published.read_rows(published.DATA / "nanotron_playbook_tp.csv")[0]  # the 3B Llama at TP 2
    plain_row = {**row, "sharding": row["sharding"].replace(" nanotron", "")}
    q, plan, _ = published.question(row)
    _, plain, _ = published.question(plain_row)
    dims, tp, tokens = q.shape.dims, 2, q.micro_batch * q.seq_len
    bandwidth = memory_bytes_per_s(q.gpu)
    split = GLU_SPLIT_BACKWARD_BYTES * tokens * dims.layers * 2 * dims.ffn_width / tp / bandwidth
    accumulate = ACCUMULATE_BYTES_PER_PARAM * q.shape.params / tp / bandwidth
    assert plan.time.work.elementwise_s - plain.time.work.elementwise_s == pytest.approx(split + accumulate)
    step = (ZERO_BYTES_PER_PARAM + COPY_BACK_BYTES_PER_PARAM) * q.shape.params / tp / bandwidth  # dp 1: no DDP
    assert plan.time.work.optimizer_s - plain.time.work.optimizer_s == pytest.approx(step)


def test_nanotron_beside_another_layout_is_refused():
    row = _megatron_row("FSDP tp=2 nanotron attention=flash")
    with pytest.raises(published.PublishedError, match="nanotron"):
        published.question(row)
