"""bench/ci_layer_time.py splits a functional test's step into the layer passes one GPU runs."""

from __future__ import annotations

from bench.ci_layer_time import implementation, layer_slots


def _row(sharding: str, grad_accum: str = "4", table: str = "gpt3_mcore_te_tp1_pp4 (dev, dgx_h100)") -> dict:
    return {"sharding": sharding, "grad_accum": grad_accum, "n_layers": "12", "table": table}


def test_a_pipeline_stage_runs_its_layers_for_each_micro_batch_and_the_fill():
    assert layer_slots(_row("megatron tp=1 pp=4 dp=2 ddp")) == 3 * (4 + 3)
    assert layer_slots(_row("megatron tp=4 pp=1 dp=2 ddp")) == 12 * 4
    assert layer_slots(_row("megatron tp=1 pp=1 dp=8 ddp", grad_accum="")) == 12


def test_interleaved_context_parallel_and_one_tray_runs_are_left_out():
    assert layer_slots(_row("megatron tp=1 pp=4 vp=2 dp=2 ddp")) is None
    assert layer_slots(_row("megatron tp=2 pp=2 cp=2 dp=1 ddp")) is None
    assert layer_slots(_row("megatron tp=1 pp=4 dp=1 ddp", table="x_1node (dev, dgx_gb200)")) is None


def test_the_layers_implementation_is_read_from_the_sharding_and_the_test():
    assert implementation(_row("megatron tp=2 pp=2 ddp transformer_engine")) == "TransformerEngine"
    assert implementation(_row("megatron tp=2 pp=2 ddp", table="gpt3_mcore_tp2_pp2_uninstall_te (dev)")) == (
        "local, no TE installed"
    )
    assert implementation(_row("megatron tp=2 pp=2 ddp")) == "local"
