"""How long causal attention takes, by its kernel: the published forward+backward throughput of
each kernel by head dimension and sequence length, at the card's own peak.

Dao-AILab/flash-attention README.md @ 0251105a, "Performance" (bar labels of
assets/flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png, causal,
batch x sequence = 16k tokens, hidden 2048; FlashAttention-3: flash3_fp16_fwd.png for the
forward and the FA3 paper's backward figure). The benchmark counts causal flops as half of
4·b·s²·h·d forward and the backward as 2.5 forwards, so a layer's forward+backward over a
micro-batch takes 3.5 · 2·b·s²·h·d / rate. A card of the same family (Hopper: H100's tables,
Ampere/Ada: A100's, Blackwell: B200's, AMD Instinct: MI300X's) runs at the same share of its own
peak, but for the softmax's exponentials (`carried`): the special-function units compute 16 a clock
on every SM from Ampere to Blackwell while the tensor cores' FLOPs a clock doubled twice, and
Blackwell Ultra doubles them again, so a kernel's time on another card is its exponentials at that
card's SFU rate beside the rest at its tensor peak. A kernel not measured on Blackwell is Hopper's
carried over so. Between the published sequence lengths the rate is interpolated in log2(seq); past
16k it stays at 16k's; below 512 it falls as it does from 1k to 512. Head dims between 64 and 128
interpolate, above 128 take 128's, below 64 scale down from 64's.

Attention runs at the benchmark's rate in a step too: unlike a dense matmul near its peak (gemm.py's
SUSTAINED), a kernel at 30-65% of the tensor cores' peak, between softmax passes, stays under the
card's power limit, so its clocks do not settle lower.

Kernels: flash (FlashAttention-2, what torch's SDPA ran in bf16/fp16 before it took cuDNN's kernel
on Hopper), flash3, cudnn (Hopper and Blackwell, below), flash1, triton, math (the unfused softmax
attention, PyTorch's "standard" in the same figures: the mask added, then a softmax), fused_softmax
(the same two batched matmuls around one fused scale-mask-softmax kernel: Megatron-LM's
FusedScaleMaskSoftmax and OneFlow's fused softmax; math's rates, its softmax's bytes set right by
masked_softmax.py).

cuDNN on Hopper, as published: TransformerEngine's own timing of its fused attention (TE 1.10, cuDNN
9.3, H100 SXM, 32 query over 4 key-value heads, head dim 128, 8k causal: 7.4875 ms forward and backward,
514 TFLOP/s; docs/examples/attention/attention.ipynb @ d0067d0d) and the FlashAttention-3 paper's
cuDNN bars (arXiv 2407.08608, H100 SXM, 8k causal head dim 128: 529 forward, 518 backward, 521
together) agree with the H200 measurement held here (517) within 1%: the cuDNN 9 of 2024-25 that
NeMo and Megatron ran is this rate. On Blackwell, NVIDIA's cudnn-frontend benchmarks by release (B200:
cuDNN 9.10.2 and 9.13.1 within 2% of each other; GB200 and GB300 with 9.17 and 9.22, 5-15% faster) give
the B200 table below, from the 9.13.1 of the 2025 runs.

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
from typing import TYPE_CHECKING

from harness.common.hardware import BLACKWELL_EXP, GPUS, GPUSpec
from harness.plan.speed.gemm import gemm_seconds
from harness.plan.speed.kernel_table import kernel_table

if TYPE_CHECKING:
    from harness.plan.model.model_shape import TransformerDims

SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)

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


def _combined(forward: tuple[float, ...], backward: tuple[float, ...]) -> tuple[float, ...]:
    """Forward and backward rates combined as the forward's 1 and the backward's 2.5 shares of the flops."""
    return tuple(3.5 / (1 / f + 2.5 / b) for f, b in zip(forward, backward, strict=True))


# FlashAttention-3 (Hopper only): forward (README figure) and backward (paper figure, third-party
# transcription) rates.
FA3_FORWARD = {64: (197, 265, 371, 420, 460, 473), 128: (292, 423, 521, 579, 602, 616)}
FA3_BACKWARD = {64: (272, 363, 422, 453, 472, 474), 128: (316, 424, 501, 542, 559, 561)}
for _dim in (64, 128):
    FWD_BWD[("hopper", "flash3", _dim)] = _combined(FA3_FORWARD[_dim], FA3_BACKWARD[_dim])
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
# Blackwell, measured on a B200 (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts @
# 0b1577c, NGC PyTorch 25.09 with cuDNN 9.13.1: Llama 3.1 405B's attention, 128 query heads over 8 key-value
# heads, head dim 128, causal, one sequence): cuDNN through its frontend (the fp8 script's bf16 and fp8
# columns; TransformerEngine calls the same graphs) and FlashAttention-2 2.7.4.post1 (the bf16 script's
# `flash_attention`), forward and backward TFLOP/s counted as here. FlashAttention-2 issues Ampere's
# warp-level MMA, not Blackwell's tensor-core instructions: it runs at about the H100's rate.
B200_FORWARD = {
    "cudnn": (244, 561, 908, 1141, 1384, 1475),
    "cudnn-fp8": (196, 516, 974, 1231, 1502, 1692),
    "flash": (64, 154, 254, 343, 400, 425),
}
B200_BACKWARD = {
    "cudnn": (201, 377, 545, 833, 995, 1152),
    "cudnn-fp8": (170, 377, 556, 972, 1255, 1469),
    "flash": (81, 105, 199, 273, 318, 337),
}
for _kernel, _forward in B200_FORWARD.items():
    FWD_BWD[("blackwell", _kernel, 128)] = _combined(_forward, B200_BACKWARD[_kernel])

# cuDNN's fp8 attention on Hopper: the bf16 table scaled by fp8's forward+backward rate over bf16's as NVIDIA
# published them on an H200 (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn
# @ 3929da2, cuDNN 9.19, Llama 3.1's 64 query over 8 key-value heads, head dim 128, causal: 1.13 at 2k, 1.08 at
# 4k, 0.90 at 8k, 0.76 at 16k; its backward in fp8 is slower than in bf16 from 8k on); 512 and 1k take 2k's.
_H200_FP8_OVER_BF16 = (1.131, 1.131, 1.131, 1.076, 0.901, 0.756)
for _dim in (64, 128):
    FWD_BWD[("hopper", "cudnn-fp8", _dim)] = tuple(
        r * f for r, f in zip(FWD_BWD[("hopper", "cudnn", _dim)], _H200_FP8_OVER_BF16, strict=True)
    )

# AMD Instinct (CDNA): the flash-attention package's ROCm build (FlashAttention-2 on composable_kernel) and
# PyTorch's unfused attention, measured on an Azure ND MI300X v5 with the package's own
# benchmarks/benchmark_flash_attention.py (no causal mask, head dim 64, batch 2, 8k, forward and backward):
# 328.6 and 145.9 TFLOP/s (samuel-bohman/AI-benchmarking-guide Azure_Results/ND_MI300X_v5_results.md @
# 3de0c294). The same script's H100 bars in the README at that setting: 294 and 87. The MI300X's tables are
# the H100's scaled by those ratios: one point measured on the card, the H100's shape over sequence and head dim.
MI300X_OVER_H100 = {"flash": 328.6 / 294, "math": 145.9 / 87}
for _kernel, _ratio in MI300X_OVER_H100.items():
    for _dim in (64, 128):
        FWD_BWD[("cdna", _kernel, _dim)] = tuple(r * _ratio for r in FWD_BWD[("hopper", _kernel, _dim)])

# The unfused kernels: every score made and kept (T x T a head), their softmax a pass over memory of its own.
UNFUSED = ("math", "fused_softmax")
for (_family, _kernel, _dim), _rates in list(FWD_BWD.items()):
    if _kernel == "math":  # the same matmuls; masked_softmax.py adds the difference of the softmaxes' bytes
        FWD_BWD[(_family, "fused_softmax", _dim)] = _rates
KERNELS = ("flash", "flash3", "cudnn", "flash1", "triton", "math", "fused_softmax")


def sdpa_kernel(gpu: GPUSpec | None) -> str:
    """The kernel torch's scaled_dot_product_attention runs on `gpu` in bf16/fp16, as parabench's
    models call it: cuDNN's on Hopper (torch 2.11's default there: bench/results/attention_h200.md,
    its `default` and `cudnn` columns alike), the unfused softmax on Volta (no fused kernel runs
    there), FlashAttention-2 on the others (Ampere's default; Blackwell's default is not measured)."""
    generation = gpu.generation if gpu is not None else ""
    return {"hopper": "cudnn", "volta": "math"}.get(generation, "flash")


FP8_KERNELS = {"cudnn": "cudnn-fp8"}  # the kernel each runs in fp8 attention (TransformerEngine's fp8 DPA)
# The card each family's tables were measured on: its dense 16-bit tensor peak and the exponentials its
# SFUs compute per tensor FLOP, both per SM and clock (16 MUFU.EX2 a clock on every one; 2,048 dense
# fp16 FLOPs a clock on the A100's SM, twice that on the H100's, NVIDIA's A100 and H100 whitepapers;
# the B200's in harness/common/hardware.py). The MI300X's exponential rate is not in the sources: an AMD
# card runs its family's share of its own peak.
REFERENCE: dict[str, tuple[float, float | None]] = {
    "ampere": (312e12, 16 / 2048),
    "hopper": (989e12, 16 / 4096),
    "blackwell": (2250e12, BLACKWELL_EXP),
    "cdna": (1307e12, None),
}
# The card each family's tables were measured on, by its key in harness/common/hardware.py's GPUS.
REFERENCE_CARD = {"ampere": "A100", "hopper": "H100", "blackwell": "B200", "cdna": "MI300X"}
# The kernels that issue the family's full-rate tensor instructions (Hopper's warpgroup MMA: cuDNN's
# fused attention and FlashAttention-3), and the precision of their matmuls. FlashAttention-2 and its
# kind issue Ampere's warp-level MMA, whose rate on a card with capped tensor cores is not published.
FULL_RATE_TENSOR = {"cudnn": "bf16", "flash3": "bf16", "cudnn-fp8": "fp8"}
# A kernel not measured on a family's card is carried over from the family before it.
EARLIER = {"blackwell": "hopper"}
# The softmax's exponentials per FLOP as the benchmarks count them: each score element takes one in the
# forward and one in the backward (P recomputed from the saved log-sum-exp) beside 4·d forward and 10·d
# backward FLOPs.
EXPS_PER_ELEMENT = 2
FLOPS_PER_ELEMENT_PER_DIM = 14
FUSED = ("flash", "flash3", "cudnn", "cudnn-fp8", "flash1", "triton")  # the softmax between the matmuls
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


def kernels_on(gpu: GPUSpec) -> tuple[str, ...]:
    """The attention kernels with rates for `gpu`: its family's measured ones and those carried from the
    family before it."""
    families = (gpu.attention_family, EARLIER.get(gpu.attention_family))
    return tuple(k for k in (*KERNELS, *FP8_KERNELS.values()) if any((f, k, 128) in FWD_BWD for f in families))


def attention_tflops(gpu: GPUSpec, kernel: str, head_dim: int, seq: float) -> float:
    """The forward+backward causal rate of `kernel` on `gpu`, TFLOP/s as the benchmark counts them."""
    family = gpu.attention_family
    if kernel not in kernels_on(gpu):
        raise ValueError(f"no {kernel} attention figures for {gpu.name}")
    low, high = (_rate(gpu, family, kernel, d, seq) for d in (64, 128))
    if head_dim >= 128:
        return high
    if head_dim >= 64:
        return low + (high - low) * (head_dim - 64) / 64
    return low * head_dim / 64


def _rate(gpu: GPUSpec, family: str, kernel: str, dim: int, seq: float) -> float:
    """The rate of a table on `gpu`: its own family's measurement where there is one (at a head dim it
    lacks, the earlier family's ratio to the measured dim), else the earlier family's, carried over."""
    if (family, kernel, dim) in FWD_BWD:
        return carried(_along_seq(FWD_BWD[(family, kernel, dim)], seq), family, gpu, kernel, dim)
    earlier = EARLIER.get(family)
    if earlier is None or (earlier, kernel, dim) not in FWD_BWD:
        raise ValueError(f"no {kernel} attention figures at head dim {dim} for {gpu.name}")
    other = 128 if dim != 128 else 64
    if (family, kernel, other) in FWD_BWD and (earlier, kernel, other) in FWD_BWD:
        return (
            _rate(gpu, family, kernel, other, seq)
            * _rate(gpu, earlier, kernel, dim, seq)
            / _rate(gpu, earlier, kernel, other, seq)
        )
    return _rate(gpu, earlier, kernel, dim, seq)


def carried(rate: float, family: str, gpu: GPUSpec, kernel: str, dim: int) -> float:
    """A rate measured on `family`'s card, TFLOP/s, as `gpu` runs the same kernel: of each FLOP's time
    there, what the softmax's exponentials take at that card's SFU rate is taken at `gpu`'s, the rest at
    the ratio of the tensor peaks. The exponentials run beside the matmuls but not under them: FlashAttention-3's
    forward on the H100 reaches 48-50% of the peak at head dim 64, 62-66% at 128 and 76% at 256, about
    the 50%, 67% and 80% its matmuls and exponentials allow one after the other. The unfused softmax is
    memory-bound, not SFU-bound: it scales with the peak alone. On a card whose tensor peak is capped
    below its SMs' (`tensor_capped`) a full-rate kernel is split otherwise: `capped_card_rate`."""
    if gpu.tensor_capped and kernel in FULL_RATE_TENSOR:
        return capped_card_rate(rate, family, gpu, kernel)
    peak, exp_ratio = REFERENCE[family]
    own_ratio = gpu.exp_per_tensor_flop if gpu.exp_per_tensor_flop is not None else REFERENCE[gpu.attention_family][1]
    if kernel not in FUSED or own_ratio == exp_ratio or own_ratio is None or exp_ratio is None:
        return rate * gpu.tensor_flops / peak
    exps_per_flop = EXPS_PER_ELEMENT / (FLOPS_PER_ELEMENT_PER_DIM * dim)
    per_flop = 1 / (rate * 1e12)
    exp_there = exps_per_flop / (exp_ratio * peak)
    rest = per_flop - exp_there
    if rest <= 0:
        raise ValueError(f"{kernel} at {rate:.0f} TFLOP/s runs faster than {family}'s exponentials allow")
    return 1e-12 / (rest * peak / gpu.tensor_flops + exps_per_flop / (own_ratio * gpu.tensor_flops))


def capped_card_rate(rate: float, family: str, gpu: GPUSpec, kernel: str) -> float:
    """A full-rate kernel's `rate`, measured on `family`'s card, TFLOP/s, on a card of the same die whose
    tensor peak is capped below what its SMs give at their clock (the H20: 148 TFLOP/s from SMs that on
    the H100 give 989). Of each FLOP's time on the measured card, the tensor cores' at their full rate
    is taken at the capped card's tensor peak; the rest (the softmax's exponentials, its other
    arithmetic, the loads and the waits) is the SMs' own work, taken at the capped card's SMs' pace:
    its FP32 peak over the measured card's, the same SM's lanes at its own count and clock. Carried by
    the tensor peak alone, the rest would shrink with the cap too, and the H20's attention would run at
    the H100's share of its peak, where an H20 runs it at a larger one (Dao-AILab/flash-attention #1310)."""
    precision = FULL_RATE_TENSOR[kernel]
    reference = GPUS[REFERENCE_CARD[family]]
    per_flop = 1 / (rate * 1e12)
    tensor_there = 1 / reference.peak_flops[precision]
    rest = max(0.0, per_flop - tensor_there)
    sm_pace = gpu.peak_flops["fp32"] / reference.peak_flops["fp32"]
    return 1e-12 / (tensor_there * reference.peak_flops[precision] / gpu.peak_flops[precision] + rest / sm_pace)


def causal_attention_flops(batch: float, seq: float, heads: int, head_dim: float) -> float:
    """Forward flops of causal attention as the benchmark counts them: half of 4·b·s²·h·d."""
    return 2.0 * batch * seq * seq * heads * head_dim


def every_layer_attention_seconds(
    dims: TransformerDims, gpu: GPUSpec, kernel: str, precision: str, *, micro_batch: int, seq_len: int, tp: int
) -> tuple[float, float]:
    """(forward, backward) seconds of every layer's attention over a micro-batch on one of `tp` GPUs,
    at the model's query-key and value head dims (latent attention's differ)."""
    forward, backward = attention_seconds(
        gpu,
        kernel,
        precision,
        batch=micro_batch,
        seq=seq_len,
        heads=dims.heads // tp,
        head_dim=dims.qk_head_dim,
        v_head_dim=dims.v_head_dim,
    )
    return forward * dims.layers, backward * dims.layers


def attention_seconds(
    gpu: GPUSpec,
    kernel: str,
    precision: str,
    *,
    batch: float,
    seq: float,
    heads: int,
    head_dim: int,
    v_head_dim: int | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's causal attention over a micro-batch. `v_head_dim`:
    values narrower than the queries and keys (latent attention: 192 and 128), the flops those of two
    equal heads of their mean width, the rate the kernel's at `head_dim`, the query-key width it is
    built for (Megatron-core's MLA calls TransformerEngine's attention with k_channels 192 and
    v_channels 128, multi_latent_attention.py @ d98e8a64); above 128 the tables take 128's rate."""
    flops_dim = head_dim if v_head_dim is None else (head_dim + v_head_dim) / 2
    total_flops = 3.5 * causal_attention_flops(batch, seq, heads, flops_dim)
    table = kernel_table(gpu)
    measured = table.attention_tflops(kernel, seq, head_dim) if table and precision != "fp32" else None
    if precision == "fp32":
        rate = FP32_ATTENTION_EFFICIENCY * gpu.peak_flops["fp32"]
    elif measured is not None:  # this card's own measurement (kernel_table.py)
        rate = measured * 1e12
    else:
        rate = attention_tflops(gpu, kernel, head_dim, seq) * 1e12
    total = total_flops / rate
    forward, backward = total * (1 - BACKWARD_SHARE), total * BACKWARD_SHARE
    if kernel in UNFUSED:
        extra_forward, extra_backward = misaligned_head_seconds(gpu, precision, batch * heads, seq, head_dim)
        forward, backward = forward + extra_forward, backward + extra_backward
    return forward, backward


def misaligned_head_seconds(
    gpu: GPUSpec, precision: str, batch: float, seq: float, head_dim: int
) -> tuple[float, float]:
    """(forward, backward) seconds the unfused kernels' batched matmuls take beyond the tables' when the
    head dim is not a multiple of 8: their rows are the head dim (q, k and v, the context) and the
    sequence (the scores) long, so cuBLAS runs them in its narrower-load kernels (gemm.py's
    main_loop_share). Forward the scores (inner dimension the head dim) and the context (output width
    the head dim); backward the probabilities' gradient (inner the head dim) and q's, k's and v's (output
    width the head dim). The tables' own rates are at aligned head dims; the fused kernels pad a head to
    their tile and have no such loads."""
    aligned = (seq,)
    misaligned = (head_dim, seq)

    def extra(m: float, n: float, k: float) -> float:
        slow = gemm_seconds(m, n, k, gpu, precision, batch, sustained=1.0, widths=misaligned)
        return slow - gemm_seconds(m, n, k, gpu, precision, batch, sustained=1.0, widths=aligned)

    inner, outer = extra(seq, seq, head_dim), extra(seq, head_dim, seq)
    return inner + outer, inner + 3 * outer
