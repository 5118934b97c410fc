"""How long one matrix multiply takes on a GPU, from its shape: a roofline with a launch cost.

    t = LAUNCH_S + max(flops x (1 + INNER_OVERHEAD / k) / (sustained x matmul_efficiency x peak),
                       OPERAND_TRAFFIC x bytes / HBM bandwidth)
    sustained = SUSTAINED x the card's long-run matmul over the H100's (sustained_share)

flops = 2·m·n·k; bytes = the operands and the result once each, (m·k + k·n + m·n) elements. A
large GEMM runs at the best rate a shape search measured on the card (its MAMF,
harness/common/hardware.py); one with a short inner dimension k pays each output tile's fixed
start and finish as INNER_OVERHEAD more elements of k; a skinny one (a dimension of a few
hundred) is bound by moving its operands; a small one by the fixed cost of a kernel. The three
constants are fitted to OpenXLA's measured bf16 matmul table for sm_90 (tensorflow/tensorflow
third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h @ 372d578b, kDefaultMatmulPTable,
375 shapes b x m x n x k, every dimension 256..4096): with the H100's MAMF of 80.3%, the median
error by size class is within 7% from 2^29 flops up, by inner dimension within 6%, and the rms
log error 8%
(tests/plan/speed/test_compute.py holds the fit to the table and to the square-matmul sweeps of
zzc0721/torch-performance-test-data on H100 SXM and PCIe). An fp8 matmul runs the same way at the
card's fp8 peak and fp8 MAMF, its operands a byte each; the fixed time of an output tile is the
same, so its inner overhead is as many more elements of k as fp8's rate is over bf16's. An fp4
matmul (NVFP4: e2m1 elements, an fp8 scale per 16 of them) likewise at the card's fp4 peak and
measured fp4 rate, its operands 9/16 of a byte.

A 16-bit matmul whose operands' rows are not 16 bytes apart (a width not a multiple of 8 elements)
cannot use cuBLAS's kernels that load 128 bits at a time: it runs a CUTLASS kernel that loads two
elements at a time where every width is even, one where one is odd (JihaoXin/GAC Latex/main.tex @
2b0a2a41, "cuBLAS GEMM kernel tiers", Nsight Compute on an A100). Its main loop runs at
MISALIGNED_SHARE of the aligned rate; each output tile's fixed start and finish (INNER_OVERHEAD) is
the same. The widths are the operands' row lengths as X·W reads them, n and k; a weight's gradient
(its inner dimension the tokens) passes its own, m and n.
"""

from __future__ import annotations

from harness.common.hardware import GPUS, GPUSpec
from harness.plan.speed.kernel_table import kernel_table

LAUNCH_S = 6.0e-6  # a kernel's fixed cost: 2^25-flop matmuls take 5.2 us in the table
OPERAND_TRAFFIC = 1.10  # operand bytes moved over the minimum, tiles re-read from HBM
# A weight gradient accumulated into fp32 in the matmul itself (beta = 1): Megatron-core's
# gradient_accumulation_fusion hands TransformerEngine's layers, its GroupedLinear's experts included, the
# fp32 main_grad as the output (fuse_wgrad_accumulation, megatron/core/extensions/transformer_engine.py
# @ 6a6cd478), so each result element is read and written in fp32 where a plain matmul writes it once.
ACCUMULATED_RESULT_BYTES = 4 + 4
INNER_OVERHEAD = 96  # elements of k each output tile's prologue and epilogue cost
# A training step runs tensor-core work back to back, as the largest sizes of a square-matmul
# sweep do, and the card's clocks settle under its power limit: the largest size each sweep of
# zzc0721/torch-performance-test-data measured ran at 0.90 (H100 SXM, 10240^3: 719.7 TFLOP/s
# against 797.5 at 8192^3, issue 79), 0.95 (H100 PCIe, issue 95) and 0.90 (A100 PCIe 40GB,
# issue 108) of the sweep's best. The mean scales every matmul of a step.
SUSTAINED = 0.92
# The card SUSTAINED stands for (its sweeps: the H100 SXM's, with the H100 PCIe's and A100 PCIe's within
# 5%): another card's long-run matmul (hardware.py's long_run_matmul, one benchmark run alike on every card)
# is taken relative to this one's, so the settling both measure is counted once.
REFERENCE_CARD = "H100"

# The main loop's rate by the elements every width is a multiple of, 2 (align2 kernels) or 1 (align1),
# over the aligned (8) rate: fp16 matmuls of 512 x 4096 x K and 512 x N x 4096 swept one element at a
# time from 4000 to 4100 (JihaoXin/GAC scripts/tensor_core_alignment_sweep.py, its figures
# Latex/figures/fig_tc_{k,n}_alignment.png and Latex/figures_h100/fig_tc_{k,n}_alignment_h100.png
# @ 2b0a2a41): A100 aligned 165-172 TFLOP/s, even 102-105, odd 56; H100 aligned 340-345, even 162,
# odd 100-105. A width a multiple of 4 runs as an even one in both sweeps. Cards of other generations
# have no such measurement and none is planned for them.
MISALIGNED_SHARE = {"ampere": {2: 0.62, 1: 0.33}, "hopper": {2: 0.47, 1: 0.30}}
ALIGNED_ELEMENTS = 8  # 16 bytes of a 16-bit element: cuBLAS's vectorized loads

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5 + 1 / 16}
# Precisions the blocks' projections run in below the 16-bit one the rest of the model keeps.
LOW_PRECISION = ("fp8", "fp4")


def low_precision_efficiency(gpu: GPUSpec, precision: str) -> float:
    """The card's measured matmul rate over its peak at fp8 or fp4."""
    efficiency = gpu.fp8_efficiency if precision == "fp8" else gpu.fp4_efficiency
    if efficiency is None:
        raise ValueError(f"the {gpu.name} has no measured {precision} matmul")
    return efficiency


def sustained_share(gpu: GPUSpec, precision: str) -> float:
    """The share of its best short-benchmark matmul rate the card keeps through a training step:
    SUSTAINED (the reference card's clocks under its power limit) times the card's long-run matmul
    over the reference card's. A card without a long-run measurement keeps the reference's; an fp4
    matmul's rate (hardware.py's fp4_efficiency) is taken as measured: the GB200's after Azure's long
    warm-up, so the card's long-run share is not applied to it again, and the B200's own (a short
    benchmark's) likewise, none measured long on that card."""
    reference = GPUS[REFERENCE_CARD].long_run_matmul
    if gpu.long_run_matmul is None or reference is None or precision == "fp4":
        return SUSTAINED
    return SUSTAINED * gpu.long_run_matmul / reference


def alignment(widths: tuple[float, ...]) -> int:
    """The elements every width is a multiple of: ALIGNED_ELEMENTS, 2 or 1. A width that is not a
    whole number is an average over shards, not a layout, and counts as aligned."""
    whole = [int(w) for w in widths if float(w).is_integer()]
    return next((a for a in (ALIGNED_ELEMENTS, 2) if all(w % a == 0 for w in whole)), 1)


def main_loop_share(gpu: GPUSpec, precision: str, widths: tuple[float, ...]) -> float:
    """The share of the aligned rate a 16-bit matmul's main loop runs at with operand rows `widths`
    elements long (MISALIGNED_SHARE); 1 for other precisions and for cards without a measurement."""
    tier = alignment(widths)
    if precision not in ("bf16", "fp16") or tier == ALIGNED_ELEMENTS:
        return 1.0
    return MISALIGNED_SHARE.get(gpu.generation, {}).get(tier, 1.0)


def gemm_seconds(
    m: float,
    n: float,
    k: float,
    gpu: GPUSpec,
    precision: str,
    batch: float = 1,
    sustained: float | None = None,
    accumulate: bool = False,
    widths: tuple[float, ...] | None = None,
) -> float:
    """Seconds of `batch` matmuls of (m x k) by (k x n) at `precision` in a training step (at the
    card's sustained_share; a lone kernel, as a benchmark times it: sustained=1). Where the card has
    a measured kernel table (kernel_table.py), a 16-bit matmul is the model's time scaled by the
    measured over the modelled time of the nearest shape the table holds. `accumulate`: the result
    added into an fp32 buffer (ACCUMULATED_RESULT_BYTES). `widths`: the operands' row lengths in
    elements (default n and k, as X·W reads them), which set the main loop's share (main_loop_share)."""
    if sustained is None:
        sustained = sustained_share(gpu, precision)
    share = main_loop_share(gpu, precision, (n, k) if widths is None else widths)
    seconds = _modelled(m, n, k, gpu, precision, batch, sustained, accumulate, share)
    table = kernel_table(gpu) if precision in ("bf16", "fp16") and seconds else None
    nearest = table.nearest_matmul(m, n, k) if table else None
    if nearest is None:
        return seconds
    key = (gpu.name, nearest)
    if key not in _MEASURED_OVER_MODELLED:
        _MEASURED_OVER_MODELLED[key] = nearest[3] / _modelled(*nearest[:3], gpu, "bf16", 1, 1.0)
    return seconds * _MEASURED_OVER_MODELLED[key]


_MEASURED_OVER_MODELLED: dict[tuple[str, tuple[float, ...]], float] = {}


def _modelled(
    m: float,
    n: float,
    k: float,
    gpu: GPUSpec,
    precision: str,
    batch: float,
    sustained: float,
    accumulate: bool = False,
    share: float = 1.0,
) -> float:
    if min(m, n, k, batch) <= 0:
        return 0.0
    rate = gpu.matmul_efficiency * gpu.peak_flops[precision]
    inner = INNER_OVERHEAD
    if precision in LOW_PRECISION:  # the tile's fixed time is worth as many more elements of k as it runs faster
        low_rate = low_precision_efficiency(gpu, precision) * gpu.peak_flops[precision]
        inner, rate = INNER_OVERHEAD * low_rate / (gpu.matmul_efficiency * gpu.tensor_flops), low_rate
    flops = 2.0 * batch * m * n * (k / share + inner)  # the main loop at its share, the tile's fixed time not
    result = ACCUMULATED_RESULT_BYTES if accumulate else BYTES[precision]
    moved = OPERAND_TRAFFIC * batch * ((m * k + k * n) * BYTES[precision] + m * n * result) / gpu.hbm_bytes_per_s
    return LAUNCH_S + max(flops / (sustained * rate), moved)


def gemm_tflops(
    m: float, n: float, k: float, gpu: GPUSpec, precision: str, batch: float = 1, sustained: float | None = None
) -> float:
    """The rate the model gives that matmul, TFLOP/s (for tests and the docs' tables)."""
    return 2.0 * batch * m * n * k / gemm_seconds(m, n, k, gpu, precision, batch, sustained) / 1e12
