"""Megatron-LM's layout on a 2 x 2 mesh (CPU, gloo, world size 4), gpt-nano in fp32: ddp-tp (tensor
and sequence parallel inside each pair of ranks, data parallel across the pairs) and zero1-tp (the
same, the optimizer state sharded over the data-parallel ranks). Each loss curve against `single` on
the same global batches, the mesh in the header and summary.json, what each rank holds (and the
plan's prediction of it), ddp-tp carrying on from its step-5 checkpoint bit for bit, and zero1-tp
from its own on another mesh (every rank's share of the optimizer state, read back by ranks that
share it otherwise).

One run per strategy, shared by every check (module scope), with two micro-steps of accumulation per
step: ddp-tp all-reduces the gradients on the last one alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.schema import RunConfig
from harness.plan.for_run import prediction_for_run
from strategies.registry import default_registry
from tests.helpers import NANO, env_for_tests, losses_by_step, max_rel_diff, read_run, run_cli, succeeded

pytestmark = pytest.mark.timeout(900)

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 4
STRATEGIES = ("ddp-tp", "zero1-tp")
EXTRA = ["strategy_options.tp_size=2", "micro_batch=2", "checkpoint_every=5"]


def _launch(strategy: str, out_dir: Path, extra: list[str], nproc: int = NPROC):
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, *extra]
    return run_cli(args, env=env_for_tests(), timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (summary, rows, stdout, out_dir)."""
    out = {}
    for name in STRATEGIES:
        out_dir = tmp_path_factory.mktemp(name)
        stdout = succeeded(_launch(name, out_dir, EXTRA))
        out[name] = (*read_run(out_dir), stdout, out_dir)
    return out


@pytest.mark.parametrize("name", STRATEGIES)
def test_loss_matches_single_at_every_step(runs, reference_run, name, record_property):
    summary, rows, _, _ = runs[name]
    deviation = max_rel_diff(rows, reference_run[1])
    record_property("max_rel_loss_diff", deviation)
    print(f"{name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC


@pytest.mark.parametrize("name", STRATEGIES)
def test_the_header_and_summary_give_the_mesh(runs, name):
    summary, _, stdout, _ = runs[name]
    assert summary["mesh"]["shape"] == [2, 2] and summary["mesh"]["dims"] == ["replicate", "tp"]
    assert summary["data_parallel_size"] == 2
    # 8 sequences over 2 data-parallel ranks: 4 each, as 2 micro-steps of 2.
    assert (summary["micro_batch"], summary["grad_accum"]) == (2, 2)
    assert "sequence parallel), then replicate" in summary["blocks"]["units"]
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: replicate x tp" in header and "global batch 8 = 2 data-parallel ranks x" in header


def test_what_each_rank_holds(runs, reference_run):
    single, ddp_tp, zero1_tp = reference_run[0], runs["ddp-tp"][0], runs["zero1-tp"][0]
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        # The blocks split over the 2 tensor-parallel ranks, the (tied) embeddings whole on each.
        assert single[key] / 2 < ddp_tp[key] < single[key], key
    for key in ("mem_params_bytes", "mem_grads_bytes"):
        assert zero1_tp[key] == ddp_tp[key], key
    # ZeRO-1: each of the 2 data-parallel ranks keeps the state of about half the parameters.
    assert zero1_tp["mem_optimizer_bytes"] == pytest.approx(ddp_tp["mem_optimizer_bytes"] / 2, rel=0.1)


@pytest.mark.parametrize("name", STRATEGIES)
def test_the_plan_predicts_what_each_rank_holds_to_the_byte(runs, name):
    """The planner's model of each (harness/plan/memory/model_states.py: zero1-tp's greedy deal of whole
    tensors as ZeroRedundancyOptimizer deals them) against the run's own memory_breakdown."""
    summary = runs[name][0]
    config = RunConfig(strategy=name, model="gpt-nano", batch_size=8, seq_len=32, strategy_options={"tp_size": 2})
    predicted = prediction_for_run(config, summary)
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert predicted[key] == summary[key], key


# The DCP format's exact resume runs on every change under fsdp (tests/train/test_faults.py); this
# mesh's own, under --all.
@pytest.mark.extended
def test_ddp_tp_carries_on_from_its_checkpoint_bit_for_bit(runs, tmp_path):
    source = runs["ddp-tp"][3]
    out = tmp_path / "resumed"
    resumed = succeeded(_launch("ddp-tp", out, [*EXTRA, f"resume={source / 'checkpoints' / 'step_5'}"]))
    assert "resumed at step 5" in resumed and "model and optimizer state" in resumed
    carried, original = losses_by_step(out), losses_by_step(source)
    assert sorted(carried) == list(range(6, 11))
    assert carried == {step: original[step] for step in carried}


def test_zero1_tp_on_another_mesh_carries_on_from_its_checkpoint(runs, tmp_path):
    """Each rank of the 2 x 2 run wrote the optimizer state it owns; on 2 ranks without tensor
    parallel the parameters are split between the data-parallel ranks otherwise, and each reads
    its share of what the four wrote."""
    source = runs["zero1-tp"][3]
    out = tmp_path / "resumed"
    extra = ["strategy_options.tp_size=1", f"resume={source / 'checkpoints' / 'step_5'}"]
    resumed = succeeded(_launch("zero1-tp", out, extra, nproc=2))
    assert "resumed at step 5" in resumed and "model and optimizer state" in resumed
    carried, original = losses_by_step(out), losses_by_step(source)
    assert sorted(carried) == list(range(6, 11))
    assert max(abs(carried[s] - original[s]) / original[s] for s in carried) < TOLERANCE


@pytest.mark.parametrize(
    "name, options, note",
    [
        ("ddp-tp", {}, "one data-parallel rank: tensor parallel alone, gradients all-reduced over one rank"),
        ("ddp-tp", {"tp_size": 1}, "tp 1: no tensor parallel, the layout of ddp"),
        ("zero1-tp", {"tp_size": 1}, "tp 1: no tensor parallel, the layout of ddp with ZeroRedundancyOptimizer"),
    ],
)
def test_a_degenerate_mesh_says_what_it_amounts_to(name, options, note):
    """compare's default nproc=2 on one node gives one data-parallel rank."""
    mesh = default_registry().mesh_layout(name, 2, 2, **options)
    assert mesh.dims == ("replicate", "tp") and mesh.data_dims == ("replicate",)
    assert note in mesh.notes
