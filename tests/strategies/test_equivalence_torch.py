"""fp32 loss curves of the torch-native strategies against `single` on the same
global batches (CPU, gloo, world size 2), and sharding measured from the tensors."""

from __future__ import annotations

import sys

import pytest

from harness.train.distributed import free_port
from tests.helpers import ROOT, OnFirstUse, env_for_tests, max_rel_diff, read_run, run_bounded, train, trained_once

TOLERANCE = 1e-4  # relative, every step: only the order of floating-point sums differs


# name -> (strategy, extra) of the 2-rank runs, each held to single.
RUNS = {
    "ddp": ("ddp", []),
    "fsdp": ("fsdp", []),
    # Same global batch of 8: 2 ranks x micro-batch 2 x 2 accumulation steps.
    "ddp-accum": ("ddp", ["micro_batch=2"]),
    # Explicit prefetch, and accumulation with a reduce-scatter on every micro-step (the default).
    "fsdp-prefetch-accum": ("fsdp", ["micro_batch=2", "strategy_options.prefetch_blocks=1"]),
    # Accumulation with FSDP2's gradient sync off until the last micro-step.
    "fsdp-accum-sync-once": ("fsdp", ["micro_batch=2", "strategy_options.sync_each_micro_step=false"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, reference_run) -> OnFirstUse[str, tuple[dict, list[dict]]]:
    """name -> (summary, rows), each trained when a test first reads it; "single" is the reference."""

    def trained(name: str) -> tuple[dict, list[dict]]:
        if name == "single":
            return reference_run
        if name == "ddp":  # the run tests/train/test_launch.py starts its workers forked for
            return read_run(trained_once(tmp_path_factory.getbasetemp(), "ddp", nproc=2))
        strategy, extra = RUNS[name]
        return train(tmp_path_factory.mktemp(name), strategy, nproc=2, extra=extra)

    return OnFirstUse(["single", *RUNS], trained)


@pytest.mark.parametrize(
    "name",
    [
        "ddp",
        "fsdp",
        "ddp-accum",
        # FSDP's accumulation options, each a run of its own: under --all.
        pytest.param("fsdp-prefetch-accum", marks=pytest.mark.extended),
        pytest.param("fsdp-accum-sync-once", marks=pytest.mark.extended),
    ],
)
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
        "step",
        "loss",
        "lr",
        "step_time_s",
        "tokens_per_s",
        "peak_mem_allocated_bytes",
        "peak_mem_reserved_bytes",
        "mem_params_bytes",
        "mem_grads_bytes",
        "mem_optimizer_bytes",
        "mfu",
    }
    assert [r["step"] for r in rows] == list(range(1, 11))
    for row in rows:
        assert expected <= set(row)
        assert row["peak_mem_allocated_bytes"] is None and row["mfu"] is None  # CPU: unknown, not zero
        assert row["tokens_per_s"] > 0


# One process over gloo: after a micro-step that is not the last, FSDP2 has reduce-scattered
# into the sharded .grad, or (sync off) holds the unsharded gradient elsewhere and .grad is unset.
SYNC_PROBE = """
import os, sys, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from harness.train.optimizer import adamw_factory
from models.zoo import build_model
from strategies.base import RunContext
from strategies.torch_mesh import MeshStrategy
ctx = RunContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), precision="fp32",
                 micro_batch=2, grad_accum=2, grad_clip=1.0)
for sync in (True, False):
    strategy = MeshStrategy(ctx, sync_each_micro_step=sync)
    model, _ = strategy.setup(build_model("gpt-nano"), adamw_factory(1e-3, (0.9, 0.95), 0.1))
    tokens = torch.randint(0, 128, (2, 9))
    with strategy.no_sync():
        strategy.backward(model(tokens[:, :-1], tokens[:, 1:]))
    grads = [p.grad is not None for p in model.parameters()]
    print(sync, all(grads), any(grads))
dist.destroy_process_group()
"""


def test_fsdp_reduces_every_micro_step_unless_told_not_to():
    proc = run_bounded(
        [sys.executable, "-c", SYNC_PROBE, str(free_port())],
        timeout=120,
        env=env_for_tests(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["True True True", "False False False"]
