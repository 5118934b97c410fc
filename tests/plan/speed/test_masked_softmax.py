"""Megatron-DeepSpeed's fused softmax of 2021-10 to 2022-03 (masked_softmax.py): its kernel taken
or refused as `is_kernel_available` decides with the batches a block asked for in swapped order,
and the fp32 op-by-op softmax's traffic added to the attention where it is refused."""

from __future__ import annotations

import pytest

from bench import plan_vs_published as published
from harness.plan.speed.compute import memory_bytes_per_s
from harness.plan.speed.masked_softmax import (
    BENCHMARK_BACKWARD_BYTES,
    BENCHMARK_FORWARD_BYTES,
    TORCH_BACKWARD_BYTES,
    TORCH_FORWARD_BYTES,
    batches_per_block,
    fused_softmax_runs,
)
from tests.plan.test_published import _megatron_row


def test_the_kernels_batches_a_block_follow_the_row_length():
    # scaled_masked_softmax.h: 128 threads, a warp of min(next power of two, 32), two rows a warp up to 128.
    assert [batches_per_block(n) for n in (4, 8, 12, 16, 24, 32, 2048)] == [64, 32, 16, 16, 8, 8, 4]


def test_the_kernel_is_refused_where_the_heads_a_gpu_set_the_block():
    # 64 heads over TP 8: 8 a GPU, 32 batches a block: micro-batches 1 and 2 fall back, 4 and 8 fuse.
    assert [fused_softmax_runs(b, 8, 2048) for b in (1, 2, 4, 8)] == [False, False, True, True]
    # 96 over TP 8: 12 a GPU, 16 a block; 64 over TP 4: 16 a GPU, every micro-batch fuses.
    assert [fused_softmax_runs(b, 12, 2048) for b in (1, 2, 4)] == [False, False, True]
    assert all(fused_softmax_runs(b, 16, 2048) for b in (1, 2, 4))
    assert not fused_softmax_runs(4, 16, 4096)  # longer than the kernel's 2048


def _planned(micro_batch: int, token: bool):
    sharding = "megatron tp=2 pp=1 dp=4 ddp attention=math" + (" swapped_softmax_check" if token else "")
    row = _megatron_row(sharding, activation_checkpointing="true", micro_batch=str(micro_batch), grad_accum="1")
    q, plan, skipped = published.question(row)
    assert skipped is None and plan is not None and plan.time is not None and plan.time.work is not None
    return q, plan.time.work


def test_a_refused_kernel_adds_the_fp32_softmaxs_traffic_to_each_forward_and_the_backward():
    q, plain = _planned(2, token=False)
    _, swapped = _planned(2, token=True)  # 16 heads over TP 2: 8 a GPU, 16 batches, refused
    dims = q.shape.dims
    elements = 2 * (dims.heads // 2) * 2048 * 2048 * dims.layers
    forward = elements * (TORCH_FORWARD_BYTES - BENCHMARK_FORWARD_BYTES) / memory_bytes_per_s(q.gpu)
    backward = elements * (TORCH_BACKWARD_BYTES - BENCHMARK_BACKWARD_BYTES) / memory_bytes_per_s(q.gpu)
    assert swapped.attention_s - plain.attention_s == pytest.approx(2 * forward + backward)  # recomputed: twice
    assert swapped.recompute_s - plain.recompute_s == pytest.approx(forward)
    assert swapped.matmul_s == plain.matmul_s


def test_a_fused_kernel_changes_nothing():
    _, plain = _planned(4, token=False)
    _, swapped = _planned(4, token=True)  # 32 batches: fused
    assert swapped == plain
