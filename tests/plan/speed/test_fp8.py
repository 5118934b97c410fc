"""precision=fp8: the blocks' projections in fp8 at the card's fp8 rate, their casts paid in
memory traffic, everything else (states, activations, FSDP's collectives) held in bf16, tensor
parallel's all-gathers in fp8; a card without fp8 tensor cores is a one-line error. Torch-free."""

from __future__ import annotations

import pytest

from harness.common.hardware import GPUS
from harness.plan.model.model_shape import PlanError, shape_of_description
from harness.plan.network.comm import _tensor_parallel
from harness.plan.network.fabric import Group
from harness.plan.parallel.layout import Layout
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.plan_options import gpu_of
from harness.plan.predict import plan_strategy
from harness.plan.speed.compute import (
    FP8_CAST_BYTES,
    MEMORY_EFFICIENCY,
    TE_CAST_BYTES,
    compute_work,
    fp8_cast_bytes,
    te_fp8_cast_bytes,
)
from harness.plan.speed.gemm import gemm_tflops
from tests.helpers import env_for_tests, run_cli

H100 = GPUS["H100"]
LLAMA_8B = dict(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, arch="llama", seq_len=8192)


def test_a_large_fp8_matmul_runs_at_the_fp8_mamf_and_a_short_inner_dimension_costs_it_more():
    big = gemm_tflops(8192, 8192, 8192, H100, "fp8", sustained=1)
    assert big == pytest.approx(H100.fp8_efficiency * 1979 / (1 + 170 / 8192), rel=0.02)  # 70.9% of 1979
    ratio = big / gemm_tflops(8192, 8192, 8192, H100, "bf16", sustained=1)
    assert 1.7 < ratio < 1.8  # 0.709 x 1979 over 0.803 x 989, less the longer inner overhead
    # A tile's fixed time is worth more elements of k at fp8's rate: k=512 loses more than bf16's.
    short = gemm_tflops(8192, 8192, 512, H100, "fp8", sustained=1) / gemm_tflops(8192, 8192, 512, H100, "bf16")
    assert short < ratio


def _work(shape, precision, tp=1, checkpointing="none", te_fp8=False):
    return compute_work(
        shape,
        micro_batch=2,
        seq_len=8192,
        precision="bf16",
        matmul_precision=precision,
        mixed_precision="low_precision",
        compiled=True,
        checkpointing=checkpointing,
        gpu=H100,
        attention="flash",
        fused_loss=False,
        tp=tp,
        optimizer_params=shape.params,
        engine="torch",
        te_fp8=te_fp8,
    )


def test_fp8_halves_the_projections_and_pays_their_casts_in_memory_traffic():
    shape = shape_of_description(params=None, **LLAMA_8B)
    bf16, fp8 = _work(shape, "bf16"), _work(shape, "fp8")
    assert 0.5 < fp8.matmul_s / bf16.matmul_s < 0.62  # the head stays bf16
    assert fp8.attention_s == bf16.attention_s
    forward, backward, again = fp8_cast_bytes(shape.dims, 2 * 8192, 1, "none")
    assert again == 0 and forward > 0 and backward > 0
    casts = (forward + backward) / (H100.hbm_bytes_per_s * MEMORY_EFFICIENCY)
    assert fp8.elementwise_s - bf16.elementwise_s == pytest.approx(casts)
    assert fp8.micro_step_s < 0.85 * bf16.micro_step_s
    # Full checkpointing casts the forward's again; selective recasts without the amax.
    full, selective = (fp8_cast_bytes(shape.dims, 2 * 8192, 1, c)[2] for c in ("full", "selective"))
    assert full == forward and selective == pytest.approx(forward * 3 / FP8_CAST_BYTES)


def test_tensor_parallel_casts_its_gathered_inputs_on_the_shard_and_gathers_fp8():
    shape = shape_of_description(params=None, **LLAMA_8B)
    one, eight = fp8_cast_bytes(shape.dims, 16384, 1, "none"), fp8_cast_bytes(shape.dims, 16384, 8, "none")
    assert eight[0] == pytest.approx(one[0] / 8)  # every input, gradient and weight split eight ways
    one_gpu = Group(1, 1)
    layout = Layout(
        tp=8,
        shard=1,
        replicas=1,
        hpz=1,
        shard_group=one_gpu,
        replica_group=one_gpu,
        tp_group=Group(8, 1),
        hpz_group=one_gpu,
    )
    bf16 = {c.kind: c.payload_bytes for c in _tensor_parallel(shape, layout, 16384, "bf16", "full")}
    fp8 = {c.kind: c.payload_bytes for c in _tensor_parallel(shape, layout, 16384, "bf16", "full", fp8=True)}
    assert fp8["reduce-scatter"] == bf16["reduce-scatter"]
    head = 2 * 16384 * shape.dims.width * 2  # the head's two gathers stay bf16
    assert fp8["all-gather"] - head == pytest.approx((bf16["all-gather"] - head) / 2)


@pytest.fixture(scope="module")
def llama8b():
    runs = {}
    for precision in ("bf16", "fp8"):
        q = question(PlanConfig(**LLAMA_8B, gpus=8, gpu="H100", micro_batch=2, precision=precision))
        runs[precision] = plan_strategy("fsdp", q)
    return runs


def test_an_fp8_plan_holds_what_the_bf16_plan_holds_and_runs_faster(llama8b):
    bf16, fp8 = llama8b["bf16"], llama8b["fp8"]
    assert fp8.peak_bytes == bf16.peak_bytes and fp8.states == bf16.states
    assert [c.payload_bytes for c in fp8.collectives] == [c.payload_bytes for c in bf16.collectives]
    assert 1.1 < fp8.time.tokens_per_s / bf16.time.tokens_per_s < 1.6


def test_the_table_reports_fp8_mfu_against_the_bf16_peak():
    proc = run_cli(
        ["plan", "model=gpt2-1.5b", "precision=fp8", "strategies=[fsdp]", "format=json"], env=env_for_tests()
    )
    assert proc.returncode == 0, proc.stderr
    assert '"peak_flops": 989000000000000.0' in proc.stdout and '"precision": "fp8"' in proc.stdout


def test_fp8_on_a_card_without_fp8_tensor_cores_is_an_error():
    with pytest.raises(PlanError, match="no fp8 tensor cores"):
        gpu_of(PlanConfig(model="gpt2-124m", gpu="A100", precision="fp8"))
    proc = run_cli(["plan", "model=gpt2-124m", "gpu=A100", "precision=fp8"], env=env_for_tests())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no fp8 tensor cores" in proc.stderr


def test_transformer_engine_casts_weights_once_a_step_and_fuses_the_input_casts():
    """TE's fp8 (te_fp8): the weights' cast and transpose leave the micro-step for the step (its
    cache across micro-batches), and each micro-step casts less than torchao's float8 does."""
    shape = shape_of_description(params=None, **LLAMA_8B)
    torchao, te = _work(shape, "fp8"), _work(shape, "fp8", te_fp8=True)
    assert torchao.weight_cast_s == 0 and te.weight_cast_s > 0
    *_, weights = te_fp8_cast_bytes(shape.dims, 2 * 8192, 1, "none")
    block = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096  # q, o; k, v; gate, up, down
    assert weights == pytest.approx(TE_CAST_BYTES * block * shape.dims.layers)
    assert te.weight_cast_s == pytest.approx(weights / (H100.hbm_bytes_per_s * MEMORY_EFFICIENCY))
    assert te.elementwise_s < torchao.elementwise_s
    assert te.step_s == te.optimizer_s + te.weight_cast_s
