"""fp32 loss curves of the torch-native strategies against `single` on the same
global batches (CPU, gloo, world size 2), and sharding measured from the tensors."""
from __future__ import annotations

import pytest

from tests.helpers import max_rel_diff, train

TOLERANCE = 1e-4  # relative, every step: only the order of floating-point sums differs


@pytest.fixture(scope="module")
def runs(tmp_path_factory, reference_run):
    out = {"single": reference_run}
    for strategy in ("ddp", "fsdp"):
        out[strategy] = train(tmp_path_factory.mktemp(strategy), strategy, nproc=2)
    # Same global batch of 8: 2 ranks x micro-batch 2 x 2 accumulation steps.
    out["ddp-accum"] = train(tmp_path_factory.mktemp("accum"), "ddp", nproc=2, extra=["micro_batch=2"])
    # Explicit prefetch and accumulation without gradient sync on FSDP2's side.
    out["fsdp-prefetch-accum"] = train(tmp_path_factory.mktemp("prefetch"), "fsdp", nproc=2,
                                       extra=["micro_batch=2", "strategy_options.prefetch_blocks=1"])
    return out


@pytest.mark.parametrize("name", ["ddp", "fsdp", "ddp-accum", "fsdp-prefetch-accum"])
def test_loss_matches_single(runs, name, record_property):
    summary, rows = runs[name]
    _, reference = runs["single"]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"{name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == 2


def test_accumulation_really_accumulates(runs):
    summary, _ = runs["ddp-accum"]
    assert (summary["micro_batch"], summary["grad_accum"]) == (2, 2)


def test_loss_falls_towards_the_floor(runs):
    summary, rows = runs["single"]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.05
    assert summary["loss_floor"] < rows[-1]["loss"]


def test_fsdp_shards_model_states_ddp_replicates(runs):
    single, _ = runs["single"]
    ddp, _ = runs["ddp"]
    fsdp, _ = runs["fsdp"]
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert ddp[key] == pytest.approx(single[key], rel=0.01), key
        # FSDP pads each shard to an equal size, so "about half" rather than exactly.
        assert fsdp[key] == pytest.approx(single[key] / 2, rel=0.05), key


def test_metrics_rows_carry_every_field(runs):
    _, rows = runs["fsdp"]
    expected = {
        "step", "loss", "lr", "step_time_s", "tokens_per_s", "peak_mem_allocated_bytes", "peak_mem_reserved_bytes",
        "mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes", "mfu",
    }
    assert [r["step"] for r in rows] == list(range(1, 11))
    for row in rows:
        assert expected <= set(row)
        assert row["peak_mem_allocated_bytes"] is None and row["mfu"] is None  # CPU: unknown, not zero
        assert row["tokens_per_s"] > 0
