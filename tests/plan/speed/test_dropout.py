"""Dropout (speed/dropout.py, the masks in memory/activations.py): what torch's dropout keeps and
moves, held against autograd's saved tensors, and what a plan adds for it by kernel and engine."""

from __future__ import annotations

import pytest
import torch

from bench import plan_vs_published as published
from harness.plan.memory.activations import core_attention_bytes_per_token
from harness.plan.memory.recipe import Recipe
from harness.plan.model.model_shape import PlanError
from harness.plan.speed.compute import memory_bytes_per_s
from harness.plan.speed.dropout import (
    FUSED_DROPOUT_BYTES,
    HIDDEN_SITES,
    MASK_BYTES,
    Dropout,
    dropout_kernels,
    eager_dropout_bytes,
    softmax_fused_dropout_bytes,
)
from tests.plan.test_published import _megatron_row, _planned_row
from tests.saved_tensors import saved_bytes


def _dropout(t: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout as torch runs it on a GPU: F.dropout takes the fused `native_dropout` for a CUDA tensor
    (aten/src/ATen/native/Dropout.cpp `is_fused_kernel_acceptable`); on the CPU it multiplies by a
    mask of the input's dtype instead, so the test calls the GPU's op itself."""
    return torch.native_dropout(t, p, True)[0] if p > 0 else t


def test_torchs_dropout_keeps_a_bool_mask_a_byte_an_element():
    x = torch.randn(6, 50, dtype=torch.bfloat16, requires_grad=True)
    assert saved_bytes(lambda: _dropout(x, 0.1), [x]) == x.numel() * MASK_BYTES


def test_the_unfused_attentions_dropout_keeps_what_the_plan_counts():
    """Scores, softmax, dropout, then the second batched matmul: with dropout autograd keeps the mask
    and the dropped probabilities beside the softmax's output (core_attention_bytes_per_token)."""
    batch_heads, seq, head_dim = 4, 32, 8
    q = torch.randn(batch_heads, seq, head_dim, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch_heads, seq, head_dim, dtype=torch.bfloat16, requires_grad=True)

    def attention(p: float):
        return lambda q, v: torch.bmm(_dropout(torch.softmax(q @ q.transpose(1, 2), -1), p), v)

    extra = saved_bytes(lambda: attention(0.1)(q, v), [q, v]) - saved_bytes(lambda: attention(0.0)(q, v), [q, v])
    dims = published.shape_of_row(_megatron_row("megatron tp=1 dp=8 ddp")).dims
    per_score = (
        core_attention_bytes_per_token(dims, 2, "fused_softmax", seq, dropout=True)
        - core_attention_bytes_per_token(dims, 2, "fused_softmax", seq)
    ) / (dims.heads * seq)
    assert extra == batch_heads * seq * seq * per_score == batch_heads * seq * seq * (MASK_BYTES + 2)
    assert core_attention_bytes_per_token(dims, 2, "flash", seq, dropout=True) == core_attention_bytes_per_token(
        dims, 2, "flash", seq
    )  # the fused kernels keep no mask


def _work(sharding_tail: str, checkpointing: str = "true"):
    return _planned_row(
        f"megatron tp=2 pp=1 dp=4 ddp {sharding_tail}",
        activation_checkpointing=checkpointing,
        micro_batch="2",
        grad_accum="1",
    )


def _per_element(q) -> tuple[float, float]:
    """Seconds a byte of every score element and of every hidden dropout's element takes."""
    dims, rate = q.shape.dims, memory_bytes_per_s(q.gpu)
    scores = 2 * (dims.heads // 2) * 2048 * 2048 * dims.layers / rate
    hidden = HIDDEN_SITES * 2 * 2048 * dims.width * dims.layers / rate  # no sequence parallelism: whole
    return scores, hidden


def test_megatrons_attention_dropout_is_an_op_of_its_own_and_its_hidden_ones_ride_the_fused_add():
    q, plain = _work("attention=fused_softmax")
    _, dropped = _work("attention=fused_softmax dropout=0.1")
    scores, hidden = _per_element(q)
    forward, backward = eager_dropout_bytes(2)
    hidden_forward, hidden_backward = FUSED_DROPOUT_BYTES
    a, b = plain.time.work, dropped.time.work
    # Full checkpointing draws every forward's dropout again.
    assert b.attention_s - a.attention_s == pytest.approx(scores * (2 * forward + backward))
    assert b.elementwise_s - a.elementwise_s == pytest.approx(hidden * (2 * hidden_forward + hidden_backward))
    assert b.recompute_s - a.recompute_s == pytest.approx(scores * forward + hidden * hidden_forward)
    assert b.matmul_s == a.matmul_s
    # One kernel each way a layer for the attention's, forward, backward and again.
    assert dropped.time.host.kernels - plain.time.host.kernels == 3 * q.shape.dims.layers


def test_oneflows_softmax_draws_the_attentions_dropout_itself():
    q, plain = _work("attention=fused_softmax")
    _, fused = _work("attention=fused_softmax dropout=0.1 softmax_dropout_fusion")
    scores, hidden = _per_element(q)
    forward, backward = softmax_fused_dropout_bytes(2)
    a, b = plain.time.work, fused.time.work
    assert (forward, backward) == (3, 1)
    assert b.attention_s - a.attention_s == pytest.approx(scores * (2 * forward + backward))
    assert fused.time.host.kernels == plain.time.host.kernels


def test_a_fused_attention_kernel_adds_only_the_hidden_masks():
    q, plain = _work("attention=flash", checkpointing="false")
    _, dropped = _work("attention=flash dropout=0.1", checkpointing="false")
    _, hidden = _per_element(q)
    a, b = plain.time.work, dropped.time.work
    assert b.attention_s == a.attention_s
    assert b.elementwise_s - a.elementwise_s == pytest.approx(hidden * sum(FUSED_DROPOUT_BYTES))
    # The masks held for the backward: two a block, a byte an element of the whole residual stream.
    tokens = 2 * 2048
    masks = HIDDEN_SITES * q.shape.dims.width * MASK_BYTES * tokens * q.shape.dims.layers
    assert dropped.activations.blocks - plain.activations.blocks == pytest.approx(masks, abs=q.shape.dims.layers)


def test_eager_dropout_launches_its_own_kernels():
    dims = published.shape_of_row(_megatron_row("megatron tp=1 dp=8 ddp")).dims
    eager = Dropout(attention=True, hidden=True, hidden_fused=False, attention_fused=False)
    kernels = dropout_kernels(dims, eager, "math", "full")
    assert (kernels.forward, kernels.backward, kernels.again) == (3 * dims.layers,) * 3
    assert dropout_kernels(dims, eager, "flash", "none").total == 2 * HIDDEN_SITES * dims.layers
    fused = Dropout(attention=True, hidden=True, hidden_fused=True, attention_fused=True)
    assert dropout_kernels(dims, fused, "math", "full").total == 0


@pytest.mark.parametrize("probability", [-0.1, 1.0])
def test_a_dropout_probability_out_of_range_is_one_line(probability):
    with pytest.raises(PlanError, match="dropout probability"):
        Recipe(attention_dropout=probability).check("bf16")
