"""Matmuls with operand rows not 16 bytes apart: the main loop's share by alignment against the measured
sweeps (gemm.py's MISALIGNED_SHARE), where the plan's matmuls meet such widths (a vocabulary's head, a
weight's gradient, unfused attention at a head dim not a multiple of 8), and where nothing changes."""

from __future__ import annotations

import pytest

from harness.common.hardware import GPUS
from harness.plan.model.model_shape import shape_of_description
from harness.plan.speed.attention import attention_seconds
from harness.plan.speed.gemm import alignment, gemm_seconds, gemm_tflops
from tests.plan.speed.work import step_work

H100, A100 = GPUS["H100"], GPUS["A100"]


def _share(gpu, m, n, k):
    aligned = gemm_tflops(8192, 8192, 8192, gpu, "fp16", sustained=1.0)
    return gemm_tflops(m, n, k, gpu, "fp16", sustained=1.0) / aligned


@pytest.mark.parametrize(
    "gpu,even,odd",
    [  # JihaoXin/GAC fig_tc_{k,n}_alignment @ 2b0a2a41: 512 x 4096 x K and 512 x N x 4096 in fp16
        (A100, 103 / 167, 56 / 167),
        (H100, 162 / 343, 103 / 343),
    ],
)
def test_an_odd_or_even_width_runs_at_the_measured_share_of_an_aligned_one(gpu, even, odd):
    # at a size where neither a kernel's launch nor its tiles' fixed time counts
    for m, n, k in ((8192, 8190, 8192), (8192, 8192, 8190), (8192, 8188, 8192)):
        assert _share(gpu, m, n, k) == pytest.approx(even, rel=0.03)
    for m, n, k in ((8192, 8191, 8192), (8192, 8192, 8191)):
        assert _share(gpu, m, n, k) == pytest.approx(odd, rel=0.03)
    assert _share(gpu, 8191, 8192, 8192) > 0.98  # the rows' count is no operand's row length


def test_the_fixed_time_of_a_tile_keeps_a_short_inner_dimension_nearer_the_aligned_rate():
    # JihaoXin/GAC report.md @ 2b0a2a41, 8192 x 8192 x K on an A100: K 108 and 116 at 61-71 TFLOP/s beside
    # 68-77 at 104 and 120; K 105 and 107 at 39-40. The model: 0.75 and 0.48 of K 112's rate.
    aligned = gemm_tflops(8192, 8192, 112, A100, "fp16", sustained=1.0)
    even = gemm_tflops(8192, 8192, 108, A100, "fp16", sustained=1.0) / aligned
    odd = gemm_tflops(8192, 8192, 107, A100, "fp16", sustained=1.0) / aligned
    assert _share(A100, 8192, 8192, 8190) < even < 0.95
    assert _share(A100, 8192, 8192, 8191) < odd < 0.6


def test_alignment_counts_every_width_and_only_whole_ones():
    assert alignment((4096, 768)) == 8
    assert alignment((4096, 108)) == 2
    assert alignment((50257, 768)) == 1
    assert alignment((4096, 1365.5)) == 8  # an average over shards, not a layout


@pytest.mark.parametrize(
    "gpu,precision",
    [(H100, "fp8"), (H100, "fp32"), (GPUS["B200"], "bf16"), (GPUS["MI300X"], "bf16")],
)
def test_no_share_is_planned_without_a_measurement(gpu, precision):
    aligned = gemm_seconds(8192, 4096, 4096, gpu, precision) / 4096
    assert gemm_seconds(8192, 4095, 4096, gpu, precision) / 4095 == pytest.approx(aligned, rel=0.01)


def _matmul_per_flop(vocab):
    shape = shape_of_description(params=None, layers=12, width=768, heads=12, vocab=vocab, seq_len=1024)
    work = step_work(shape, gpu=A100)
    return work.matmul_s / (12 * 12 * 768 * 768 + vocab * 768)


def test_gpt2s_vocabulary_runs_its_head_slower_than_nanogpts_padded_one():
    # karpathy/nanoGPT pads 50257 to 50304 (a multiple of 64) for speed: the head's rows are odd
    assert _matmul_per_flop(50257) > 1.3 * _matmul_per_flop(50304)


def test_a_weight_gradients_inner_dimension_is_the_tokens_not_a_row_length():
    tokens_odd = gemm_seconds(4096, 4096, 8191, A100, "bf16", widths=(4096, 4096))
    assert tokens_odd == pytest.approx(gemm_seconds(4096, 4096, 8192, A100, "bf16") * 8191 / 8192, rel=0.01)
    assert gemm_seconds(4096, 4096, 8191, A100, "bf16") > 1.5 * tokens_odd  # as X·W's inner dimension it is one


def test_unfused_attention_pays_for_a_head_dim_not_a_multiple_of_8_and_fused_kernels_do_not():
    def per_dim(kernel, head_dim):
        forward, backward = attention_seconds(A100, kernel, "fp16", batch=4, seq=2048, heads=32, head_dim=head_dim)
        return (forward + backward) / head_dim

    assert per_dim("fused_softmax", 108) > 1.03 * (per_dim("fused_softmax", 104) + per_dim("fused_softmax", 112)) / 2
    assert per_dim("flash", 108) < (per_dim("flash", 104) + per_dim("flash", 112)) / 2 * 1.01
