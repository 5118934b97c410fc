"""bench/host_overlap.py plans vTrain's one-node runs with the host overlapping the GPU and with
every launch blocking, and splits each run's time into layer passes."""

from __future__ import annotations

import pytest

from bench.host_overlap import (
    accumulation_fit,
    data_parallel_growth,
    layer_pass_ms,
    one_node_rows,
    planned_over_published,
)


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    found = one_node_rows()
    assert len(found) == 1440 and all(int(r["gpus"]) <= 8 for r in found)
    return found


def test_blocking_launches_never_plan_faster_and_slow_the_host_bound_runs(rows):
    """Blocking adds the host's issue to the GPU's work: never a faster plan, and on a run whose
    micro-step the host bounds (width 1,024, TP 8, micro-batch 1) a markedly slower one, though each
    of its layers' forwards already waits on its copies (`layer_syncs`)."""
    for row in rows[::97]:
        assert planned_over_published(row, blocking=True) <= planned_over_published(row, blocking=False) + 1e-9
    small = next(r for r in rows if r["d_model"] == "1024" and "tp=8 " in r["sharding"] and r["micro_batch"] == "1")
    assert planned_over_published(small, blocking=True) < 0.9 * planned_over_published(small, blocking=False)


def test_a_layer_pass_is_the_step_over_the_layers_and_micro_steps(rows):
    row = next(r for r in rows if "pp=1 " in r["sharding"] and r["grad_accum"] != "1")
    published, gpu, host = layer_pass_ms(row)
    step_ms = int(row["global_batch"]) * int(row["seq_len"]) / (float(row["published_tok_s_gpu"]) * int(row["gpus"]))
    assert published == pytest.approx(step_ms * 1e3 / (int(row["n_layers"]) * int(row["grad_accum"])))
    assert 0 < gpu and 0 < host


def test_the_step_splits_into_its_own_work_and_its_layer_passes(rows):
    """c + accumulation x layers x p gives back each published step of a group, and the planned layer
    pass is never shorter than the host's issue of it (the plan takes the longer of host and GPU)."""
    some = [r for r in rows if r["d_model"] == "1024" and r["n_layers"] == "12"]
    fits = accumulation_fit(some)
    assert fits and all(len(key) == 3 for key in fits)
    for published_c, planned_c, published_p, planned_p, host in (f for group in fits.values() for f in group):
        assert published_c > 0 and planned_c > 0 and published_p > 0
        assert planned_p >= host * 0.99
    row = next(r for r in some if "tp=1 pp=1" in r["sharding"] and r["micro_batch"] == "1" and r["gpus"] == "2")
    group = [r for r in some if r["sharding"] == row["sharding"] and r["micro_batch"] == "1"]
    [(published_c, _, published_p, _, _)] = accumulation_fit(group)[(1024, 1, 1)]
    step_ms = int(row["global_batch"]) * int(row["seq_len"]) / (float(row["published_tok_s_gpu"]) * 2) * 1e3
    assert published_c + int(row["grad_accum"]) * 12 * published_p == pytest.approx(step_ms, rel=0.02)


def test_more_data_parallel_ranks_lengthen_the_planned_step(rows):
    published, planned = data_parallel_growth([r for r in rows if r["n_layers"] == "12"])
    assert len(published) == len(planned) > 0
    assert all(g >= 1.0 for g in planned)
