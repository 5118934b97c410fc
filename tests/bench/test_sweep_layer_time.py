"""bench/sweep_layer_time.py reads a layer's time on a micro-batch off a sweep run's tokens/s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.layout_kinds import layer_slots
from bench.sweep_layer_time import flat_time_lines, layer_seconds, layer_time_lines


def _row(micro_batch: int, grad_accum: int, tp: int = 4, pp: int = 2, nodes: int = 2) -> dict[str, str]:
    return {
        "model": "nanotron-1b",
        "nodes": str(nodes),
        "gpus": str(8 * nodes),
        "gpu": "H100-80",
        "global_batch": "256",
        "seq_len": "4096",
        "n_layers": "16",
        "micro_batch": str(micro_batch),
        "grad_accum": str(grad_accum),
        "sharding": f"megatron tp={tp} pp={pp} dp={8 * nodes // (tp * pp)} ddp nanotron",
    }


def test_a_pipeline_stage_runs_its_layers_for_each_micro_batch_and_the_fill():
    assert layer_slots(16, 2, 128) == 8 * (128 + 1)
    assert layer_slots(16, 1, 4) == 16 * 4
    assert layer_slots(16, 3, 4) is None


def test_a_layers_time_is_the_step_over_the_layer_passes_of_one_gpu():
    # 256 sequences of 4,096 at 3,824 tokens/s on each of 16 GPUs: a 17.1 s step of 8 x 129 passes.
    step = 256 * 4096 / (3824 * 16)
    assert layer_seconds(_row(1, 128), 3824) == pytest.approx(step / (8 * 129))
    assert layer_seconds(_row(1, 128, pp=3), 3824) is None


def _outcome(row: dict[str, str], published: float, predicted: float) -> SimpleNamespace:
    return SimpleNamespace(row=row, published=published, predicted=predicted)


def test_a_time_that_holds_still_as_the_work_grows_is_shown_beside_the_plans():
    # A step of 16 micro-batches of 8 runs 8 x 17 layer passes, one of 128 micro-batches of 1, 8 x 129.
    # Published: a pass takes as long at 8 times the work (tokens/s up by 129 / 17); planned: 8 times
    # as long (tokens/s up by 129 / 17 / 8).
    one, eight = _row(1, 128), _row(8, 16)
    lines = flat_time_lines([_outcome(one, 1000.0, 4000.0), _outcome(eight, 1000.0 * 129 / 17, 4000.0 * 129 / 17 / 8)])
    assert "| 8 | 1 | 1.00 | 8.00 |" in lines
    # By where the pipeline runs: one node without one (256 x 4,096 tokens at 1,000 a GPU on 8: 131 s
    # over 16 x 128 passes, 64.0 ms), two nodes with two stages (65.5 s over 8 x 129 passes, 63.5 ms).
    table = layer_time_lines([_outcome(one, 1000.0, 4000.0), _outcome(_row(1, 128, pp=1, nodes=1), 1000.0, 2000.0)])
    assert "| tp 4 | 64.0 / 32.0 (1) | - | - | 63.5 / 15.9 (1) |" in table
