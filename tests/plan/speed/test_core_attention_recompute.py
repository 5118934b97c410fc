"""Megatron-LM's selective recomputation (the core attention alone) in the plan: one more attention
forward a layer and micro-step, no matmul or collective again, and the attention kernel's own
tensors (its log-sum-exp; the unfused kernel's softmax) not kept but rebuilt a layer at a time."""

from __future__ import annotations

import pytest

from harness.common.hardware import gpu_spec
from harness.plan.memory.activations import LOGSUMEXP_BYTES, activations
from harness.plan.model.model_shape import PlanError
from harness.plan.speed.attention import attention_seconds
from harness.plan.speed.compute import memory_bytes_per_s
from harness.plan.speed.masked_softmax import fused_softmax_bytes
from harness.plan.speed.score_traffic import score_elements
from tests.plan.test_published import _planned_row


def _planned(checkpointing: str, attention: str = "flash"):
    return _planned_row(
        f"megatron tp=2 pp=1 dp=4 distributed_optimizer attention={attention}",
        activation_checkpointing=checkpointing,
        micro_batch="1",
        grad_accum="1",
    )


def test_megatron_selective_runs_each_layers_attention_forward_again() -> None:
    q, none = _planned("false")
    q_sel, selective = _planned("selective")
    assert q_sel.checkpointing == "none" and q_sel.core_attention_recompute
    dims = q.shape.dims
    forward, _ = attention_seconds(
        gpu_spec("H100-80"), "flash", "bf16", batch=1, seq=2048, heads=dims.heads // 2, head_dim=dims.head_dim
    )
    again = selective.time.work.recompute_s - none.time.work.recompute_s
    assert again == pytest.approx(forward * dims.layers)
    assert selective.time.work.matmul_s == none.time.work.matmul_s  # no projection recomputed
    assert [c.wire_bytes() for c in selective.collectives] == [c.wire_bytes() for c in none.collectives]
    _, full = _planned("true")
    assert full.time.work.recompute_s > 5 * again  # full recomputes every block's whole forward


def test_flash_attention_keeps_all_but_its_log_sum_exp() -> None:
    q, none = _planned("false")
    _, selective = _planned("selective")
    dims, tokens = q.shape.dims, 2048
    lse = dims.heads * LOGSUMEXP_BYTES * tokens / 2  # per layer, on one of tp=2 GPUs
    assert none.activations.blocks - selective.activations.blocks == pytest.approx(dims.layers * lse, rel=1e-6)
    assert selective.activations.rebuilt == pytest.approx(lse, rel=1e-6)


def test_the_unfused_kernel_drops_its_softmax() -> None:
    q, none = _planned("false", attention="math")
    _, selective = _planned("selective", attention="math")
    dims = q.shape.dims
    softmax = dims.heads * 2048 * 2 * 2048 / 2  # heads x T per token in bf16, T tokens, over tp=2
    assert none.activations.blocks - selective.activations.blocks > dims.layers * softmax * 0.99
    assert selective.peak_bytes < none.peak_bytes


def test_core_attention_recompute_is_its_own_granularity() -> None:
    q, _ = _planned("false")
    with pytest.raises(PlanError, match="does not combine with activation_checkpointing=full"):
        activations(
            q.shape,
            micro_batch=1,
            seq_len=2048,
            precision="bf16",
            mixed_precision="low_precision",
            checkpointing="full",
            core_attention_recompute=True,
        )


def test_megatrons_softmax_runs_again_with_the_core_attention() -> None:
    """The recomputed core attention runs Megatron's fused softmax again: its score traffic beside the
    `math` rate's (masked_softmax.py) is in the recomputed forward as in the first."""
    q, none = _planned("false", attention="fused_softmax")
    _, selective = _planned("selective", attention="fused_softmax")
    _, math_none = _planned("false", attention="math")
    _, math_selective = _planned("selective", attention="math")
    dims = q.shape.dims
    forward_bytes, _ = fused_softmax_bytes(1, dims.heads // 2, 2048)
    softmax_again = forward_bytes * score_elements(dims, 1, 2048, 2) / memory_bytes_per_s(gpu_spec("H100-80"))
    again = selective.time.work.recompute_s - none.time.work.recompute_s
    math_again = math_selective.time.work.recompute_s - math_none.time.work.recompute_s
    assert forward_bytes < 0 and again == pytest.approx(math_again + softmax_again)
