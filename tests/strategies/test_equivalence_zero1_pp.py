"""zero1-pp on a 2 x 2 mesh (CPU, gloo, world size 4: DeepSpeed's pipeline engine over two stages,
ZeRO-1 over the two ranks of each), in fp32: gpt-nano's loss curve against `single` on the same
global batches (DeepSpeed's own GPT layout), and a Hugging Face Llama's (tests.helpers.LLAMA_4, a
layer per stage of the cut); the mesh in the header and summary.json, what each rank holds, the run
carrying on from its step-5 checkpoint to the uninterrupted curve bit for bit, the fp32 master
weights read back from the checkpoint offline, and the refusals in one line.

One run per model shared by every check (module scope): two micro-steps of the loop's accumulation
a step, each a run of DeepSpeed's 1F1B schedule over two pipeline micro-batches; the GPT's run
checkpoints at step 5.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from models.zoo import build_model
from strategies.base import ModelUnsupported, StrategyError
from strategies.registry import default_registry
from strategies.zero1_pp import CHECKPOINT_TAG, ZeroPipelineStrategy
from tests.helpers import LLAMA_4, NANO, env_for_tests, losses_by_step, max_rel_diff, read_run, run_cli, succeeded
from tests.strategies.constructed import constructed

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        ZeroPipelineStrategy.unavailable_reason() is not None, reason=str(ZeroPipelineStrategy.unavailable_reason())
    ),
]

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 4
PIPELINE = ["strategy_options.pp_size=2", "micro_batch=2"]


def _launch(out_dir: Path, extra: list[str]) -> str:
    args = ["train", "strategy=zero1-pp", f"nproc={NPROC}", f"out_dir={out_dir}", *NANO, *PIPELINE, *extra]
    return succeeded(run_cli(args, env=env_for_tests(), timeout=300))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(summary, rows, stdout, out_dir)."""
    out_dir = tmp_path_factory.mktemp("zero1-pp")
    stdout = _launch(out_dir, ["checkpoint_every=5"])
    return (*read_run(out_dir), stdout, out_dir)


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """The Llama's (summary, rows, stdout, out_dir)."""
    out_dir = tmp_path_factory.mktemp("llama-zero1-pp")
    stdout = _launch(out_dir, LLAMA_4)
    return (*read_run(out_dir), stdout, out_dir)


@pytest.mark.extended  # another model through the same engine: the GPT's run below is every change's
def test_a_hugging_face_model_matches_single_at_every_step(llama_run, llama_reference_run, record_property):
    summary, rows, stdout, _ = llama_run
    deviation = max_rel_diff(rows, llama_reference_run[1])
    record_property("max_rel_loss_diff", deviation)
    print(f"zero1-pp llama: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert "this rank: stage 0, blocks 0-1)" in summary["blocks"]["units"]


def test_loss_matches_single_at_every_step(run, reference_run, record_property):
    summary, rows, _, _ = run
    deviation = max_rel_diff(rows, reference_run[1])
    record_property("max_rel_loss_diff", deviation)
    print(f"zero1-pp: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC


def test_the_header_and_summary_give_the_mesh_and_the_stages(run):
    summary, _, stdout, _ = run
    assert summary["mesh"]["shape"] == [2, 2] and summary["mesh"]["dims"] == ["pp", "data"]
    # 8 sequences over the 2 data-parallel ranks, 2 micro-steps of 2; each a run of the schedule.
    assert summary["data_parallel_size"] == 2 and (summary["micro_batch"], summary["grad_accum"]) == (2, 2)
    assert (
        "pipeline engine over 2 ranks (1F1B over 2 micro-batches a step; this rank: stage 0, blocks 0)"
        in (summary["blocks"]["units"])
    )
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: pp x data" in header and "global batch 8 = 2 data-parallel ranks x 2 x 2 accum" in header


def test_each_rank_holds_its_stage_and_half_its_optimizer_state(run, reference_run):
    """Rank 0's stage (the embeddings and one block) less than the whole model; ZeRO-1 over the
    stage's two ranks: its fp32 master and moments, 12 bytes a parameter, halved."""
    single, pipelined = reference_run[0], run[0]
    assert pipelined["mem_params_bytes"] < single["mem_params_bytes"]
    assert pipelined["mem_optimizer_bytes"] == pytest.approx(3 * pipelined["mem_params_bytes"] / 2, rel=0.01)


def test_it_carries_on_from_its_checkpoint_bit_for_bit(run, tmp_path):
    """Each rank reads back its stage's layers and its optimizer partition: the continued curve is
    the uninterrupted one."""
    source = run[3]
    out = tmp_path / "resumed"
    resumed = _launch(out, [f"resume={source / 'checkpoints' / 'step_5'}"])
    assert "resumed at step 5" in resumed and "model and optimizer state" in resumed
    carried, original = losses_by_step(out), losses_by_step(source)
    assert sorted(carried) == [6, 7, 8, 9, 10]
    assert carried == {step: original[step] for step in carried}


def test_its_checkpoint_gives_the_fp32_master_weights_offline(run):
    """The weights each stage's optimizer partitions hold, put together under the GPT's names: in
    fp32 they are the module's own weights, which DeepSpeed also writes, a file per layer (layer 0
    the embedding, 1 the positions, 2 and 3 the blocks, 4 the final norm; the head is layer 0's)."""
    state = run[3] / "checkpoints" / "step_5" / "state"
    model = build_model("gpt-nano")
    weights = ZeroPipelineStrategy.read_full_state_dict(state, model)
    assert set(weights) == set(model.state_dict())
    compared = set()
    for index in range(5):
        layer = torch.load(state / CHECKPOINT_TAG / f"layer_{index:02d}-model_states.pt", weights_only=True)
        for key, tensor in layer.items():
            name = key.replace("block.", f"blocks.{index - 2}.")
            assert torch.equal(weights[name], tensor), name
            compared.add(name)
    assert compared | {"lm_head.weight"} == set(weights)
    assert torch.equal(weights["lm_head.weight"], weights["wte.weight"])


@pytest.mark.parametrize(
    "options, says",
    [
        ({"pp_size": 4}, "4 pipeline stages need at least 4 blocks, and this GPT has 2"),
        ({"pp_size": 2, "microbatches": 3}, "microbatches=3 does not divide the micro-batch of 4"),
        ({"pp_size": 2, "microbatches": 0}, "microbatches=0 must be a whole number >= 1"),
        ({"pp_size": 2, "schedule": "gpipe"}, "strategy 'zero1-pp' means schedule=1f1b"),
    ],
)
def test_a_pipeline_that_cannot_run_says_why_in_one_line(options, says):
    with pytest.raises(StrategyError) as err:
        constructed("zero1-pp", 4, **options).check_model(build_model("gpt-nano"))
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "key, value, fix, following",
    [
        ("train_micro_batch_size_per_gpu", 2, "set micro_batch=4 on the command line instead", {"micro_batch": 4}),
        ("gradient_accumulation_steps", 4, "set grad_accum=2 on the command line instead", {"grad_accum": 2}),
    ],
)
def test_a_deepspeed_json_batch_key_it_refuses_says_a_fix_that_runs(tmp_path, key, value, fix, following):
    """zero1-pp's DeepSpeed micro-batch is a pipeline micro-batch (micro_batch / microbatches) and its
    accumulation grad_accum x microbatches: a JSON's value is refused with the setting that makes it,
    which the generic "set micro_batch=" to the JSON's value did not (cut again, refused again)."""
    from configs.schema import RunConfig

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({key: value, "zero_optimization": {"stage": 1}}))
    config = RunConfig(deepspeed_config=str(path))
    with pytest.raises(StrategyError) as err:
        constructed("zero1-pp", 2, micro_batch=8, config=config, pp_size=2)
    assert fix in str(err.value) and "microbatches=2" in str(err.value)
    micro_batch = following.get("micro_batch", 8 // following.get("grad_accum", 1))
    ctx = constructed("zero1-pp", 2, micro_batch=micro_batch, pp_size=2).ctx
    ctx = replace(ctx, config=config, grad_accum=following.get("grad_accum", 1))
    default_registry().create("zero1-pp", ctx, pp_size=2)  # what the fix said runs


def test_a_model_it_cannot_cut_says_so():
    with pytest.raises(ModelUnsupported) as err:
        constructed("zero1-pp", 4, pp_size=2).check_model(build_model("tests.user_models:build_gru"))
    assert str(err.value).startswith("zero1-pp: pipeline parallel cuts a model between its blocks, and GRULM")


def test_by_default_a_stage_per_node_and_two_on_one():
    """As fsdp-pp's: compare's nproc=2 on one node gets two stages, and says so; pp 1 says what it is."""
    registry = default_registry()
    assert registry.mesh_layout("zero1-pp", 4, 2).shape == (2, 2)
    mesh = registry.mesh_layout("zero1-pp", 2, 2)
    assert mesh.shape == (2, 1) and any(note.startswith("pp 2: a pipeline on one node") for note in mesh.notes)
    mesh = registry.mesh_layout("zero1-pp", 2, 2, pp_size=1)
    assert mesh.shape == (1, 2) and any(note.startswith("pp 1: no pipeline") for note in mesh.notes)
