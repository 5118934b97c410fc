"""A card's measured kernel table: read where present, ignored where not, and each part replacing
the model's figure for plans on that card (tests/bench/test_kernel_table_bench.py: what
bench/kernel_table.py writes is what this reads)."""

from __future__ import annotations

import json

import pytest

import harness.plan.speed.kernel_table as kernel_tables
from harness.common.hardware import GPUS
from harness.plan.model.model_shape import PlanError
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from harness.plan.speed.attention import attention_seconds
from harness.plan.speed.compute import MEMORY_EFFICIENCY, memory_bytes_per_s
from harness.plan.speed.gemm import gemm_seconds
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL

H100 = GPUS["H100"]
SHAPE = (4096.0, 1536.0, 4096.0)  # a block's projection on one of tp=8 GPUs, 4,096 tokens


@pytest.fixture
def tables(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_tables, "TABLES", tmp_path)
    return tmp_path


def _write(directory, **parts) -> None:
    table = {"source": "a test", "host_s_per_kernel": {"eager": 48e-6, "compiled": 9.4e-6}, **parts}
    (directory / "H100.json").write_text(json.dumps(table))
    kernel_tables._table_of.cache_clear()  # the planner reads a card's table once a process


def _plan():
    config = PlanConfig(layers=24, width=1024, heads=16, vocab=50304, seq_len=2048, gpus=8, micro_batch=1)
    return plan_strategy("ddp", question(config))


def test_without_a_table_the_model_stands(tables):
    assert kernel_tables.kernel_table(H100) is None
    assert memory_bytes_per_s(H100) == H100.hbm_bytes_per_s * MEMORY_EFFICIENCY


def test_a_tables_host_times_replace_the_published_ones(tables):
    before = _plan().time.host
    _write(tables)
    after = _plan().time.host
    assert after.kernels == before.kernels
    assert after.seconds == pytest.approx(2 * before.seconds)  # twice HOST_S_PER_KERNEL, kernels and collectives
    assert HOST_S_PER_KERNEL["eager"] == 24e-6


def test_a_measured_matmul_scales_the_model_at_and_near_its_shape(tables):
    modelled = {shape: gemm_seconds(*shape, H100, "bf16", sustained=1.0) for shape in (SHAPE, (4096.0, 1536.0, 5000.0))}
    fp8 = gemm_seconds(*SHAPE, H100, "fp8")
    _write(tables, matmuls=[[*SHAPE, 2 * modelled[SHAPE]]])
    for shape, seconds in modelled.items():
        assert gemm_seconds(*shape, H100, "bf16", sustained=1.0) == pytest.approx(2 * seconds)
    assert gemm_seconds(*SHAPE, H100, "fp8") == fp8  # the table's matmuls are 16-bit


def test_measured_attention_and_memory_rates_replace_the_published_ones(tables):
    kw = dict(batch=4, seq=4096, heads=16, head_dim=128)
    published = sum(attention_seconds(H100, "flash", "bf16", **kw))
    _write(tables, attention={"flash": [[2048, 128, 100.0], [8192, 128, 300.0]]}, memory_efficiency=0.8)
    measured = sum(attention_seconds(H100, "flash", "bf16", **kw))
    flops = 3.5 * 2 * 4 * 4096 * 4096 * 16 * 128
    assert measured == pytest.approx(flops / 200e12)  # halfway between 2k and 8k in log2(seq)
    assert measured != published
    assert sum(attention_seconds(H100, "cudnn", "bf16", **kw)) > 0  # a kernel the table lacks: the published rate
    assert memory_bytes_per_s(H100) == pytest.approx(0.8 * H100.hbm_bytes_per_s)


def test_a_file_that_is_not_a_table_is_one_line(tables):
    (tables / "H100.json").write_text('{"host_s_per_kernel": {"eager": 1e-5}}')
    kernel_tables._table_of.cache_clear()
    with pytest.raises(PlanError, match=r"H100\.json: not a kernel table .*run bench/kernel_table.py"):
        kernel_tables.kernel_table(H100)
