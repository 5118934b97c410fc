"""Attention's rates against published measurements: cuDNN's fused attention on Hopper as
TransformerEngine's own documentation timed it, and on Blackwell and Blackwell Ultra as NVIDIA's
cudnn-frontend benchmarks published it, with the softmax's exponentials at each card's SFU rate;
fp8 attention at cuDNN's published fp8 rate beside TransformerEngine's casts."""

from __future__ import annotations

import pytest

from harness.common.hardware import GPUS
from harness.plan.model.model_shape import shape_of_spec
from harness.plan.speed.attention import attention_seconds, attention_tflops, carried
from harness.plan.speed.compute import FP8_CAST_BYTES, compute_work, memory_bytes_per_s

H100, B200, GB200, GB300 = GPUS["H100"], GPUS["B200"], GPUS["GB200"], GPUS["GB300"]


def _combined(forward: float, backward: float) -> float:
    return 3.5 / (1 / forward + 2.5 / backward)


def test_cudnn_on_hopper_matches_transformer_engines_published_timing():
    # NVIDIA/TransformerEngine docs/examples/attention/attention.ipynb (TE 1.10, cuDNN 9.3, H100 SXM):
    # test_3, batch 2, 32 query heads over 4 key-value heads, head dim 128, 8k causal, 7.4875 ms forward
    # and backward: 514 TFLOP/s as the benchmark counts them.
    forward, backward = attention_seconds(H100, "cudnn", "bf16", batch=2, seq=8192, heads=32, head_dim=128)
    assert forward + backward == pytest.approx(7.4875e-3, rel=0.02)


def test_blackwell_runs_the_b200s_published_rates():
    # NVIDIA/cudnn-frontend benchmark artifacts @ 0b1577c (cuDNN 9.13.1, B200): forward and backward
    # TFLOP/s at 8k, head dim 128, causal; FlashAttention-2 at about the H100's rate.
    assert attention_tflops(B200, "cudnn", 128, 8192) == pytest.approx(_combined(1384, 995))
    assert attention_tflops(B200, "flash", 128, 8192) == pytest.approx(_combined(400, 318))
    assert attention_tflops(B200, "flash", 128, 8192) < 1.2 * attention_tflops(H100, "flash", 128, 8192)
    assert attention_tflops(B200, "cudnn", 64, 8192) < attention_tflops(B200, "cudnn", 128, 8192)
    # A kernel never measured on Blackwell is Hopper's, carried over by the tensor peak and the SFUs.
    assert attention_tflops(B200, "flash3", 128, 8192) == pytest.approx(
        carried(attention_tflops(H100, "flash3", 128, 8192), "hopper", B200, "flash3", 128)
    )


def test_amd_cards_run_the_mi300xs_measured_share_not_the_h100s():
    # Azure's ND MI300X v5 run of flash-attention's own benchmark (no causal mask, head dim 64, batch 2,
    # 8k): FlashAttention-2 328.6 and PyTorch's unfused attention 145.9 TFLOP/s, where the README's H100 bars
    # at that setting read 294 and 87. Causal rates keep the H100's shape over sequence and head dim.
    mi300x, mi325x, mi355x = GPUS["MI300X"], GPUS["MI325X"], GPUS["MI355X"]
    for seq in (1024, 8192, 16384):
        for dim in (64, 128):
            assert attention_tflops(mi300x, "flash", dim, seq) == pytest.approx(
                attention_tflops(H100, "flash", dim, seq) * 328.6 / 294
            )
            assert attention_tflops(mi300x, "math", dim, seq) == pytest.approx(
                attention_tflops(H100, "math", dim, seq) * 145.9 / 87
            )
    # Below the H100's share of the peak: the H100's would plan it 18% faster.
    h100_share = attention_tflops(H100, "flash", 128, 8192) / (H100.tensor_flops / 1e12)
    assert attention_tflops(mi300x, "flash", 128, 8192) / (mi300x.tensor_flops / 1e12) < 0.85 * h100_share
    # The MI325X (the same compute die and peak) and CDNA4 at the MI300X's share of their own peak.
    assert attention_tflops(mi325x, "flash", 128, 8192) == pytest.approx(attention_tflops(mi300x, "flash", 128, 8192))
    assert attention_tflops(mi355x, "flash", 128, 8192) == pytest.approx(
        attention_tflops(mi300x, "flash", 128, 8192) * mi355x.tensor_flops / mi300x.tensor_flops
    )
    # No kernel measured on AMD's cards is carried over from NVIDIA's.
    for kernel in ("cudnn", "flash3", "triton", "flash1"):
        with pytest.raises(ValueError, match="no .* attention figures"):
            attention_tflops(mi300x, kernel, 128, 8192)


def test_blackwell_ultras_doubled_exponentials_against_its_published_gain():
    # The same benchmark through torch's SDPA on a B200 and a GB300 (cuDNN 9.13.1, @ 0b1577c): forward
    # and backward TFLOP/s at 4k, 8k and 16k. The GB300's gain over the B200 is its peak's (2500 over 2250
    # TFLOP/s) and its SFUs' twice the exponentials a clock; taking the exponentials one after the
    # matmuls credits the doubled SFUs with 3% less to 10% more than cuDNN gained (it hides part of them).
    b200 = {4096: (856, 701), 8192: (1171, 943), 16384: (1332, 1075)}
    gb300 = {4096: (1145, 893), 8192: (1496, 1130), 16384: (1702, 1268)}
    for seq, (forward, backward) in b200.items():
        published = _combined(*gb300[seq]) / _combined(forward, backward)
        planned = attention_tflops(GB300, "cudnn", 128, seq) / attention_tflops(B200, "cudnn", 128, seq)
        assert planned == pytest.approx(published, rel=0.1)
        assert planned > 1.1 * GB300.tensor_flops / B200.tensor_flops  # more than the peak's gain
    # The GB200 has the GB300's peak and the B200's SFUs: only the peak's gain.
    assert attention_tflops(GB200, "cudnn", 128, 8192) == pytest.approx(
        attention_tflops(B200, "cudnn", 128, 8192) * GB200.tensor_flops / B200.tensor_flops
    )


def test_the_exponentials_change_nothing_between_cards_of_one_kind():
    h200 = GPUS["H200"]
    for kernel in ("flash", "flash3", "cudnn", "math"):
        assert attention_tflops(h200, kernel, 128, 4096) == pytest.approx(attention_tflops(H100, kernel, 128, 4096))
    # The unfused softmax is memory-bound: the peak alone carries it.
    assert attention_tflops(B200, "math", 128, 4096) == pytest.approx(
        attention_tflops(H100, "math", 128, 4096) * B200.tensor_flops / H100.tensor_flops
    )


def test_a_capped_cards_full_rate_kernels_against_its_published_forward():
    # Dao-AILab/flash-attention #1310 (an H20, batch 2, 2k, causal): forward TFLOP/s of cuDNN's
    # kernel and FlashAttention-3 at head dims 64 and 128. Only the forward is published; on the H100
    # FlashAttention-3's forward and its forward+backward differ by 3% at 2k (521 against 507).
    h20 = GPUS["H20"]
    published = {("cudnn", 64): 109.1, ("cudnn", 128): 107.8, ("flash3", 64): 100.3, ("flash3", 128): 107.8}
    for (kernel, dim), forward in published.items():
        planned = attention_tflops(h20, kernel, dim, 2048)
        assert planned == pytest.approx(forward, rel=0.15)
        # Carried by the tensor peak alone it would run at 39-70% of the published rate.
        assert attention_tflops(H100, kernel, dim, 2048) * h20.tensor_flops / H100.tensor_flops < 0.71 * forward
    # FlashAttention-2's warp-level MMA on the capped card is not published: the tensor peak carries it.
    assert attention_tflops(h20, "flash", 128, 8192) == pytest.approx(
        attention_tflops(H100, "flash", 128, 8192) * h20.tensor_flops / H100.tensor_flops
    )
    # No more than its matmuls reach.
    assert attention_tflops(h20, "flash3", 128, 16384) < h20.matmul_efficiency * h20.tensor_flops / 1e12


def test_fp8_attention_runs_cudnns_fp8_kernel_beside_transformer_engines_casts():
    shape = shape_of_spec("llama3.1-8b")
    common = dict(
        micro_batch=2, seq_len=8192, precision="bf16", matmul_precision="fp8", mixed_precision="low_precision",
        compiled=True, checkpointing="none", fused_loss=True, attention="cudnn", gpu=B200, optimizer_params=1e9,
        engine="torch", te_fp8=True,
    )  # fmt: skip
    bf16, fp8 = (compute_work(shape, **common, fp8_attention=on) for on in (False, True))
    # The B200's published fp8 and bf16 rates at 8k (cuDNN 9.13.1): 1317 against 1082 TFLOP/s together.
    assert bf16.attention_s / fp8.attention_s == pytest.approx(_combined(1502, 1255) / _combined(1384, 995), rel=1e-3)
    # q, k and v cast before the forward, the output's gradient before the backward: an amax pass and a cast.
    dims, tokens = shape.dims, 2 * 8192
    casts = FP8_CAST_BYTES * tokens * dims.layers * (2 * dims.q_width + 2 * dims.kv_width)
    assert fp8.elementwise_s - bf16.elementwise_s == pytest.approx(casts / memory_bytes_per_s(B200))
