"""bench/host_overlap.py plans vTrain's one-node runs with the host overlapping the GPU and with
every launch blocking, and splits each run's time into layer passes."""

from __future__ import annotations

import pytest

from bench.host_overlap import layer_pass_ms, one_node_rows, planned_over_published


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    found = one_node_rows()
    assert len(found) == 1440 and all(int(r["gpus"]) <= 8 for r in found)
    return found


def test_blocking_launches_never_plan_faster_and_slow_the_host_bound_runs(rows):
    """Blocking adds the host's issue to the GPU's work: never a faster plan, and on a run whose
    micro-step the host bounds (width 1,024, TP 8, micro-batch 1) a markedly slower one."""
    for row in rows[::97]:
        assert planned_over_published(row, blocking=True) <= planned_over_published(row, blocking=False) + 1e-9
    small = next(r for r in rows if r["d_model"] == "1024" and "tp=8 " in r["sharding"] and r["micro_batch"] == "1")
    assert planned_over_published(small, blocking=True) < 0.8 * planned_over_published(small, blocking=False)


def test_a_layer_pass_is_the_step_over_the_layers_and_micro_steps(rows):
    row = next(r for r in rows if "pp=1 " in r["sharding"] and r["grad_accum"] != "1")
    published, gpu, host = layer_pass_ms(row)
    step_ms = int(row["global_batch"]) * int(row["seq_len"]) / (float(row["published_tok_s_gpu"]) * int(row["gpus"]))
    assert published == pytest.approx(step_ms * 1e3 / (int(row["n_layers"]) * int(row["grad_accum"])))
    assert 0 < gpu and 0 < host
