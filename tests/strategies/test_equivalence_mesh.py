"""The many-node layouts on a 2 x 2 mesh (CPU, gloo, world size 4), gpt-nano in fp32: each loss
curve against `single` on the same global batches (accelerate-hsdp's: a ParallelismConfig file
in test_config_files.py runs it), the mesh in the header and summary.json,
what each rank holds, an Hugging Face Llama under fsdp-tp and accelerate-fsdp-tp with its own
plan (Accelerate's FSDP2 cannot shard the GPT's fused q;k;v a second time), and a rank killed
mid-run resuming to the uninterrupted curve bit for bit under hsdp and fsdp-tp, and fsdp
resuming fsdp-tp's checkpoint natively.

One run per layout, shared by every check (module scope); the hsdp and fsdp-tp runs checkpoint
at step 5 and are the uninterrupted curves the resumes are held to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.testing_hooks import FAULT_ENV
from strategies.registry import default_registry
from tests.helpers import NANO, OnFirstUse, env_for_tests, losses_by_step, max_rel_diff, read_run, run_cli, succeeded

pytestmark = pytest.mark.timeout(900)

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 4
CHECKPOINTED = ["checkpoint_every=5"]
LLAMA = [
    "model=hf:LlamaConfig",
    "model_kwargs.hidden_size=64",
    "model_kwargs.num_hidden_layers=2",
    "model_kwargs.num_attention_heads=4",
    "model_kwargs.num_key_value_heads=2",
    "model_kwargs.intermediate_size=128",
    "model_kwargs.vocab_size=128",
    "model_kwargs.max_position_embeddings=64",
]
RUNS = {
    "hsdp": ("hsdp", ["strategy_options.shard_size=2", *CHECKPOINTED]),
    # Sequence parallel (the GPT's plan) and two micro-steps of accumulation per step.
    "fsdp-tp": ("fsdp-tp", ["strategy_options.tp_size=2", "micro_batch=2", *CHECKPOINTED]),
    "zero3-hpz": ("zero3-hpz", ["strategy_options.zero_hpz_partition_size=2"]),
    # Hugging Face's plan (the model's own): no sequence parallel, the head's output gathered.
    "llama-fsdp-tp": ("fsdp-tp", ["strategy_options.tp_size=2", *LLAMA]),
    # The same plan applied on Accelerate's "tp" mesh, its FSDP2 over "shard" (ParallelismConfig).
    "llama-accelerate-fsdp-tp": ("accelerate-fsdp-tp", ["strategy_options.tp_size=2", *LLAMA]),
}


def _launch(strategy: str, out_dir: Path, extra: list[str], nproc: int = NPROC, fault: str | None = None):
    env = env_for_tests(**({FAULT_ENV: fault} if fault else {}))
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, *extra]
    return run_cli(args, env=env, timeout=300)


def _unavailable(name: str) -> str | None:
    return None if name == "llama-single" else default_registry().get(RUNS[name][0]).unavailable_reason


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> OnFirstUse[str, tuple[dict, list[dict], str, Path]]:
    """name -> (summary, rows, stdout, out_dir), each trained when a test first reads it (a test of a
    strategy unavailable here skips)."""

    def trained(name: str) -> tuple[dict, list[dict], str, Path]:
        if reason := _unavailable(name):
            pytest.skip(f"{RUNS[name][0]} is unavailable here: {reason}")
        out_dir = tmp_path_factory.mktemp(name)
        if name == "llama-single":
            stdout = succeeded(_launch("single", out_dir, LLAMA, nproc=1))
        else:
            strategy, extra = RUNS[name]
            stdout = succeeded(_launch(strategy, out_dir, extra))
        return (*read_run(out_dir), stdout, out_dir)

    return OnFirstUse(["llama-single", *RUNS], trained)


# hsdp and fsdp-tp on every change; zero3-hpz (ZeRO-3, whose own run is every change's, with a
# secondary partition) and the Llama under each plan of its own, under --all.
EXTENDED = pytest.mark.extended
EXTENDED_RUNS = ("zero3-hpz", "llama-fsdp-tp", "llama-accelerate-fsdp-tp")


@pytest.mark.parametrize("name", ["hsdp", "fsdp-tp", *(pytest.param(name, marks=EXTENDED) for name in EXTENDED_RUNS)])
def test_loss_matches_single_at_every_step(runs, reference_run, name, record_property):
    summary, rows, _, _ = runs[name]
    reference = runs["llama-single"][1] if name.startswith("llama") else reference_run[1]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"{name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC


@pytest.mark.parametrize(
    "name, shape, dims, data_parallel",
    [
        ("hsdp", [2, 2], ["replicate", "shard"], 4),
        ("fsdp-tp", [2, 2], ["shard", "tp"], 2),
        pytest.param("zero3-hpz", [2, 2], ["groups", "hpz"], 4, marks=EXTENDED),
        pytest.param("llama-accelerate-fsdp-tp", [2, 2], ["shard", "tp"], 2, marks=EXTENDED),
    ],
)
def test_the_header_and_summary_give_the_mesh(runs, name, shape, dims, data_parallel):
    summary, _, stdout, _ = runs[name]
    assert summary["mesh"]["shape"] == shape and summary["mesh"]["dims"] == dims
    assert summary["data_parallel_size"] == data_parallel
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert f"mesh {' x '.join(map(str, shape))}: {' x '.join(dims)}" in header
    assert f"global batch 8 = {data_parallel} data-parallel ranks x" in header


def test_tensor_parallel_splits_the_batch_over_the_data_parallel_ranks_only(runs):
    summary, _, _, _ = runs["fsdp-tp"]
    # 8 sequences over 2 data-parallel ranks: 4 each, as 2 micro-steps of 2.
    assert (summary["micro_batch"], summary["grad_accum"]) == (2, 2)
    assert "sequence parallel" in summary["blocks"]["units"]


@EXTENDED
def test_the_llamas_own_plan_has_no_sequence_parallel(runs):
    assert "no sequence parallel" in runs["llama-fsdp-tp"][0]["blocks"]["units"]


def test_what_each_rank_holds(runs, reference_run):
    single = reference_run[0]
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        # hsdp shards over 2 and replicates over 2: half of everything.
        assert runs["hsdp"][0][key] == pytest.approx(single[key] / 2, rel=0.05), key
        # fsdp-tp: the blocks split 4 ways (2 tensor-parallel x 2 FSDP), the tied embeddings 2 ways.
        assert single[key] / 4 < runs["fsdp-tp"][0][key] < single[key] / 2, key


@EXTENDED
def test_what_each_rank_holds_under_hpz(runs, reference_run):
    # ZeRO-3's quarter of the parameters plus hpZ's secondary half.
    held = runs["zero3-hpz"][0]["mem_params_bytes"]
    assert held == pytest.approx(reference_run[0]["mem_params_bytes"] * 3 / 4, rel=0.05)


@EXTENDED
def test_what_each_rank_of_the_llama_holds(runs):
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        # The Llama under its own plan: under FSDP's half; Accelerate, on its own mesh, splits it as
        # fsdp-tp does, byte for byte.
        llama = runs["llama-single"][0][key]
        assert llama / 4 < runs["llama-fsdp-tp"][0][key] < llama / 2, key
        if not _unavailable("llama-accelerate-fsdp-tp"):
            assert runs["llama-accelerate-fsdp-tp"][0][key] == runs["llama-fsdp-tp"][0][key], key


# fsdp-tp's 2D mesh of DTensors; hsdp's checkpoint is fsdp's DCP format, whose kill and resume
# tests/train/test_faults.py runs on every change (and fsdp loads fsdp-tp's checkpoint below): under --all.
@pytest.mark.parametrize("name", [pytest.param("fsdp-tp", marks=EXTENDED)])
def test_a_killed_rank_resumes_to_the_uninterrupted_curve_bit_for_bit(runs, name, tmp_path):
    strategy, extra = RUNS[name]
    out = tmp_path / "killed"
    killed = _launch(strategy, out, extra, fault="kill@3:5")
    assert killed.returncode != 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_5"]
    resumed = succeeded(_launch(strategy, out, [*extra, "resume=auto"]))
    assert "resumed at step 5" in resumed and "model and optimizer state" in resumed
    assert losses_by_step(out) == losses_by_step(runs[name][3])


def test_fsdp_resumes_an_fsdp_tp_checkpoint_with_its_optimizer_state(runs, tmp_path):
    """One DCP layout for fsdp, hsdp and fsdp-tp (strategies/dcp_layout.py): fsdp on two ranks
    carries on fsdp-tp's curve from its step-5 checkpoint, model and optimizer state."""
    source = runs["fsdp-tp"][3]
    out = tmp_path / "fsdp"
    resumed = succeeded(_launch("fsdp", out, [f"resume={source / 'checkpoints' / 'step_5'}"], nproc=2))
    assert "resumed at step 5" in resumed and "model and optimizer state" in resumed
    carried, original = losses_by_step(out), losses_by_step(source)
    assert sorted(carried) == list(range(6, 11))
    assert max(abs(carried[s] - original[s]) / original[s] for s in carried) < TOLERANCE
