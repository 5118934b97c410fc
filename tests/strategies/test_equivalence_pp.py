"""fsdp-pp on a 2 x 2 mesh (CPU, gloo, world size 4: two pipeline ranks, FSDP over two inside each
stage), in fp32: each schedule's loss curve on a four-block gpt-nano against `single` on the same
global batches (the interleaved one also beside tensor parallel: pp 2 x tp 2; zero-bubble also under
fsdp and fsdp-tp, whose FSDP2 units reshard after forward), and so the 1F1B
curves of a Hugging Face Llama (tests.helpers.LLAMA_4) and of a user's model whose head is tied to
its embedding across the stages (build_decoder); the mesh in the header and summary.json, what each
rank holds, a rank killed mid-run and the job resumed from its step-2 checkpoint to the
uninterrupted curve bit for bit, and the refusals a pipeline meets, in one line.

One run per schedule and model, shared by every check (module scope); gpipe and the interleaved
schedules run two micro-steps of the loop's accumulation, each a run of the schedule over two
pipeline micro-batches; the interleaved-1f1b run checkpoints at step 2 and is the curve the resume
is held to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.testing_hooks import FAULT_ENV
from models.zoo import build_model
from strategies.base import ModelUnsupported, StrategyError
from strategies.mesh_layout import MeshError
from strategies.parallel_dims import ModelFacts
from strategies.registry import default_registry
from tests.helpers import (
    LLAMA_4,
    NANO,
    OnFirstUse,
    env_for_tests,
    losses_by_step,
    max_rel_diff,
    read_run,
    run_cli,
    succeeded,
)
from tests.strategies.constructed import constructed

pytestmark = pytest.mark.timeout(900)

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 4
# Four blocks: two virtual stages on each of the two pipeline ranks.
DEEP_NANO = [
    "device=cpu",
    "model=gpt-nano",
    "model_kwargs.n_layer=4",
    "steps=4",
    "batch_size=8",
    "seq_len=32",
    "data_samples=256",
    "log_every=2",
]
PIPELINE = ["strategy_options.pp_size=2"]
INTERLEAVED = [*PIPELINE, "strategy_options.schedule=interleaved-1f1b", "micro_batch=2"]
ZERO_BUBBLE = [*PIPELINE, "strategy_options.schedule=zero-bubble", "micro_batch=2"]
RUNS = {
    "gpipe": [*PIPELINE, "strategy_options.schedule=gpipe", "micro_batch=2"],
    "1f1b": [*PIPELINE, "strategy_options.schedule=1f1b"],
    "interleaved-1f1b": [*INTERLEAVED, "checkpoint_every=2"],
    "zero-bubble": ZERO_BUBBLE,
    # pp 2 x tp 2: each rank's two stages share the GPT's dropout, which sequence parallel splits once.
    "interleaved-1f1b-tp": [*INTERLEAVED, "strategy_options.tp_size=2"],
    "zero-bubble-fsdp": ZERO_BUBBLE,
    "zero-bubble-fsdp-tp": [*ZERO_BUBBLE, "strategy_options.tp_size=2"],
}
# The runs under another strategy than fsdp-pp: FSDP2 units resharded after forward, whose shards, not
# the gathered weights, a stage has registered between zero-bubble's two halves of a backward.
STRATEGIES = {"zero-bubble-fsdp": "fsdp", "zero-bubble-fsdp-tp": "fsdp-tp"}
# Three DecoderLayers: blocks 0-1 and the embedding on the first stage, block 2 and the head tied to
# the embedding on the last.
DECODER = [*NANO, "model=tests.user_models:build_decoder", "steps=4", "log_every=2"]
# Other models, 1f1b: (fsdp-pp's arguments, single's).
MODELS = {"llama": ([*NANO, *LLAMA_4, *PIPELINE], None), "decoder": ([*DECODER, *PIPELINE], DECODER)}


def _launch(
    strategy: str,
    out_dir: Path,
    extra: list[str],
    nproc: int = NPROC,
    fault: str | None = None,
    base: list[str] = DEEP_NANO,
):
    env = env_for_tests(**({FAULT_ENV: fault} if fault else {}))
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *base, *extra]
    return run_cli(args, env=env, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> OnFirstUse[str, tuple[dict, list[dict], str, Path]]:
    """name -> (summary, rows, stdout, out_dir), each trained when a test first reads it; "single" is
    the reference."""

    def trained(name: str) -> tuple[dict, list[dict], str, Path]:
        out_dir = tmp_path_factory.mktemp(name)
        if name == "single":
            stdout = succeeded(_launch("single", out_dir, [], nproc=1))
        else:
            stdout = succeeded(_launch(STRATEGIES.get(name, "fsdp-pp"), out_dir, RUNS[name]))
        return (*read_run(out_dir), stdout, out_dir)

    return OnFirstUse(["single", *RUNS], trained)


@pytest.fixture(scope="module")
def model_runs(tmp_path_factory, llama_reference_run):
    """name -> (rows, its reference's rows) for the models of MODELS."""
    out = {}
    for name, (args, single_args) in MODELS.items():
        out_dir = tmp_path_factory.mktemp(name)
        succeeded(_launch("fsdp-pp", out_dir, args, base=[]))
        reference = llama_reference_run[1]
        if single_args is not None:
            single_dir = tmp_path_factory.mktemp(f"{name}-single")
            succeeded(_launch("single", single_dir, single_args, nproc=1, base=[]))
            reference = read_run(single_dir)[1]
        out[name] = (read_run(out_dir)[1], reference)
    return out


# On every change 1F1B and the interleaved schedule (whose run the kill below resumes), alone and
# beside tensor parallel, and zero-bubble under fsdp; GPipe's and the other zero-bubble curves, and
# the other models', under --all.
EVERY_CHANGE = ("1f1b", "interleaved-1f1b", "interleaved-1f1b-tp", "zero-bubble-fsdp")
SCHEDULES = [name if name in EVERY_CHANGE else pytest.param(name, marks=pytest.mark.extended) for name in RUNS]


@pytest.mark.parametrize("name", SCHEDULES)
def test_each_schedule_matches_single_at_every_step(runs, name, record_property):
    summary, rows, _, _ = runs[name]
    deviation = max_rel_diff(rows, runs["single"][1])
    record_property("max_rel_loss_diff", deviation)
    print(f"{STRATEGIES.get(name, 'fsdp-pp')} {name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC
    if name in STRATEGIES:  # the runs' own layouts, resharded after forward
        assert summary["strategy"] == STRATEGIES[name]
    # pp 2 x tp 2: sequence parallel cut each sequence once, not once per stage
    if name in ("interleaved-1f1b-tp", "zero-bubble-fsdp-tp"):
        assert summary["mesh"]["dims"] == ["pp", "shard", "tp"] and summary["mesh"]["shape"] == [2, 1, 2]


@pytest.mark.extended
@pytest.mark.parametrize("name", list(MODELS))
def test_a_hugging_face_and_a_users_model_match_single_at_every_step(model_runs, name, record_property):
    rows, reference = model_runs[name]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"fsdp-pp {name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE


@pytest.mark.parametrize(
    "name, stages, accum",
    [("1f1b", 2, 1), pytest.param("gpipe", 2, 2, marks=pytest.mark.extended), ("interleaved-1f1b", 4, 2)],
)
def test_the_header_and_summary_give_the_mesh_and_the_stages(runs, name, stages, accum):
    summary, _, stdout, _ = runs[name]
    assert summary["mesh"]["shape"] == [2, 2] and summary["mesh"]["dims"] == ["pp", "shard"]
    assert summary["data_parallel_size"] == 2
    # 8 sequences over the 2 data-parallel ranks; each micro-step one run of the schedule.
    assert (summary["micro_batch"], summary["grad_accum"]) == (4 // accum, accum)
    assert f"pipeline of {stages} stages over 2 ranks ({name}, 2 micro-batches a step" in summary["blocks"]["units"]
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: pp x shard" in header and "global batch 8 = 2 data-parallel ranks x" in header


def test_each_rank_holds_its_stage_sharded(runs):
    """Rank 0's stage (embeddings and two blocks) halved by FSDP: between a quarter and a half of
    the whole model; the last stage also holds its copy of the tied head."""
    single, pipelined = runs["single"][0], runs["1f1b"][0]
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert single[key] / 4 < pipelined[key] < single[key] / 2, key


def test_a_killed_rank_resumes_to_the_uninterrupted_curve_bit_for_bit(runs, tmp_path):
    """Rank 3 (the last stage: the loss and the head's copy of the tied embedding) SIGKILLs itself
    once step 3 is done, a step past the step-2 checkpoint: torchrun stops the other ranks, waiting
    on it in a collective, and `resume=auto` redoes steps 3 and 4 from that checkpoint."""
    source = runs["interleaved-1f1b"][3]
    out = tmp_path / "killed"
    killed = _launch("fsdp-pp", out, RUNS["interleaved-1f1b"], fault="kill@3:3")
    assert killed.returncode != 0
    assert "Signal 9 (SIGKILL) received" in killed.stderr, killed.stderr[-3000:]
    # Neither step 4's checkpoint nor a partial one: the kill left step 2's alone.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]
    resumed = succeeded(_launch("fsdp-pp", out, [*RUNS["interleaved-1f1b"], "resume=auto"]))
    assert "resumed at step 2" in resumed and "model and optimizer state" in resumed
    assert losses_by_step(out) == losses_by_step(source)


@pytest.mark.parametrize(
    "options, micro_batch, says",
    [
        ({"pp_size": 2, "schedule": "interleaved-1f1b"}, 4, "4 pipeline stages need at least 4 blocks"),
        ({"pp_size": 2, "schedule": "zb"}, 4, "is not one of gpipe, 1f1b, interleaved-1f1b, zero-bubble"),
        ({"pp_size": 2, "microbatches": 3}, 4, "microbatches=3 does not divide the micro-batch of 4"),
        ({"pp_size": 2, "schedule": "zero-bubble", "microbatches": 3}, 3, "in rounds of pp_size=2"),
        ({"pp_size": 2, "schedule": "1f1b", "microbatches": 1}, 4, "at least one micro-batch per stage"),
    ],
)
def test_a_pipeline_that_cannot_run_says_why_in_one_line(options, micro_batch, says):
    with pytest.raises((StrategyError, MeshError)) as err:
        constructed("fsdp-pp", 2, micro_batch, **options).check_model(build_model("gpt-nano"))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_tied_weight_tensor_parallel_splits_unlike_its_copy_is_one_line(tmp_path):
    """A tied Llama's plan splits its head (colwise_rep) and leaves the embedding whole: the whole model
    under tensor parallel refuses that tie in one line, and so does a pipeline, whose first stage holds
    the embedding and last the head's copy; the two gradients summed before each step were of two
    sizes, and gloo aborted every process (SIGABRT) instead."""
    tied = [*NANO, *LLAMA_4, "model_kwargs.tie_word_embeddings=true", "steps=2"]
    options = ["strategy_options.tp_size=2", *PIPELINE]
    proc = run_cli(["train", "strategy=ddp-tp", f"nproc={NPROC}", f"out_dir={tmp_path}", *tied, *options])
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("parabench: error:")]
    assert lines and set(lines) == {
        "parabench: error: hf.model.embed_tokens.weight and hf.lm_head.weight are one tied parameter, but the "
        "tensor-parallel plan splits them differently (whole vs (Shard(dim=0),)): give both the same split, or neither"
    }
    assert "Aborted" not in proc.stderr


def test_a_model_it_cannot_cut_says_so_in_one_line():
    with pytest.raises(ModelUnsupported) as err:
        constructed("fsdp-pp", 2, pp_size=2).check_model(build_model("tests.user_models:build_gru"))
    assert str(err.value).startswith("fsdp-pp (1f1b): pipeline parallel cuts a model between its blocks, and GRULM")
    assert "\n" not in str(err.value)


def test_by_default_a_stage_per_node_two_on_one_and_never_more_than_the_blocks():
    """A pipeline preset pipelines: compare's nproc=2 on one node gets two stages, and says so."""
    registry = default_registry()
    assert registry.mesh_layout("fsdp-pp", 4, 2).shape == (2, 2)  # two nodes
    mesh = registry.mesh_layout("fsdp-pp", 2, 2)
    assert mesh.shape == (2, 1) and any(note.startswith("pp 2: a pipeline on one node") for note in mesh.notes)
    assert registry.mesh_layout("fsdp-pp", 16, 2, ModelFacts(blocks=4)).shape == (4, 4)  # 8 nodes, 4 blocks
    assert registry.mesh_layout("fsdp-pp", 2, 2, ModelFacts(blocks=1)).shape == (1, 2)
