"""`runner.py plan search=true`: every layout the strategies allow for a global batch, ranked
among those that fit, each as `runner.py plan` plans that layout when asked for it directly."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

import runner
from harness.common.units import milliseconds
from harness.plan.model.model_shape import PlanError
from harness.plan.plan_cli import PlanConfig, question, strategy_names
from harness.plan.predict import plan_all
from harness.plan.search import what_fits as what_fits_module
from harness.plan.search.layout_search import (
    TOP,
    SearchResult,
    distinct,
    fastest_tp_across_nodes,
    search,
    why_slower,
)
from harness.plan.search.search_cli import HEADER, search_question, text_lines
from harness.plan.search.search_space import parse_tokens, sequences_in

# A small Llama on two nodes of four GPUs: tp 2 and 4 divide its heads and kv heads, tp 8 spans nodes.
SMALL = dict(
    layers=4,
    width=1024,
    heads=16,
    kv_heads=4,
    ffn=2816,
    vocab=32000,
    arch="llama",
    gpus=8,
    gpus_per_node=4,
    seq_len=2048,
    global_batch_tokens="64K",  # 32 sequences
    search=True,
)


@pytest.fixture(scope="module")
def result() -> SearchResult:
    cfg = PlanConfig(**SMALL)
    q, global_batch = search_question(cfg)
    return search(q, strategy_names(cfg, q.gpus), global_batch)


def test_tokens_parse_with_binary_prefixes_and_must_make_whole_sequences():
    assert parse_tokens("4M") == parse_tokens(4194304) == 4 * 2**20
    assert parse_tokens("512k") == 512 * 1024
    with pytest.raises(PlanError, match="give e.g. 4194304, 4M or 512K"):
        parse_tokens("lots")
    assert sequences_in(4 * 2**20, 8192) == 512
    with pytest.raises(PlanError, match="not a whole number of sequences of seq_len=1000: use 4,194,000 or 4,195,000"):
        sequences_in(4 * 2**20, 1000)


def test_the_search_covers_every_dimension(result):
    everything = result.ranked + result.too_large
    assert result.planned == len(everything) > 100
    assert {s.checkpointing for s in everything} == {"none", "selective", "full"}
    assert {s.plan.layout.tp for s in everything if s.strategy == "fsdp-tp"} == {2, 4}
    assert {s.plan.layout.shard for s in everything if s.strategy == "hsdp"} == {2, 4}
    assert {s.plan.layout.hpz for s in everything if s.strategy == "zero3-hpz"} == {2, 4}
    assert {s.micro_batch for s in everything if s.strategy == "ddp"} == {1, 2, 4}
    # tp 8 is whole nodes but does not divide the 4 kv heads: listed, not planned.
    assert any("tp_size=8 does not divide the model's 4 key/value heads" in why for why in result.not_laid_out)


def test_every_ranked_layout_fits_makes_the_batch_and_is_sorted(result):
    assert result.ranked
    for s in result.ranked:
        assert s.plan.fits is True
        assert s.micro_batch * s.grad_accum * s.plan.layout.data_parallel == result.global_batch == 32
    speeds = [s.tokens_per_s_per_gpu for s in result.ranked]
    assert speeds == sorted(speeds, reverse=True)
    assert all(s.plan.fits is False for s in result.too_large)


def test_the_winner_is_what_plan_gives_that_layout_directly(result):
    best = result.ranked[0]
    cfg = PlanConfig(
        **{k: v for k, v in SMALL.items() if k not in ("search", "global_batch_tokens")},
        batch_size=result.global_batch,
        micro_batch=best.micro_batch,
        activation_checkpointing=best.checkpointing,
        strategies=[best.strategy],
        strategy_options=dict(best.options),
    )
    q = question(cfg)
    (direct,), _ = plan_all([best.strategy], q)
    assert direct.layout == best.plan.layout
    assert direct.peak_bytes == best.plan.peak_bytes
    assert direct.time.tokens_per_s == pytest.approx(best.plan.time.tokens_per_s, rel=1e-12)


def test_each_loser_names_the_term_that_costs_it_most(result):
    best, scale = result.ranked[0], result.question.factors.compute_scale
    for s in result.ranked[1:]:
        loss = why_slower(s, best, scale)
        assert loss.slower >= 0
        assert loss.term is None or loss.seconds > 0
    frontier = result.frontier()
    assert frontier[-1] is best or frontier[-1].tokens_per_s_per_gpu == best.tokens_per_s_per_gpu
    peaks = [f.peak_bytes for f in frontier]
    assert peaks == sorted(peaks)


def test_a_pipeline_row_shows_one_forward_its_micro_batches_and_its_schedule(result):
    """The runner's micro_batch is a pipeline's local batch, which it splits into its micro-batches:
    the table shows what one forward runs and how many forwards make the step, as for the others."""
    piped = [s for s in result.ranked if s.plan.layout.pp > 1]
    assert piped
    only = replace(result, ranked=piped, too_large=[], not_laid_out={}, listed_as={})
    table = [re.split(r"\s{2,}", line.strip()) for line in text_lines(only, 0.1) if line[:1].isdigit()]
    shown = [s for s, _ in distinct(piped, TOP)]
    assert len(table) == len(shown) > 0
    columns = HEADER.index("mb"), HEADER.index("accum"), HEADER.index("schedule")
    for row, s in zip(table, shown, strict=True):
        mb, forwards, schedule = (row[i] for i in columns)
        microbatches = s.options.get("microbatches") or s.plan.layout.pp
        assert int(mb) * int(forwards) * s.plan.layout.data_parallel == result.global_batch
        assert int(forwards) == microbatches * s.grad_accum
        assert schedule == s.options.get("schedule", "1f1b") + (" x2" if "interleaved" in schedule else "")


def test_reasons_that_differ_in_one_value_are_said_once(result):
    stopped = {
        "fsdp-tp: strategy_options.tp_size=16 does not divide the model's 8 heads": 1,
        "ddp-tp: strategy_options.tp_size=32 does not divide the model's 8 heads": 2,
        "hsdp: shard=3 does not divide 8 GPUs": 1,
    }
    lines = text_lines(replace(result, not_laid_out=stopped), 0.1)
    folded = [line for line in lines if "not laid out" in line]
    assert folded == [
        "  not laid out (fsdp-tp, ddp-tp): strategy_options.tp_size=16 or 32 does not divide the model's 8 heads",
        "  not laid out (hsdp): shard=3 does not divide 8 GPUs",
    ]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = runner.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _args(**options) -> list[str]:
    return [f"{k}={v}".replace("True", "true") for k, v in options.items()]


def test_the_cli_prints_the_ten_fastest_and_writes_json(capsys, tmp_path):
    code, out, _ = _cli(capsys, *_args(**SMALL))
    assert code == 0 and "Use " in out and "activation_checkpointing=" in out and "Frontier" in out
    use = next(line for line in out.splitlines() if line.startswith("Use "))
    pasted = use.split("in place of search=true: ")[1].split()
    code, alone, _ = _cli(capsys, *[a for a in _args(**SMALL) if a != "search=true"], *pasted)
    tokens = re.search(r"Use \S+: ([\d,]+) tokens/s per GPU", use).group(1)
    assert code == 0 and f" {tokens} " in alone  # the pasted layout plans alone to the search's figure
    code, out, _ = _cli(capsys, *_args(**SMALL), "format=json", "plot=true", f"out_dir={tmp_path}")
    doc = json.loads(out)
    assert code == 0 and 0 < len(doc["layouts"]) <= 10
    assert doc["planned"] == doc["fit"] + doc["did_not_fit"]
    first = doc["layouts"][0]
    assert first["against_first"] is None and {"strategy_options", "micro_batch", "grad_accum"} <= set(first)
    assert (tmp_path / "plan_search.png").stat().st_size > 0
    # top= keeps more than the ten (what `compare plan=` can then run), or fewer.
    code, out, _ = _cli(capsys, *_args(**SMALL), "format=json", "top=3")
    doc = json.loads(out)
    assert code == 0 and len(doc["layouts"]) == 3 == doc["top"] < doc["fit"]


@pytest.mark.parametrize("capacity_gib", [80, 6, 3])
def test_timing_only_what_fits_ranks_the_same_layouts_and_finds_the_same_leanest(capacity_gib):
    """what_fits' search plans memory first and times only what fits, trying checkpointing leanest
    first: it must rank what the whole search ranks, in the same order at the same speeds, and name
    the same leanest layout that does not fit (on cards where all, some or none of it fits)."""
    cfg = PlanConfig(**SMALL)
    q, global_batch = search_question(cfg)
    q = replace(q, capacity_bytes=capacity_gib * 2**30)
    names = strategy_names(cfg, q.gpus)
    whole, pruned = search(q, names, global_batch), search(q, names, global_batch, time_fitting_only=True)

    def ranked(r: SearchResult) -> list[tuple]:
        return [(s.arguments(), s.tokens_per_s_per_gpu, s.peak_bytes) for s in r.ranked]

    assert ranked(pruned) == ranked(whole)
    assert all(s.plan.time is None for s in pruned.too_large)
    if whole.too_large:
        leanest = min(whole.too_large, key=lambda s: s.peak_bytes)
        assert min(s.peak_bytes for s in pruned.too_large) == leanest.peak_bytes
        assert len(pruned.too_large) < len(whole.too_large)  # the fatter modes of a split that does not fit
    assert whole.ranked or whole.too_large


def test_when_nothing_fits_it_says_what_would(capsys):
    code, out, _ = _cli(
        capsys,
        "search=true",
        "model=llama3.1-70b",
        "gpus=2",
        "gpu=L4",
        "global_batch_tokens=16K",
        "strategies=[ddp,zero2]",
    )
    assert code == 0 and "Nothing fits in 2 x" in out
    # A strategy not searched, on more GPUs: the 2 asked are part of an 8-GPU L4 host, which more GPUs
    # fill before they take more hosts, and zero3-offload's 1.1 TB of host state exceeds what such hosts
    # leave it until a tensor-parallel layout fits on the GPUs alone.
    assert "Layouts that fit on 64 GPUs (none fits on fewer): strategies=[fsdp-tp] strategy_options.tp_size=" in out
    assert "does not model" not in out


def test_when_no_layout_fits_on_any_count_it_says_how_far_the_leanest_is(capsys):
    code, out, _ = _cli(
        capsys, "search=true", "model=llama3.1-70b", "gpus=8", "seq_len=4000000", "global_batch_tokens=4000000"
    )
    assert code == 0 and "No layout the planner knows (tensor, pipeline or context parallel" in out
    leanest = next(line for line in out.splitlines() if "the leanest, " in line and "on up to 1,024 GPUs" in line)
    assert "cp_size=" in leanest and "does not model" not in out


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["search=true", "model=gpt2-124m"], "search=true needs the global batch"),
        (["search=true", "model=gpt2-124m", "batch_size=8", "micro_batch=2"], "drop micro_batch="),
        (["search=true", "model=gpt2-124m", "gpus=[8,16]", "batch_size=16"], "one model on one GPU count"),
        (["search=true", "model=gpt2-124m", "global_batch_tokens=1000"], "use 1,024"),
        (["model=gpt2-124m", "top=5"], "top= is how many layouts search=true lists and keeps: give search=true"),
        (["search=true", "model=gpt2-124m", "batch_size=8", "top=0"], "top=0 must be 1 or more"),
    ],
)
def test_bad_search_input_is_a_one_line_error(capsys, args, fragment):
    code, out, err = _cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize(
    "given, says",
    [
        ("global_batch_tokens=1K", "global_batch_tokens= of at least 8,192 (8 sequences), the fewest a layout"),
        ("batch_size=1", "batch_size=1 is too few to split over any layout's data-parallel ranks: give batch_size= of"),
    ],
)
def test_a_batch_too_small_for_every_layout_says_the_smallest_to_give(capsys, given, says):
    # Every layout refused the batch for its own ranks: one line with the batch that one takes, not each refusal.
    code, out, err = _cli(capsys, "search=true", "model=llama3.1-8b", "gpus=64", given)
    assert code == 2 and out == "" and err.count("\n") == 1 and len(err) < 300 and says in err, err


@pytest.mark.parametrize(
    "given, says",
    [
        (
            "global_batch_tokens=1M",
            "global_batch_tokens=1,048,576 (1024 sequences of 1024) does not divide over any layout's data-parallel "
            "ranks: give global_batch_tokens= a multiple of 73,728 (72 sequences), the fewest a layout here takes, "
            "such as 1,032,192 (1008 sequences) or 1,105,920 (1080 sequences)",
        ),
        ("batch_size=1024", "batch_size=1024 does not divide over any layout's data-parallel ranks: give batch_size="),
    ],
)
def test_a_batch_that_divides_over_no_layout_is_not_called_too_few(capsys, given, says):
    # 72 GPUs (one NVL72 rack) and a power of two of sequences: more than any layout takes, yet ZeRO's layouts
    # have 72 data-parallel ranks, which do not divide it; "too few, give at least 72" would be false.
    asked = ("search=true", "model=llama3.1-8b", "gpu=GB200", "gpus=72", "strategies=[zero1,zero3]", given)
    code, out, err = _cli(capsys, *asked)
    assert code == 2 and out == "" and err.count("\n") == 1 and says in err and "too few" not in err, err


def test_tensor_parallelism_across_nodes_is_searched_and_says_what_makes_it_lose():
    cfg = PlanConfig(**(SMALL | {"kv_heads": 16}))  # tp 8, over both nodes, divides every head
    q, global_batch = search_question(cfg)
    result = search(q, strategy_names(cfg, q.gpus), global_batch)
    across = [s for s in result.ranked if s.plan.layout.tp_group.nodes > 1]
    best = result.ranked[0]
    assert across and {s.plan.layout.tp for s in across} == {8} and best.plan.layout.tp_group.nodes == 1
    fastest = fastest_tp_across_nodes(result.ranked, [best])
    assert fastest is across[0]
    assert fastest_tp_across_nodes(result.ranked, [best, fastest]) is None  # shown already
    loss = why_slower(fastest, best, result.question.factors.compute_scale)
    assert loss.term == "exposed comm" and "tensor parallelism over 8 GPUs spans 2 nodes" in loss.describe()


def test_the_cli_names_the_fastest_layout_across_nodes_and_why_it_loses(capsys):
    code, text, _ = _cli(capsys, *_args(**(SMALL | {"kv_heads": 16})))
    [line] = [x for x in text.splitlines() if "Fastest with tensor parallelism across nodes" in x]
    assert code == 0 and "tp_size=8" in line and "spans 2 nodes" in line
    code, out, _ = _cli(capsys, *_args(**(SMALL | {"kv_heads": 16})), "format=json")
    doc = json.loads(out)
    across = doc["fastest_tp_across_nodes"]
    assert across["strategy_options"]["tp_size"] == 8 and "spans 2 nodes" in across["against_first"]
    # Beside the pick, how close plans of its kind have come to published runs, in text and JSON alike.
    assert doc["published_accuracy"] in text.splitlines()


def test_what_fits_grows_a_batch_the_question_did_not_give_with_the_gpus(monkeypatch):
    """On each GPU count it tries, a batch the question gave is searched as given, and one it did
    not give is a sequence a GPU there (Question.with_gpus)."""
    tried: list[tuple[int, int]] = []

    def nothing_fits(q, names, batch, time_fitting_only):
        assert time_fitting_only  # a search for what fits times only the layouts that do
        tried.append((q.gpus, batch))
        return SimpleNamespace(ranked=[], too_large=[])

    monkeypatch.setattr(what_fits_module, "search", nothing_fits)
    defaulted = question(PlanConfig(model="gpt2-124m", gpus=8))
    what_fits_module.what_fits(defaulted, defaulted.global_batch, ["fsdp"])
    assert tried[:3] == [(8, 8), (16, 16), (32, 32)]
    tried.clear()
    given = question(PlanConfig(model="gpt2-124m", gpus=8, batch_size=64))
    what_fits_module.what_fits(given, 64, ["fsdp"])
    assert tried[:3] == [(8, 64), (16, 64), (32, 64)]


def test_a_loss_never_names_a_part_larger_than_its_whole(capsys):
    """The slowest pipeline stage's excess is told as a part of the extra compute, beyond #1's own."""
    code, out, _ = _cli(capsys, "search=true", "model=llama3.1-8b", "gpus=64", "seq_len=4096", "global_batch_tokens=4M")
    parts = re.findall(r"\+([\d.]+) ms of compute per step \(([\d.]+) ms of it the slowest pipeline stage", out)
    assert code == 0 and parts
    assert all(float(part) <= float(whole) for whole, part in parts)


@pytest.mark.parametrize("seconds, shown", [(5.0142, "5014"), (0.0123, "12"), (0.0031, "3.1"), (0.0003, "0.30")])
def test_a_small_models_losses_are_not_rounded_to_nothing(seconds, shown):
    assert milliseconds(seconds) == shown


def test_the_against_column_is_what_its_legend_says(capsys):
    """The column is #1's tokens/s over the row's, less 1 (so a layout at a third of #1's speed reads -200%):
    the legend says that, not a share of #1's tokens/s, which could never pass 100%."""
    args = ["search=true", "model=moe-nano", "gpus=2", "global_batch_tokens=1K", "strategies=[ddp-ep,fsdp]"]
    code, out, _ = _cli(capsys, *args)
    assert code == 0 and "#1's tokens/s over its own less 1" in out and "tokens/s it lacks" not in out
    rows = re.findall(r"^(\d+) .* ([\d,]+)\s+\d+%\s+[\d.]+\s+-([\d.]+)% ", out, re.MULTILINE)
    first = float(re.search(r"^1 .* ([\d,]+)\s+\d+%\s+[\d.]+\s+fastest", out, re.MULTILINE).group(1).replace(",", ""))
    assert rows and any(float(against) > 100 for _, _, against in rows)
    for _, tokens, against in rows:
        assert first / float(tokens.replace(",", "")) - 1 == pytest.approx(float(against) / 100, abs=2e-3)


def test_the_search_tries_hpzs_copy_over_a_whole_nvl72_rack():
    """On GB200 trays of 4 in an NVL72 rack hpZ's group may be the rack: the search tries a tray's sizes and
    the whole domain (72), not every divisor of it."""
    cfg = PlanConfig(model="llama3.1-8b", gpu="GB200", gpus=144, search=True, batch_size=144, strategies=["zero3-hpz"])
    q, global_batch = search_question(cfg)
    result = search(q, ["zero3-hpz"], global_batch)
    assert {s.plan.layout.hpz for s in result.ranked + result.too_large} == {2, 4, 72}


def test_stages_left_to_the_strategys_default_are_written_out_in_the_pick(capsys):
    """zero1-pp's pick at its default pp 2 was printed without pp_size: `train` on another machine (more nodes,
    or one node where the plan had several) defaults to another count of stages. The line names them, and
    still plans alone to the search's figure."""
    asked = ["model=gpt-micro", "gpus=8", "seq_len=64", "batch_size=32", "strategies=[zero1-pp]"]
    code, out, _ = _cli(capsys, "search=true", *asked)
    use = next(line for line in out.splitlines() if line.startswith("Use "))
    pasted = use.split("in place of search=true: ")[1].split()
    assert code == 0 and "strategy_options.pp_size=2" in pasted, use
    code, alone, _ = _cli(capsys, *asked, *pasted)
    tokens = re.search(r"Use \S+: ([\d,]+) tokens/s per GPU", use).group(1)
    assert code == 0 and f" {tokens} " in alone


def test_a_boolean_option_of_the_pick_is_written_as_the_docs_write_it(capsys):
    """sequence_parallel=false given to the search came back as `strategy_options.sequence_parallel=False`."""
    asked = ["model=gpt-micro", "gpus=4", "seq_len=64", "batch_size=16", "strategies=[ddp-tp]"]
    code, out, _ = _cli(capsys, "search=true", *asked, "strategy_options.sequence_parallel=false")
    use = next(line for line in out.splitlines() if line.startswith("Use "))
    assert code == 0 and "strategy_options.sequence_parallel=false " in use, use


@pytest.mark.parametrize("given, modes", [(None, {"none", "selective", "full"}), ("selective", {"selective"})])
def test_a_checkpointing_given_to_the_search_is_the_one_it_ranks(capsys, given, modes):
    """activation_checkpointing=selective given to the search was dropped: it ranked every mode, none first."""
    asked = ["model=gpt-micro", "gpus=2", "seq_len=64", "batch_size=16", "strategies=[ddp,fsdp]", "format=json"]
    code, out, _ = _cli(capsys, "search=true", *asked, *([f"activation_checkpointing={given}"] if given else []))
    doc = json.loads(out)
    assert code == 0 and {s["activation_checkpointing"] for s in doc["layouts"]} == modes


def test_a_mode_the_recipe_refuses_is_not_laid_out_and_the_others_still_rank(capsys):
    """Beside activation_offload_layers= (none alone) or a model without transformer layers (no selective),
    the search's first refused mode was the whole search's error."""
    asked = ["model=llama3.1-8b", "gpus=8", "seq_len=8192", "global_batch_tokens=512K", "strategies=[fsdp]"]
    code, out, _ = _cli(capsys, "search=true", *asked, "activation_offload_layers=4", "format=json")
    doc = json.loads(out)
    assert code == 0 and {s["activation_checkpointing"] for s in doc["layouts"]} == {"none"}
    assert any("not selective" in reason for reason in doc["not_laid_out"])
