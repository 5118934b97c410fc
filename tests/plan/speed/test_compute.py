"""The compute model term by term: matmuls by shape against measured tables, attention by its
kernel, the memory-bound share derived from the reference H100, checkpointing's cost between
none and full, compile's fusion."""

from __future__ import annotations

import csv
import math
import statistics

import pytest

from harness.common.hardware import GPUS, gpu_spec
from harness.plan.model.model_shape import shape_of_description, shape_of_spec
from harness.plan.speed.attention import attention_seconds, attention_tflops
from harness.plan.speed.compute import MEMORY_EFFICIENCY, Regime, elementwise_bytes_per_token
from harness.plan.speed.gemm import gemm_tflops
from tests.helpers import ROOT
from tests.plan.speed.work import step_work

XLA_TABLE = ROOT / "bench" / "data" / "xla_sm90_matmul_bf16.csv"
H100, A100 = GPUS["H100"], GPUS["A100"]


def _xla_rows() -> list[tuple[int, int, int, int, float]]:
    with XLA_TABLE.open() as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("#"))][1:]
    return [(int(b), int(m), int(n), int(k), float(tf)) for b, m, n, k, tf, _ in rows]


def test_a_lone_matmul_matches_openxlas_measured_h100_table_by_size():
    errors: dict[int, list[float]] = {}
    for b, m, n, k, measured in _xla_rows():
        predicted = gemm_tflops(m, n, k, H100, "bf16", batch=b, sustained=1.0)
        errors.setdefault(int(math.log2(2 * b * m * n * k)), []).append(math.log(predicted / measured))
    assert len(sum(errors.values(), [])) == 375
    overall = [e for bucket in errors.values() for e in bucket]
    assert math.sqrt(statistics.mean(e * e for e in overall)) < 0.10  # rms log error
    for size, bucket in errors.items():
        if size >= 29:  # from half a gigaflop up, where training's matmuls are
            assert abs(statistics.median(bucket)) < 0.07, (size, statistics.median(bucket))
    by_inner: dict[int, list[float]] = {}
    for b, m, n, k, measured in _xla_rows():
        if 2 * b * m * n * k >= 2**32:
            by_inner.setdefault(k, []).append(
                math.log(gemm_tflops(m, n, k, H100, "bf16", batch=b, sustained=1.0) / measured)
            )
    assert all(abs(statistics.median(e)) < 0.06 for e in by_inner.values()), by_inner.keys()


@pytest.mark.parametrize(
    "gpu,size,measured",
    [  # zzc0721/torch-performance-test-data: square bf16 matmuls (issues 79 and 95)
        ("H100", 2048, 676.59),
        ("H100", 4096, 788.72),
        ("H100", 8192, 797.51),
        ("H100 PCIe", 1024, 217.70),
        ("H100 PCIe", 2048, 449.09),
        ("H100 PCIe", 4096, 495.93),
    ],
)
def test_a_lone_square_matmul_matches_the_published_sweeps(gpu, size, measured):
    # Two measurements of the H100's 2048^3 differ by 7% between themselves (OpenXLA's table: 632).
    assert gemm_tflops(size, size, size, GPUS[gpu], "bf16", sustained=1.0) == pytest.approx(measured, rel=0.12)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_matmul_efficiency_rises_with_size_and_stays_under_the_peak(gpu):
    spec = GPUS[gpu]
    half = "bf16" if "bf16" in spec.peak_flops else "fp16"  # a V100 has fp16 tensor cores only
    rates = [gemm_tflops(s, s, s, spec, half) for s in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    assert rates == sorted(rates)
    assert rates[-1] * 1e12 < spec.matmul_efficiency * spec.peak_flops[half] < spec.peak_flops[half]
    skinny, square = gemm_tflops(16384, 4096, 256, spec, half), gemm_tflops(16384, 4096, 4096, spec, half)
    assert skinny < square  # a small inner dimension is bound by moving its operands


def test_attention_by_kernel_head_dim_and_sequence():
    # The published FlashAttention-2 figures, at the card's own peak.
    assert attention_tflops(H100, "flash", 128, 16384) == pytest.approx(328)
    assert attention_tflops(A100, "flash", 64, 2048) == pytest.approx(140)
    h200 = gpu_spec("H200")
    assert attention_tflops(h200, "flash", 128, 4096) == pytest.approx(294)  # same SMs and clocks as the H100
    for gpu in (H100, A100):
        by_seq = [attention_tflops(gpu, "flash", 128, s) for s in (256, 512, 2048, 8192, 65536)]
        assert by_seq == sorted(by_seq)  # longer sequences run closer to the peak, then level off
        assert attention_tflops(gpu, "flash", 64, 4096) < attention_tflops(gpu, "flash", 128, 4096)
        assert attention_tflops(gpu, "flash", 96, 4096) == pytest.approx(
            (attention_tflops(gpu, "flash", 64, 4096) + attention_tflops(gpu, "flash", 128, 4096)) / 2
        )
        assert attention_tflops(gpu, "math", 128, 4096) < attention_tflops(gpu, "flash", 128, 4096)
        # Tri Dao's Triton kernel (llm-foundry's attn_impl=triton): FlashAttention-1's rate, by its header.
        assert attention_tflops(gpu, "triton", 64, 16384) == attention_tflops(gpu, "flash1", 64, 16384)
    assert attention_tflops(H100, "flash3", 128, 8192) > 1.5 * attention_tflops(H100, "flash", 128, 8192)
    # cuDNN's kernel, measured on an H200 (same tensor cores and clocks as the H100): Hopper only.
    assert attention_tflops(H100, "cudnn", 128, 8192) > 1.5 * attention_tflops(H100, "flash", 128, 8192)
    with pytest.raises(ValueError, match="no cudnn attention figures"):
        attention_tflops(gpu_spec("A100"), "cudnn", 128, 8192)
    forward, backward = attention_seconds(H100, "flash", "bf16", batch=2, seq=4096, heads=32, head_dim=128)
    assert backward == pytest.approx(2.5 * forward)  # the benchmark's flop split


def test_the_memory_bound_share_is_what_eager_and_compiled_single_measured_apart():
    """docs/benchmarks.md, 2026-11-23, H100: single eager 319,108 and single+compile 469,415 tokens/s at
    gpt2-124m, micro-batch 16 x 1024. Compile changes only the memory-bound work (the matmuls and
    attention are the same kernels), so the model's difference at the data sheet's bandwidth over
    the measured one is the share of it eager kernels reach."""
    shape = shape_of_spec("gpt2-124m")
    eager, compiled = step_work(shape), step_work(shape, compiled=True, fused_loss=True)
    memory_bound = lambda w: (w.elementwise_s + w.loss_s) * MEMORY_EFFICIENCY  # noqa: E731 (at the data sheet's bandwidth)
    measured = 16 * 1024 / 319_108 - 16 * 1024 / 469_415
    assert (memory_bound(eager) - memory_bound(compiled)) / measured == pytest.approx(MEMORY_EFFICIENCY, abs=0.01)
    assert eager.matmul_s == compiled.matmul_s and eager.attention_s == compiled.attention_s


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_selective_checkpointing_costs_between_none_and_full(arch):
    shape = shape_of_description(
        params=None, layers=8, width=2048, heads=16, vocab=32000, seq_len=4096, kv_heads=4, arch=arch
    )
    kw = dict(micro_batch=2, seq_len=4096, mixed_precision="low_precision")
    none, selective, full = (step_work(shape, checkpointing=m, **kw) for m in ("none", "selective", "full"))
    assert none.recompute_s == 0 < selective.recompute_s < full.recompute_s
    assert none.micro_step_s < selective.micro_step_s < full.micro_step_s
    assert selective.attention_s == none.attention_s < full.attention_s  # selective keeps attention's output
    # Full checkpointing runs every block's forward again: about a third more than none.
    assert full.micro_step_s / none.micro_step_s == pytest.approx(4 / 3, abs=0.06)


def test_compile_fuses_the_elementwise_work_and_fused_loss_the_loss():
    shape = shape_of_description(params=None, layers=8, width=2048, heads=16, vocab=128256, seq_len=2048, arch="llama")
    eager, compiled, fused = step_work(shape), step_work(shape, compiled=True), step_work(shape, fused_loss=True)
    assert compiled.elementwise_s < eager.elementwise_s / 2
    assert fused.loss_s == pytest.approx(eager.loss_s * 6 / 36)
    assert fused.matmul_s == eager.matmul_s


def test_a_fused_rms_norm_moves_what_layer_norm_does():
    """Eager RMSNorm goes through fp32 (36 bytes per element forward from bf16, 72 backward); a fused
    kernel reads its input and writes its output (4), and reads the input and the gradient to
    write the input's gradient (6)."""
    shape = shape_of_description(params=None, layers=8, width=2048, heads=16, vocab=32000, seq_len=2048, arch="llama")
    regime = Regime.of("bf16", "low_precision")
    eager = elementwise_bytes_per_token(shape.dims, regime, compiled=False, tp=1)
    fused = elementwise_bytes_per_token(shape.dims, regime, compiled=False, tp=1, fused_norm=True)
    two_norms = 2 * shape.dims.width
    assert eager[0] - fused[0] == (36 - 4) * two_norms and eager[1] - fused[1] == (72 - 6) * two_norms
    assert step_work(shape, fused_norm=True).elementwise_s < step_work(shape).elementwise_s


def test_compile_leaves_a_complex_rotary_at_eagers_cost():
    """Inductor runs complex operators as eager kernels: torchtitan's rotary costs compiled what it
    costs eager (20 bytes per element of q and k each way), a real-valued one 4."""
    shape = shape_of_description(params=None, layers=8, width=4096, heads=32, vocab=128256, seq_len=8192, arch="llama")
    regime, dims = Regime.of("bf16", "low_precision"), shape.dims
    real = elementwise_bytes_per_token(dims, regime, compiled=True, tp=1)
    complex_ = elementwise_bytes_per_token(dims, regime, compiled=True, tp=1, complex_rope=True)
    rotated = dims.q_width + dims.kv_width
    assert complex_[0] - real[0] == complex_[1] - real[1] == (20 - 4) * rotated
    eager = elementwise_bytes_per_token(dims, regime, compiled=False, tp=1)
    assert elementwise_bytes_per_token(dims, regime, compiled=False, tp=1, complex_rope=True) == eager


@pytest.mark.parametrize("compiled", [False, True])
def test_tensor_parallel_splits_each_blocks_elementwise_work_once(compiled):
    """The heads' and the MLP's work splits over the group, the residual stream's too (sequence
    parallelism): every byte once over tp, none twice."""
    shape = shape_of_description(
        params=None, layers=8, width=4096, heads=32, vocab=128256, seq_len=8192, kv_heads=8, ffn=14336, arch="llama"
    )
    regime = Regime.of("bf16", "low_precision")
    whole = elementwise_bytes_per_token(shape.dims, regime, compiled, tp=1)
    split = elementwise_bytes_per_token(shape.dims, regime, compiled, tp=8)
    assert split == pytest.approx((whole[0] / 8, whole[1] / 8))


def test_a_model_without_layers_costs_its_six_n_flops_at_the_matmul_rate():
    shape = shape_of_description(params=1e9, layers=None, width=None, heads=None, vocab=None, seq_len=1024)
    plain = shape.__class__(shape.name, shape.params, shape.flops_params, None, None)
    work = step_work(plain, micro_batch=4)
    assert work.matmul_s == pytest.approx(6e9 * 4096 / (H100.matmul_efficiency * H100.peak_flops["bf16"]))
    assert work.attention_s == work.elementwise_s == 0
