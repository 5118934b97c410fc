"""Block discovery for any model (models/blocks.py): users' models by import path, none of
them a GPT and none with transformer_blocks(), are sharded per block under fsdp,
accelerate-fsdp and zero3 and match `single`; compile and checkpointing work through the
same blocks; model_blocks= overrides; the planner traces their activations; a strategy
option of the wrong type is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from configs.schema import RunConfig, load_config
from harness.plan.memory.activations import LOSS_GRADIENT_BYTES_PER_LOGIT
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from models.activation_checkpointing import CheckpointingError, enable_checkpointing, is_checkpointed
from models.blocks import FOUND_BY_HF, FOUND_BY_METHOD, FOUND_BY_NAMES, FOUND_BY_REPEATS, BlocksError, find_blocks
from models.zoo import build_model
from strategies.accelerate.fsdp_mode import AccelerateFSDPStrategy
from strategies.base import RunContext, StrategyError
from strategies.deepspeed import DeepSpeedStrategy
from strategies.fsdp import tied_outside
from strategies.registry import default_registry
from strategies.torch_mesh import MeshStrategy
from tests.helpers import NANO, env_for_tests, max_rel_diff, read_run, run_cli
from tests.saved_tensors import saved_bytes

TOLERANCE = 1e-4  # fp32, relative, every step
RECURRENT, DECODER, NESTED = (f"tests.user_models:build_{name}" for name in ("recurrent", "decoder", "nested"))
BIGRAM, UNTRACEABLE = "tests.user_models:build_bigram", "tests.user_models:build_untraceable"
# model -> (blocks expected, their class)
EXPECTED = {RECURRENT: (2, "ResidualGRU"), DECODER: (3, "DecoderLayer"), NESTED: (3, "ResidualMLP")}
# Each strategy also recomputes (and fsdp also compiles) one model's blocks, so that every
# backend is seen composing with the checkpoint wrapper without a run per combination.
EXTRA = {
    (RECURRENT, "zero3"): ["activation_checkpointing=true"],
    (DECODER, "accelerate-fsdp"): ["activation_checkpointing=true"],
    (NESTED, "fsdp"): ["activation_checkpointing=true", "compile=true"],
}
RUN_TIMEOUT = 300


def _ctx(config: RunConfig | None = None, world_size: int = 1) -> RunContext:
    return RunContext(
        rank=0,
        world_size=world_size,
        local_rank=0,
        device=torch.device("cpu"),
        precision="fp32",
        micro_batch=1,
        grad_accum=1,
        grad_clip=1.0,
        config=config,
    )


def _train(
    out_dir: Path, model: str, strategy: str, nproc: int, extra: list[str] = (), **env: str
) -> tuple[dict, list]:
    proc = run_cli(
        ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, f"model={model}", *extra],
        timeout=RUN_TIMEOUT,
        env=env_for_tests(**env),
    )
    assert proc.returncode == 0, (
        f"{strategy} {model} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return read_run(out_dir)


# ---- discovery -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", list(EXPECTED))
def test_repeated_layers_are_found_in_each_user_model(spec):
    model = build_model(spec)
    assert not hasattr(model, "transformer_blocks")
    blocks = find_blocks(model)
    count, cls = EXPECTED[spec]
    assert (blocks.found_by, blocks.count, blocks.classes) == (FOUND_BY_REPEATS, count, [cls])
    assert blocks.warning is None


def test_largest_group_wins_and_nested_sequentials_are_searched():
    """NestedLM's blocks sit in a Sequential inside a Sequential, and each holds a Sequential of
    two Linears: three small groups of Linear lose to the group of blocks, which holds more."""
    model = build_model(NESTED)
    assert find_blocks(model).modules == tuple(model.net[1])


def test_the_models_own_blocks_and_hugging_faces_names_come_first():
    gpt = build_model("gpt-nano")
    assert find_blocks(gpt).found_by == FOUND_BY_METHOD and find_blocks(gpt).modules == tuple(gpt.blocks)
    with torch.device("meta"):
        llama = build_model(
            "hf:LlamaConfig",
            dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, vocab_size=128),
        )
    bare = nn.ModuleDict({"causal_lm": llama.hf})  # a user's wrapper: _no_split_modules sits one level down
    blocks = find_blocks(bare)
    assert (blocks.found_by, blocks.count, blocks.classes) == (FOUND_BY_HF, 2, ["LlamaDecoderLayer"])


def test_model_blocks_overrides_and_blocks_never_nest():
    model = build_model(NESTED)
    blocks = find_blocks(model, ["ResidualMLP", "Linear"])
    # The Linears inside the blocks are dropped; the head, outside them, is a block of its own.
    assert blocks.found_by == FOUND_BY_NAMES
    assert blocks.modules == (*model.net[1], model.net[3])
    assert blocks.describe() == "3 ResidualMLP + 1 Linear"


def test_a_name_that_matches_nothing_lists_the_models_classes():
    with pytest.raises(BlocksError) as err:
        find_blocks(build_model(DECODER), ["DecoderBlock"])
    message = str(err.value)
    assert "\n" not in message and "model_blocks=DecoderBlock matches no module" in message
    assert "DecoderLayer" in message and "LayerNorm" in message


def test_no_repeated_layers_warns_what_it_costs_and_how_to_name_blocks():
    blocks = find_blocks(build_model(BIGRAM))
    assert blocks.count == 0
    assert "every parameter is gathered at once for the forward" in blocks.warning
    assert "model_blocks=<ClassName>" in blocks.warning and "Embedding, LayerNorm, Linear" in blocks.warning


def test_model_blocks_takes_one_name_or_a_list():
    assert load_config(["model_blocks=DecoderLayer"]).model_blocks == ["DecoderLayer"]
    assert load_config(["model_blocks=[DecoderLayer,LayerNorm]"]).model_blocks == ["DecoderLayer", "LayerNorm"]
    assert load_config(["model_blocks=DecoderLayer,LayerNorm"]).model_blocks == ["DecoderLayer", "LayerNorm"]
    assert load_config([]).model_blocks is None


# ---- compile and checkpointing work through the same blocks ------------------------------------

PER_BLOCK_STRATEGIES = {
    "fsdp": lambda ctx: MeshStrategy(ctx),
    "zero3": lambda ctx: DeepSpeedStrategy(ctx, stage=3),
    "accelerate-fsdp": lambda ctx: AccelerateFSDPStrategy(ctx),
}


@pytest.mark.parametrize("strategy", list(PER_BLOCK_STRATEGIES))
@pytest.mark.parametrize("spec, names", [(RECURRENT, None), (DECODER, None), (NESTED, None), (NESTED, ["Linear"])])
def test_compile_and_checkpointing_apply_to_the_discovered_blocks(strategy, spec, names):
    model = build_model(spec)
    config = RunConfig(model=spec, model_blocks=names)
    blocks = find_blocks(model, names)
    compiled = PER_BLOCK_STRATEGIES[strategy](_ctx(config)).compile(model)
    assert compiled == f"per block ({blocks.describe()})"
    enable_checkpointing(model, blocks)
    block_ids = {id(b) for b in blocks.modules}
    assert {id(m) for m in model.modules() if m._compiled_call_impl is not None} == block_ids
    assert {id(m) for m in model.modules() if is_checkpointed(m)} == block_ids


@pytest.mark.parametrize("spec", list(EXPECTED))
def test_checkpointed_blocks_keep_their_names_and_gradients_and_save_less(spec):
    torch.manual_seed(0)
    model = build_model(spec)
    tokens = torch.randint(0, model.vocab_size, (2, 16))
    saved_plain = _saved_bytes(model, tokens)
    model(tokens, tokens).backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    names = list(model.state_dict())
    model.zero_grad()
    assert enable_checkpointing(model, find_blocks(model)) == f"{EXPECTED[spec][0]} {EXPECTED[spec][1]}"
    assert _saved_bytes(model, tokens) < saved_plain / 2  # the blocks keep only their inputs
    model(tokens, tokens).backward()
    assert list(model.state_dict()) == names
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name])


@pytest.mark.parametrize(
    "spec, names, reason",
    [
        (DECODER, None, None),
        ("mlp", None, "Accelerate wraps by class, and head is a Linear outside the blocks"),
        (DECODER, ["Linear"], "block unembed is tied to a parameter outside it"),
    ],
)
def test_accelerate_fsdp_wraps_by_class_only_where_that_means_exactly_the_blocks(spec, names, reason, monkeypatch):
    """Accelerate's transformer_based_wrap takes class names: the mlp's blocks are Linears and
    so is its tied head; naming Linear in the decoder makes the tied head a block."""
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)  # the plugin writes it: restored after
    model = build_model(spec)
    strategy = AccelerateFSDPStrategy(_ctx(RunConfig(model=spec, model_blocks=names)))
    plugin = strategy._plugins(model)["fsdp_plugin"]
    assert strategy._unwrapped_because == reason
    assert plugin.transformer_cls_names_to_wrap == (None if reason else find_blocks(model, names).classes)
    assert tied_outside(model, find_blocks(model, names)) == ({id(model.unembed): "unembed"} if names else {})


def test_checkpointing_a_model_without_blocks_or_switch_is_one_line():
    with pytest.raises(CheckpointingError) as err:
        enable_checkpointing(build_model(BIGRAM), find_blocks(build_model(BIGRAM)))
    assert "model_blocks=<ClassName>" in str(err.value) and "\n" not in str(err.value)


# ---- every per-block backend at world size 2, against single ------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """trained(model, strategy) -> (summary, rows, out_dir), each trained once per module, on first use."""
    runs: dict[tuple[str, str], tuple[dict, list, Path]] = {}

    def get(model: str, strategy: str) -> tuple[dict, list, Path]:
        if (model, strategy) not in runs:
            out_dir = tmp_path_factory.mktemp(f"{model.split('_')[-1]}-{strategy}")
            env = {"PARAM_PEAK_FILE": str(out_dir / "param_peak")} if (model, strategy) == (DECODER, "fsdp") else {}
            nproc = 1 if strategy == "single" else 2
            summary, rows = _train(out_dir, model, strategy, nproc, EXTRA.get((model, strategy), []), **env)
            runs[model, strategy] = (summary, rows, out_dir)
        return runs[model, strategy]

    return get


UNITS = {
    # Accelerate also shards a norm that is a direct child of the model (its "final norm" unit).
    (DECODER, "accelerate-fsdp"): "fsdp: 3 units of DecoderLayer + 1 LayerNorm + root",
}


# Every model and every per-block backend at least once: the blocks are found by one function for
# all of them, and each backend's wrapping of them is what differs.
SHARDED_RUNS = [  # each model once, each backend's per-block wrapping once
    (NESTED, "fsdp"),
    # The other two shapes under the other two backends, two runs each: under --all.
    pytest.param(DECODER, "accelerate-fsdp", marks=pytest.mark.extended),
    pytest.param(RECURRENT, "zero3", marks=pytest.mark.extended),
]


@pytest.mark.slow
@pytest.mark.parametrize("model, strategy", SHARDED_RUNS)
def test_user_model_matches_single_sharded_per_block(trained, model, strategy):
    summary, rows, _ = trained(model, strategy)
    _, reference, _ = trained(model, "single")
    deviation = max_rel_diff(rows, reference)
    print(f"{model} {strategy}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    count, cls = EXPECTED[model]
    blocks = summary["blocks"]
    assert (blocks["found_by"], blocks["count"], blocks["classes"], blocks["warning"]) == (
        FOUND_BY_REPEATS,
        count,
        [cls],
        None,
    )
    if strategy == "zero3":
        assert blocks["units"].startswith("zero3: ") and blocks["units"].endswith(f"{count} {cls}")
    else:
        assert blocks["units"] == UNITS.get((model, strategy), f"fsdp: {count} units of {cls} + root")
    extra = EXTRA.get((model, strategy), [])
    assert blocks["checkpointed"] == (f"{count} {cls}" if "activation_checkpointing=true" in extra else None)
    assert summary["compiled"] == (f"per block ({count} {cls})" if "compile=true" in extra else None)


@pytest.mark.slow
def test_fsdp_gathers_one_block_at_a_time_not_the_whole_model(trained):
    """Measured in the forward, over the whole model: the bytes of parameters materialised
    whole at once never exceed one block plus the root's own (embedding, final norm)."""
    _, _, out_dir = trained(DECODER, "fsdp")
    model = build_model(DECODER)
    blocks = find_blocks(model)
    in_blocks = {id(p) for b in blocks.modules for p in b.parameters()}
    root = sum(p.numel() * 4 for p in model.parameters() if id(p) not in in_blocks)
    block = sum(p.numel() * 4 for p in blocks.modules[0].parameters())
    whole = sum(p.numel() * 4 for p in model.parameters())
    for rank in (0, 1):
        peak = json.loads((out_dir / f"param_peak.rank{rank}").read_text())["peak_whole_param_bytes"]
        print(f"rank {rank}: peak {peak} bytes whole at once; one block {block} + root {root}; model {whole}")
        assert block <= peak <= block + root < 0.6 * whole


@pytest.mark.slow
def test_model_blocks_changes_the_units(tmp_path):
    summary, _ = _train(tmp_path, NESTED, "fsdp", 1, ["model_blocks=Linear", "steps=2"])
    assert summary["blocks"]["found_by"] == FOUND_BY_NAMES and summary["blocks"]["count"] == 7
    assert summary["blocks"]["units"] == "fsdp: 7 units of Linear + root"


@pytest.mark.slow
def test_a_model_without_blocks_is_one_unit_and_says_so(tmp_path):
    proc = run_cli(
        ["train", "strategy=fsdp", "nproc=1", f"out_dir={tmp_path}", *NANO, f"model={BIGRAM}", "steps=2"],
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "FSDP saves no parameter memory" in warnings[0]
    summary, _ = read_run(tmp_path)
    assert summary["blocks"]["units"] == "fsdp: 1 unit (the root)"
    assert summary["blocks"]["warning"] == warnings[0].removeprefix("warning: ")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (
            ["model_blocks=DecoderBlock"],
            "model_blocks=DecoderBlock matches no module of this model: its module classes are",
        ),
        (
            ["strategy_options.prefetch_blocks=true"],
            "strategy 'fsdp': strategy_options.prefetch_blocks=True must be a whole number (int)",
        ),
    ],
)
def test_bad_blocks_or_options_are_one_line_before_any_worker_starts(tmp_path, args, fragment):
    proc = run_cli(
        ["train", "strategy=fsdp", "nproc=2", f"out_dir={tmp_path}", *NANO, f"model={DECODER}", *args], timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("parabench: error: ") and fragment in proc.stderr, (
        proc.stderr
    )


# ---- strategy options of the wrong type ---------------------------------------------------------


def test_an_option_of_the_wrong_type_names_the_key_the_type_and_an_example():
    with pytest.raises(StrategyError) as err:
        default_registry().create("ddp", _ctx(), bucket_cap_mb="abc")
    assert str(err.value) == (
        "strategy 'ddp': strategy_options.bucket_cap_mb='abc' must be a number (float), "
        "e.g. strategy_options.bucket_cap_mb=25.0"
    )
    with pytest.raises(StrategyError, match=r"static_graph=1 must be true or false \(bool\)"):
        default_registry().create("ddp", _ctx(), static_graph=1)
    default_registry().create("ddp", _ctx(), bucket_cap_mb=25)  # an int will do for a float
    default_registry().create("zero3", _ctx(), cpu_adam=False)  # a None default takes anything


# ---- the planner ------------------------------------------------------------------------------------


def _saved_bytes(model: nn.Module, tokens: torch.Tensor) -> int:
    """What autograd saves in a real forward: each storage once, parameters left out."""
    return saved_bytes(lambda: model(tokens, tokens), model.parameters())


def _plan(strategy: str = "fsdp", **options):
    q = question(PlanConfig(gpus=2, micro_batch=3, seq_len=40, strategies=[strategy], **options))
    return q, plan_strategy(strategy, q)


@pytest.mark.parametrize("spec", list(EXPECTED))
def test_plan_traces_a_user_models_activations(spec):
    q, plan = _plan(model=spec, precision="fp32")
    assert q.shape.dims is None and q.shape.note.startswith("activations traced")
    model = build_model(spec)
    tokens = torch.randint(0, model.vocab_size, (3, 40))
    traced = plan.activations.blocks + plan.activations.head - LOSS_GRADIENT_BYTES_PER_LOGIT * 3 * 40 * model.vocab_size
    assert traced == _saved_bytes(model, tokens)  # the meta-device trace sees what a real forward saves
    assert plan.peak_bytes is not None
    _, checkpointed = _plan(model=spec, precision="fp32", activation_checkpointing=True)
    count = EXPECTED[spec][0]
    assert checkpointed.activations.blocks == count * 3 * 40 * 32 * 4  # each block's fp32 input, width 32
    _, low = _plan(model=spec, precision="bf16")  # FSDP runs the whole model in bf16
    assert plan.activations.blocks / 2 <= low.activations.blocks < plan.activations.blocks


def test_plan_buffers_gather_the_discovered_blocks():
    _, plan = _plan(model=DECODER, precision="fp32")
    block = sum(p.numel() for p in build_model(DECODER).decoder_layers[0].parameters())
    assert plan.buffers.backward["blocks gathered (in use + prefetched)"] == 2 * block * 4
    _, named = _plan(model=DECODER, precision="fp32", model_blocks=["LayerNorm"])
    assert named.buffers.backward["blocks gathered (in use + prefetched)"] == 2 * 2 * 32 * 4


def test_plan_of_an_untraceable_model_says_activations_are_unknown(capsys):
    q, plan = _plan(model=UNTRACEABLE, precision="fp32")
    assert plan.activations is None and plan.peak_bytes is None
    assert q.shape.note.startswith("activations unknown") and "meta" in q.shape.note
    import runner

    assert runner.main(["plan", f"model={UNTRACEABLE}", "gpus=2", "strategies=[fsdp]"]) == 0
    assert "note: activations unknown" in capsys.readouterr().out
