"""fsdp-cp on a 2 x 2 mesh (CPU, gloo, world size 4: each sequence split over two ranks, two such
groups reading different data), in fp32: gpt-nano and a Hugging Face Llama (4 heads, 2 key/value
heads, through parabench's function in transformers' attention registry), each loss curve
against `single` on the same global batches (the all-to-all attention exact, the positions offset
per slice, the loss the mean over every token), the mesh in the header and summary.json, what each
rank holds, and the refusals in one line: sizes that do not split, a model whose attention
parabench does not know, ring attention on the CPU.

One run per model, shared by every check (module scope), with two micro-steps of accumulation per step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.compare.compare_cli import _skip_reason
from models.zoo import build_model
from strategies.base import ModelUnsupported, StrategyError
from strategies.registry import default_registry
from tests.helpers import NANO, OnFirstUse, env_for_tests, max_rel_diff, read_run, run_cli, succeeded
from tests.strategies.constructed import constructed

pytestmark = pytest.mark.timeout(900)

# The compare's fp32 "matches" verdict: only the order of floating-point sums differs.
TOLERANCE = 1e-5
NPROC = 4
LLAMA_KWARGS = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
LLAMA = ["model=hf:LlamaConfig", *(f"model_kwargs.{key}={value}" for key, value in LLAMA_KWARGS.items())]
CP = ["strategy_options.cp_size=2", "micro_batch=2"]


def _launch(strategy: str, out_dir: Path, extra: list[str], nproc: int = NPROC):
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, *extra]
    return run_cli(args, env=env_for_tests(), timeout=300)


# name -> (strategy, extra, nproc).
RUNS = {
    "gpt": ("fsdp-cp", CP, NPROC),
    "llama": ("fsdp-cp", [*CP, *LLAMA], NPROC),
    "llama-single": ("single", LLAMA, 1),
}
# The GPT on every change; the Llama's two runs under --all (tests/models/test_context_parallel.py
# holds its attention's split to the whole model on every change).
MODELS = ["gpt", pytest.param("llama", marks=pytest.mark.extended)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> OnFirstUse[str, tuple[dict, list[dict], str]]:
    """name -> (summary, rows, stdout), each trained when a test first reads it."""

    def trained(name: str) -> tuple[dict, list[dict], str]:
        strategy, extra, nproc = RUNS[name]
        out_dir = tmp_path_factory.mktemp(name)
        stdout = succeeded(_launch(strategy, out_dir, extra, nproc))
        return (*read_run(out_dir), stdout)

    return OnFirstUse(RUNS, trained)


@pytest.mark.parametrize("name", MODELS)
def test_loss_matches_single_at_every_step(runs, reference_run, name, record_property):
    summary, rows, _ = runs[name]
    reference = runs["llama-single"][1] if name == "llama" else reference_run[1]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"fsdp-cp, {name}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert summary["world_size"] == NPROC


@pytest.mark.parametrize("name", MODELS)
def test_the_header_and_summary_give_the_mesh(runs, name):
    summary, _, stdout = runs[name]
    assert summary["mesh"]["shape"] == [2, 2] and summary["mesh"]["dims"] == ["shard", "cp"]
    # The ranks of a context-parallel group read the same sequences: 8 over 2 groups, 2 micro-steps of 2.
    assert summary["data_parallel_size"] == 2 and (summary["micro_batch"], summary["grad_accum"]) == (2, 2)
    assert "context parallel over 2 (all-to-all attention)" in summary["blocks"]["units"]
    header = next(line for line in stdout.splitlines() if line.startswith("parabench train"))
    assert "mesh 2 x 2: shard x cp" in header and "global batch 8 = 2 data-parallel ranks x" in header


@pytest.mark.parametrize("name", MODELS)
def test_each_rank_holds_a_quarter_of_the_model(runs, reference_run, name):
    """FSDP shards over all four ranks: context parallel splits the activations, not the parameters."""
    single = runs["llama-single"][0] if name == "llama" else reference_run[0]
    split = runs[name][0]
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert split[key] == pytest.approx(single[key] / 4, rel=0.05), key


def _strategy(cp_size: int, seq_len: int, **options):
    config = type("Config", (), {"seq_len": seq_len})()
    return constructed("fsdp-cp", max(4, cp_size), micro_batch=2, config=config, cp_size=cp_size, **options)


def _llama(**kwargs):
    return build_model("hf:LlamaConfig", {**LLAMA_KWARGS, **kwargs})


@pytest.mark.parametrize(
    "model, cp_size, seq_len, options, says",
    [
        ("gpt-nano", 4, 32, {}, "cp_size=4 does not share out the model's 2 attention heads"),
        ("gpt-nano", 2, 33, {}, "seq_len=33 does not split into cp_size=2 slices: use a seq_len that 2 divides"),
        ("gpt-nano", 2, 34, {"cp_attention": "ring"}, "seq_len=34 does not split into 2 x 2 head-and-tail chunks"),
        ("llama", 4, 32, {}, None),  # 2 key/value heads, each repeated for 2 of the 4 ranks
        ("llama", 8, 32, {}, "use strategy_options.cp_size=1 or 2 or 4, or strategy_options.cp_attention=ring"),
        ("llama-12-heads", 4, 32, {}, "does not share out the model's 12 attention heads and 6 key/value"),
        ("llama-12-heads", 4, 32, {"cp_attention": "ring"}, None),  # the ring splits the sequence, not the heads
        ("mistral", 2, 32, {}, "MistralForCausalLM has sliding_attention layers, whose mask context parallel"),
        ("gpt2", 2, 32, {}, None),  # learned positions, read from the position ids
    ],
)
def test_a_split_that_cannot_run_says_why_in_one_line(model, cp_size, seq_len, options, says):
    built = {
        "llama": _llama,
        "llama-12-heads": lambda: _llama(hidden_size=96, num_attention_heads=12, num_key_value_heads=6),
        "mistral": lambda: build_model("hf:MistralConfig", {**LLAMA_KWARGS, "sliding_window": 16}),
        "gpt2": lambda: build_model("hf:GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128}),
    }.get(model, lambda: build_model(model))()
    strategy = _strategy(cp_size, seq_len, **options)
    if says is None:
        strategy.check_model(built)
        return
    with pytest.raises(StrategyError) as err:
        strategy.check_model(built)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_model_whose_attention_it_does_not_know_says_what_would_work():
    """ModelUnsupported: a compare of this model skips fsdp-cp with the reason and runs the rest."""
    with pytest.raises(ModelUnsupported) as err:
        _strategy(2, 32).check_model(build_model("mlp"))
    message = str(err.value)
    assert "parabench's GPT (gpt-* models) and of Hugging Face causal LMs (model=hf:...), not TokenMLP's" in message
    assert "\n" not in message


def test_an_attention_it_does_not_have_says_which_it_has():
    with pytest.raises(StrategyError, match=r"cp_attention='rings': use all-to-all or ring$"):
        _strategy(2, 32, cp_attention="rings")


def test_ring_attention_on_the_cpu_is_refused_before_any_process_and_skipped_by_compare(tmp_path):
    entry = default_registry().get("fsdp-cp")
    reason = entry.unsupported_reason("cpu", {"cp_attention": "ring"})
    assert "SDPA has no sharding strategy on the CPU" in reason
    assert entry.unsupported_reason("cuda", {"cp_attention": "ring"}) is None
    assert entry.unsupported_reason("cpu", {}) is None
    settings = {"strategy_options": {"cp_attention": "ring"}}
    assert _skip_reason(default_registry(), "fsdp-cp", "cpu", settings=settings) == f"unsupported on cpu: {reason}"
    proc = _launch("fsdp-cp", tmp_path, ["strategy_options.cp_attention=ring"])
    assert proc.returncode != 0
    assert f"strategy 'fsdp-cp' cannot run on cpu here: {reason}" in proc.stdout + proc.stderr
