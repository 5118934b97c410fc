"""Mixture-of-experts models at world size 4 on the CPU (gloo), fp32, dropless: the zoo's moe-nano and a
small transformers Mixtral (4 experts, top-2, hidden 64, its balance loss on) under expert parallel 2 x
data parallel 2, on the torch side (ddp-ep) and through DeepSpeed's MoE layers (zero2-ep), each loss
curve against `single` on the same global batches. Also: a capacity run against single at the same
capacity, the router figures in summary.json and the report, a killed rank resumed bit for bit, and a
bad ep_size refused in one line before any worker starts.

One run per case, shared by every check (module scope).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.testing_hooks import FAULT_ENV
from tests.helpers import (
    TINY_MIXTRAL,
    OnFirstUse,
    env_for_tests,
    losses_by_step,
    max_rel_diff,
    read_run,
    run_cli,
    succeeded,
)

pytestmark = pytest.mark.timeout(1500)

TOLERANCE = 1e-5  # the compare's fp32 "matches": only the order of floating-point sums differs
NPROC = 4
RUN = ["device=cpu", "steps=10", "batch_size=8", "seq_len=32", "data_samples=256", "log_every=5"]
MODELS = {
    "moe-nano": ["model=moe-nano"],
    "mixtral": TINY_MIXTRAL,
}
CAPACITY = ["model_kwargs.capacity_factor=1.0"]
EP = ["strategy_options.ep_size=2"]
# name -> (model, strategy, extra): ddp-ep accumulates 2 micro-steps (its experts reduced once per step);
# the moe-nano runs checkpoint at step 5, which the fault test resumes from.
CASES = {
    "moe-nano/single": ("moe-nano", "single", ["checkpoint_every=5"]),
    "moe-nano/ddp-ep": ("moe-nano", "ddp-ep", [*EP, "micro_batch=1", "checkpoint_every=5"]),
    "moe-nano/zero2-ep": ("moe-nano", "zero2-ep", [*EP, "checkpoint_every=5"]),
    "mixtral/single": ("mixtral", "single", []),
    "mixtral/ddp-ep": ("mixtral", "ddp-ep", EP),
    "mixtral/zero2-ep": ("mixtral", "zero2-ep", EP),
    "capacity/single": ("moe-nano", "single", CAPACITY),
    "capacity/ddp-ep": ("moe-nano", "ddp-ep", [*EP, *CAPACITY]),
}


def _args(model: str, strategy: str, out_dir: Path, extra: list[str]) -> list[str]:
    nproc = 1 if strategy == "single" else NPROC
    return ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *MODELS[model], *RUN, *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> OnFirstUse[str, tuple[dict, list[dict], str, Path]]:
    """name -> (summary, rows, stdout, out_dir), each trained when a test first reads it."""

    def trained(name: str) -> tuple[dict, list[dict], str, Path]:
        model, strategy, extra = CASES[name]
        out_dir = tmp_path_factory.mktemp(name.replace("/", "-"))
        stdout = succeeded(run_cli(_args(model, strategy, out_dir, extra), env=env_for_tests(), timeout=400))
        return (*read_run(out_dir), stdout, out_dir)

    return OnFirstUse(CASES, trained)


EXTENDED = pytest.mark.extended


@pytest.mark.parametrize(
    "name",
    [
        "moe-nano/ddp-ep",
        "moe-nano/zero2-ep",
        pytest.param("mixtral/ddp-ep", marks=EXTENDED),
        pytest.param("mixtral/zero2-ep", marks=EXTENDED),
        pytest.param("capacity/ddp-ep", marks=EXTENDED),
    ],
)
def test_loss_matches_single_at_every_step(runs, name, record_property):
    summary, rows, _, _ = runs[name]
    _, reference, _, _ = runs[f"{name.split('/')[0]}/single"]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"{name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC
    assert summary["final_loss"] == pytest.approx(reference[-1]["loss"], rel=TOLERANCE)


def test_the_mesh_is_replicate_by_ep_and_every_rank_reads_its_own_data(runs):
    summary, _, stdout, _ = runs["moe-nano/ddp-ep"]
    assert summary["mesh"]["shape"] == [2, 2] and summary["mesh"]["dims"] == ["replicate", "ep"]
    assert summary["data_parallel_size"] == NPROC
    assert (summary["micro_batch"], summary["grad_accum"]) == (1, 2)
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: replicate x ep" in header and "routing: 2 MoE layers x 4 experts, dropless" in header


def test_experts_are_sharded_over_the_expert_parallel_ranks(runs):
    single, ddp_ep = runs["moe-nano/single"][0], runs["moe-nano/ddp-ep"][0]
    # Half of each layer's experts per rank; the rest of the model whole.
    assert single["mem_params_bytes"] / 2 < ddp_ep["mem_params_bytes"] < single["mem_params_bytes"]


@pytest.mark.parametrize(
    "name", ["moe-nano/single", "moe-nano/ddp-ep", pytest.param("mixtral/zero2-ep", marks=EXTENDED)]
)
def test_the_router_figures_are_in_the_summary(runs, name):
    router = runs[name][0]["router"]
    counts = router["router_tokens_per_expert"]
    # Every token of every step goes to 2 of 4 experts in each of the 2 layers.
    assert [sum(layer) for layer in counts] == [10 * 8 * 32 * 2] * 2, name
    assert router["router_max_imbalance"] >= 1.0 and router["router_dropped_fraction"] == 0.0


def test_expert_parallel_routes_as_single_does_and_times_its_all_to_all(runs):
    assert (
        runs["moe-nano/single"][0]["router"]["router_tokens_per_expert"]
        == (runs["moe-nano/ddp-ep"][0]["router"]["router_tokens_per_expert"])
    )
    assert runs["moe-nano/single"][0]["router"]["all_to_all_ms_per_step"] is None
    assert runs["moe-nano/ddp-ep"][0]["router"]["all_to_all_ms_per_step"] > 0
    assert runs["moe-nano/zero2-ep"][0]["router"]["all_to_all_ms_per_step"] > 0


@EXTENDED  # tests/models/test_expert_parallel.py holds a capacity layer to one process on every change
def test_a_capacity_run_drops_what_single_drops(runs):
    single, ddp_ep = runs["capacity/single"][0]["router"], runs["capacity/ddp-ep"][0]["router"]
    assert single["capacity_factor"] == ddp_ep["capacity_factor"] == 1.0
    assert 0 < single["router_dropped_fraction"] == ddp_ep["router_dropped_fraction"]
    assert "capacity factor 1.0 per sequence: tokens over it dropped" in runs["capacity/ddp-ep"][2]


@pytest.mark.parametrize("name", ["moe-nano/ddp-ep", pytest.param("moe-nano/zero2-ep", marks=EXTENDED)])
def test_a_killed_rank_resumes_bit_for_bit(runs, tmp_path, name):
    model, strategy, extra = CASES[name]
    reference = losses_by_step(runs[name][3])
    out = tmp_path / "killed"
    killed = run_cli(_args(model, strategy, out, extra), env=env_for_tests(**{FAULT_ENV: "kill@3:5"}), timeout=400)
    assert killed.returncode != 0
    resumed = succeeded(run_cli(_args(model, strategy, out, [*extra, "resume=auto"]), timeout=400))
    assert "resumed at step 5" in resumed
    assert losses_by_step(out) == reference


@EXTENDED
def test_zero2_ep_takes_the_weights_of_another_strategys_checkpoint(runs, tmp_path):
    """Resumed from single's step-5 weights, its step 6 (whose loss the forward computes before the
    optimizer's first step) is single's step 6; the optimizer then starts afresh, so later steps differ."""
    model, _, extra = CASES["moe-nano/zero2-ep"]
    checkpoint = runs["moe-nano/single"][3] / "checkpoints" / "step_5"
    resumed = succeeded(run_cli(_args(model, "zero2-ep", tmp_path, [*EP, f"resume={checkpoint}"]), timeout=400))
    assert "weights only" in resumed
    assert losses_by_step(tmp_path)[6] == pytest.approx(losses_by_step(runs["moe-nano/single"][3])[6], rel=TOLERANCE)


@pytest.mark.parametrize(
    "strategy, extra, says",
    [
        ("ddp-ep", ["strategy_options.ep_size=3"], "strategy_options.ep_size=3 does not divide the world size 4"),
        (
            "ddp-ep",
            ["strategy_options.ep_size=4", "model_kwargs.n_experts=6"],
            "ep_size=4 does not divide the model's 6",
        ),
        pytest.param(
            "zero2-ep",
            ["strategy_options.ep_size=3"],
            "strategy_options.ep_size=3 does not divide the world size 4",
            marks=EXTENDED,
        ),
    ],
)
def test_a_bad_ep_size_is_one_line_before_any_worker_starts(tmp_path, strategy, extra, says):
    proc = run_cli(_args("moe-nano", strategy, tmp_path, extra), timeout=120)
    assert proc.returncode != 0
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "metrics.jsonl").exists()
