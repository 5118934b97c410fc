"""How long causal attention takes, by its kernel: the published forward+backward throughput of
each kernel by head dimension and sequence length, at the card's own peak.

Dao-AILab/flash-attention README.md @ 0251105a, "Performance" (bar labels of
assets/flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png, causal,
batch x sequence = 16k tokens, hidden 2048; FlashAttention-3: flash3_fp16_fwd.png for the
forward and the FA3 paper's backward figure). The benchmark counts causal flops as half of
4·b·s²·h·d forward and the backward as 2.5 forwards, so a layer's forward+backward over a
micro-batch takes 3.5 · 2·b·s²·h·d / rate. A card of the same family (Hopper: H100's tables,
Ampere/Ada: A100's) runs at the same share of its own peak. Between the published sequence
lengths the rate is interpolated in log2(seq); past 16k it stays at 16k's; below 512 it falls
as it does from 1k to 512. Head dims between 64 and 128 interpolate, above 128 take 128's,
below 64 scale down from 64's.

Attention runs at the benchmark's rate in a step too: unlike a dense matmul near its peak (gemm.py's
SUSTAINED), a kernel at 30-65% of the tensor cores' peak, between softmax passes, stays under the
card's power limit, so its clocks do not settle lower.

Kernels: flash (FlashAttention-2, what torch's SDPA ran in bf16/fp16 before it took cuDNN's kernel
on Hopper), flash3, cudnn (Hopper only, measured here: below), flash1, triton, math (the unfused
softmax attention, PyTorch's "standard" in the same figures).

Held against torch 2.11's kernels on an H200 (bench/results/attention_h200.md): its FlashAttention-2
runs at 0.80-0.96 of the `flash` rates from 2k to 16k, and from 32k to 128k within 3% of the 16k
rate held here; its default, cuDNN's kernel, runs 1.5-2.0x faster than FlashAttention-2 from 4k up.
`triton` is Tri Dao's Triton FlashAttention (flash_attn/flash_attn_triton.py, the kernel
llm-foundry's attn_impl=triton copies in llmfoundry/models/layers/flash_attn_triton.py @ v0.3.0):
its own header says its forward+backward is "slightly slower than CUDA forward + backward", the
CUDA kernel of its day being FlashAttention-1, so FlashAttention-1's figures stand for it. The
README's "Triton" bars are another kernel, triton.ops.flash_attention
(benchmarks/benchmark_flash_attention.py imports it), and are not used.
"""

from __future__ import annotations

import math

from harness.common.hardware import GPUSpec
from harness.plan.speed.kernel_table import kernel_table

SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)
REFERENCE_PEAK = {"ampere": 312e12, "hopper": 989e12}  # the cards the tables were measured on

# TFLOP/s forward+backward, causal, by (family, kernel, head dim) over SEQ_POINTS.
FWD_BWD: dict[tuple[str, str, int], tuple[float, ...]] = {
    ("ampere", "flash", 64): (88, 119, 140, 156, 165, 171),
    ("ampere", "flash", 128): (99, 133, 155, 173, 182, 189),
    ("hopper", "flash", 64): (141, 192, 232, 257, 273, 284),
    ("hopper", "flash", 128): (163, 221, 265, 294, 308, 328),
    ("ampere", "flash1", 64): (58, 70, 77, 87, 92, 97),
    ("ampere", "flash1", 128): (55, 62, 69, 76, 80, 83),
    ("hopper", "flash1", 64): (104, 123, 136, 138, 149, 156),
    ("hopper", "flash1", 128): (98, 109, 108, 126, 135, 137),
    ("ampere", "math", 64): (15, 16, 17, 18, 18, 18),
    ("ampere", "math", 128): (23, 28, 32, 32, 34, 34),
    ("hopper", "math", 64): (26, 29, 31, 32, 32, 32),
    ("hopper", "math", 128): (40, 50, 57, 61, 63, 63),
}
# FlashAttention-3 (Hopper only): forward (README figure) and backward (paper figure, third-party
# transcription) rates, combined as the forward's 1 and the backward's 2.5 shares of the flops.
FA3_FORWARD = {64: (197, 265, 371, 420, 460, 473), 128: (292, 423, 521, 579, 602, 616)}
FA3_BACKWARD = {64: (272, 363, 422, 453, 472, 474), 128: (316, 424, 501, 542, 559, 561)}
for _dim in (64, 128):
    FWD_BWD[("hopper", "flash3", _dim)] = tuple(
        3.5 / (1 / f + 2.5 / b) for f, b in zip(FA3_FORWARD[_dim], FA3_BACKWARD[_dim], strict=True)
    )
# cuDNN's fused attention, what torch 2.11's SDPA runs by default on Hopper in bf16: measured here on
# an H200 (bench/attention_kernels.py, bench/results/attention_h200.md, the `cudnn` column, 1k-16k);
# its 512 point extends the 1k-2k slope as _along_seq does below a table's first point.
_CUDNN_H200 = {64: (200, 287, 361, 410, 446), 128: (211, 346, 442, 517, 572)}
for _dim, _rates in _CUDNN_H200.items():
    FWD_BWD[("hopper", "cudnn", _dim)] = (_rates[0] * _rates[0] / _rates[1], *_rates)
# Tri Dao's Triton kernel runs at FlashAttention-1's rate (its header, above).
for _family in ("ampere", "hopper"):
    for _dim in (64, 128):
        FWD_BWD[(_family, "triton", _dim)] = FWD_BWD[(_family, "flash1", _dim)]

KERNELS = ("flash", "flash3", "cudnn", "flash1", "triton", "math")
BACKWARD_SHARE = 2.5 / 3.5  # of a forward+backward's flops (and time, at one rate)
FP32_ATTENTION_EFFICIENCY = 0.3  # fp32 runs SDPA's memory-efficient kernel on plain fp32 cores


def _along_seq(points: tuple[float, ...], seq: float) -> float:
    x = math.log2(max(seq, 1))
    lo, hi = math.log2(SEQ_POINTS[0]), math.log2(SEQ_POINTS[-1])
    if x >= hi:
        return points[-1]
    if x <= lo:  # falls as it does from 1k to 512, per halving
        return points[0] * (points[0] / points[1]) ** (lo - x)
    i = int(x - lo)
    frac = x - lo - i
    return points[i] * (1 - frac) + points[i + 1] * frac


def attention_tflops(gpu: GPUSpec, kernel: str, head_dim: int, seq: float) -> float:
    """The forward+backward causal rate of `kernel` on `gpu`, TFLOP/s as the benchmark counts them."""
    family = gpu.attention_family
    if (family, kernel, 64) not in FWD_BWD:
        raise ValueError(f"no {kernel} attention figures for {gpu.name}")
    low, high = (_along_seq(FWD_BWD[(family, kernel, d)], seq) for d in (64, 128))
    if head_dim >= 128:
        rate = high
    elif head_dim >= 64:
        rate = low + (high - low) * (head_dim - 64) / 64
    else:
        rate = low * head_dim / 64
    return rate * gpu.peak_flops["bf16"] / REFERENCE_PEAK[family]


def causal_attention_flops(batch: float, seq: float, heads: int, head_dim: int) -> float:
    """Forward flops of causal attention as the benchmark counts them: half of 4·b·s²·h·d."""
    return 2.0 * batch * seq * seq * heads * head_dim


def attention_seconds(
    gpu: GPUSpec, kernel: str, precision: str, *, batch: float, seq: float, heads: int, head_dim: int
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's causal attention over a micro-batch."""
    total_flops = 3.5 * causal_attention_flops(batch, seq, heads, head_dim)
    table = kernel_table(gpu)
    measured = table.attention_tflops(kernel, seq, head_dim) if table and precision != "fp32" else None
    if precision == "fp32":
        rate = FP32_ATTENTION_EFFICIENCY * gpu.peak_flops["fp32"]
    elif measured is not None:  # this card's own measurement (kernel_table.py)
        rate = measured * 1e12
    else:
        rate = attention_tflops(gpu, kernel, head_dim, seq) * 1e12
    total = total_flops / rate
    return total * (1 - BACKWARD_SHARE), total * BACKWARD_SHARE
