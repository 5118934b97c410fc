"""Megatron's fused softmax (masked_softmax.py): its kernel taken or refused as `is_kernel_available`
decides (with the batches a block asked for in swapped order in Megatron-DeepSpeed of 2021-10 to
2022-03), the kernel's single pass taken off the `math` rate's two, and the fp32 op-by-op softmax's
traffic added where the kernel is refused."""

from __future__ import annotations

import pytest

from harness.plan.speed.compute import memory_bytes_per_s
from harness.plan.speed.masked_softmax import (
    BENCHMARK_BACKWARD_BYTES,
    BENCHMARK_FORWARD_BYTES,
    FALLBACK_EXTRA_KERNELS,
    FUSED_FORWARD_BYTES,
    TORCH_BACKWARD_BYTES,
    TORCH_FORWARD_BYTES,
    batches_per_block,
    fused_softmax_runs,
)
from tests.plan.test_published import _planned_row


def test_the_kernels_batches_a_block_follow_the_row_length():
    # scaled_masked_softmax.h: 128 threads, a warp of min(next power of two, 32), two rows a warp up to 128.
    assert [batches_per_block(n) for n in (4, 8, 12, 16, 24, 32, 2048)] == [64, 32, 16, 16, 8, 8, 4]


def test_the_swapped_check_refuses_where_the_heads_a_gpu_set_the_block():
    # 64 heads over TP 8: 8 a GPU, 32 batches a block: micro-batches 1 and 2 fall back, 4 and 8 fuse.
    assert [fused_softmax_runs(b, 8, 2048, swapped=True) for b in (1, 2, 4, 8)] == [False, False, True, True]
    # 96 over TP 8: 12 a GPU, 16 a block; 64 over TP 4: 16 a GPU, every micro-batch fuses.
    assert [fused_softmax_runs(b, 12, 2048, swapped=True) for b in (1, 2, 4)] == [False, False, True]
    assert all(fused_softmax_runs(b, 16, 2048, swapped=True) for b in (1, 2, 4))
    assert not fused_softmax_runs(4, 16, 4096, swapped=True)  # longer than that version's 2048


def test_megatrons_own_check_asks_only_for_batches_in_fours_up_to_4096_keys():
    # A row of 2,048 or 4,096 keys: 4 batches a block, so every micro-batch x heads divisible by 4 fuses.
    assert all(fused_softmax_runs(b, 8, 2048) for b in (1, 2, 4))
    assert fused_softmax_runs(1, 4, 4096) and not fused_softmax_runs(1, 2, 2048)  # 2 batches: not by 4
    assert not fused_softmax_runs(1, 8, 8192)  # past the kernel's 4096: the fp32 path


def _planned(micro_batch: int, sharding_tail: str, seq_len: str = "2048"):
    q, plan = _planned_row(
        f"megatron tp=2 pp=1 dp=4 ddp {sharding_tail}",
        activation_checkpointing="true",
        micro_batch=str(micro_batch),
        grad_accum="1",
        seq_len=seq_len,
    )
    return q, plan.time.work


def _bytes_time(q, forward_bytes: float, backward_bytes: float, micro_batch: int, seq: int = 2048):
    dims = q.shape.dims
    elements = micro_batch * (dims.heads // 2) * seq * seq * dims.layers
    rate = memory_bytes_per_s(q.gpu)
    return elements * forward_bytes / rate, elements * backward_bytes / rate


def test_the_taken_kernel_moves_one_pass_where_the_math_rate_holds_two():
    q, plain = _planned(2, "attention=math")
    _, fused = _planned(2, "attention=fused_softmax")  # 16 heads over TP 2, 16 batches: Megatron's check takes it
    forward, _ = _bytes_time(q, FUSED_FORWARD_BYTES - BENCHMARK_FORWARD_BYTES, 0, 2)
    assert forward < 0
    assert fused.attention_s - plain.attention_s == pytest.approx(2 * forward)  # recomputed: each forward
    assert fused.recompute_s - plain.recompute_s == pytest.approx(forward)
    assert fused.matmul_s == plain.matmul_s


def test_a_refused_kernel_adds_the_fp32_softmaxs_traffic_to_each_forward_and_the_backward():
    q, plain = _planned(2, "attention=math")
    _, swapped = _planned(2, "attention=fused_softmax swapped_softmax_check")  # 8 a GPU x 2: refused
    forward, backward = _bytes_time(
        q, TORCH_FORWARD_BYTES - BENCHMARK_FORWARD_BYTES, TORCH_BACKWARD_BYTES - BENCHMARK_BACKWARD_BYTES, 2
    )
    assert swapped.attention_s - plain.attention_s == pytest.approx(2 * forward + backward)
    assert swapped.recompute_s - plain.recompute_s == pytest.approx(forward)


def test_a_refused_kernel_launches_the_fp32_softmaxs_ops_one_by_one():
    def host(micro_batch: int, tail: str):
        return _planned_row(
            f"megatron tp=2 pp=1 dp=4 ddp {tail}", activation_checkpointing="true", micro_batch=str(micro_batch)
        )

    q, taken = host(2, "attention=fused_softmax")
    _, refused = host(2, "attention=fused_softmax swapped_softmax_check")  # 8 a GPU x 2: refused
    _, plain = host(2, "attention=math")
    layers = q.shape.dims.layers
    forward, backward = FALLBACK_EXTRA_KERNELS
    # Each layer's forward, its recomputation (full checkpointing) and its backward.
    assert refused.time.host.kernels - taken.time.host.kernels == layers * (2 * forward + backward)
    assert taken.time.host.kernels == plain.time.host.kernels  # the fused kernel: the math softmax's count


def test_past_the_kernels_length_megatron_runs_the_fp32_softmax():
    q, plain = _planned(1, "attention=math", seq_len="8192")
    _, long = _planned(1, "attention=fused_softmax", seq_len="8192")
    forward, backward = _bytes_time(
        q, TORCH_FORWARD_BYTES - BENCHMARK_FORWARD_BYTES, TORCH_BACKWARD_BYTES - BENCHMARK_BACKWARD_BYTES, 1, 8192
    )
    assert long.attention_s - plain.attention_s == pytest.approx(2 * forward + backward)
