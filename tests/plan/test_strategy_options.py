"""A plan takes the strategy options `train` and `compare` take, and means the same by them: an option
the planned strategy does not take is one line (or, compare-wide over several, reaches only those that
take it, and the plan says which), a bad size is one line, an option the planner does not price is
refused rather than planned as if absent, and `sequence_parallel=false` is planned as it runs."""

from __future__ import annotations

import json

import pytest

import runner
import strategies.registry as registry_module
from harness.plan.model.model_shape import PlanError
from harness.plan.parallel.planned_options import routed_options, takes
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from harness.plan.search.layout_search import search
from harness.plan.search.search_cli import search_question
from strategies.base import StrategyError
from strategies.registry import default_registry

GPT_350M = ["plan", "model=gpt2-350m", "gpus=8"]


def _plan_error(capsys, *args: str) -> str:
    assert runner.main([*GPT_350M, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "args, words",
    [
        (["strategies=[fsdp]", "strategy_options.tp_size=4"], "strategy 'fsdp' has no option tp_size"),
        (["strategies=[zero1-pp]", "strategy_options.tp_size=2"], "strategy 'zero1-pp' has no option tp_size"),
        (["strategies=[zero1-pp]", "strategy_options.cp_size=2"], "strategy 'zero1-pp' has no option cp_size"),
        (["strategies=[fsdp-pp]", "strategy_options.pp_size=0"], "pp_size=0 must be a whole number of at least 1"),
        (["strategies=[fsdp-cp]", "strategy_options.cp_size=-2"], "cp_size=-2 must be a whole number of at least 1"),
        (["strategies=[fsdp-tp]", "strategy_options.tp_size=two"], "tp_size='two' must be a whole number"),
        (["strategy_options.pp_sise=2"], "pp_sise is an option of none of the planned strategies: did you mean"),
        (["strategies=[ddp]", "strategy_options.static_graph=true"], "does not price strategy_options.static_graph"),
        (["strategies=[fsdp-tp]", "strategy_options.sequence_parallel=3"], "must be true or false"),
        (["strategies=[zero1]", "strategy_options.zero1.stage=2"], "strategy 'zero1' means stage=1"),
        (["strategies=[ddp]", "strategy_options.fsdp.prefetch_blocks=2"], "which this plan does not run"),
    ],
)
def test_what_train_refuses_the_plan_refuses_in_one_line(capsys, args, words):
    assert words in _plan_error(capsys, *args)


def test_the_plan_and_train_refuse_an_option_from_the_same_code():
    with pytest.raises(StrategyError) as train:
        default_registry().check_options("fsdp", {"tp_size": 4})
    with pytest.raises(PlanError) as plan:
        routed_options(["fsdp"], {"tp_size": 4})
    assert str(train.value).split(":")[0] == str(plan.value).split(":")[0] == "strategy 'fsdp' has no option tp_size"


def test_a_compare_wide_option_reaches_the_strategies_that_take_it_and_the_plan_says_which(capsys):
    # micro_batch=2: the pipelines' default micro-batches, one a stage, divide it (as `train` requires).
    assert runner.main([*GPT_350M, "micro_batch=2", "strategy_options.pp_size=2", "format=json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # Every name of the torch mesh takes pp_size (ddp-tp + pp_size is Megatron-LM's 3D), and zero1-pp.
    pipelined = ["fsdp", "fsdp-grad-op", "fsdp-offload", "hsdp", "fsdp-tp", "ddp-tp", "zero1-tp", "fsdp-pp", "fsdp-cp"]
    # fsdp-ep and ddp-ep take it too, and are not planned for this model, which has no experts.
    assert doc["strategy_options_reach"] == {"pp_size": [*pipelined, "fsdp-ep", "ddp-ep", "zero1-pp"]}
    layouts = {s["strategy"]: s["layout"] for s in doc["strategies"]}
    assert {s for s, layout in layouts.items() if layout["pp"] > 1} == {*pipelined, "zero1-pp"}
    assert all(layouts[s]["pp"] == 2 for s in (*pipelined, "zero1-pp"))
    assert runner.main([*GPT_350M, "micro_batch=2", "strategy_options.pp_size=2"]) == 0
    reached = ", ".join([*pipelined, "fsdp-ep", "ddp-ep", "zero1-pp"])
    assert f"strategy_options.pp_size reaches {reached}." in capsys.readouterr().out


def test_a_strategy_planned_by_default_with_an_option_the_planner_cannot_price_is_listed_not_planned(capsys):
    assert runner.main([*GPT_350M, "strategy_options.static_graph=true", "format=json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        "does not price strategy_options.static_graph=true on this layout, and would plan it as "
        + ("static_graph=false")
        in doc["not_planned"]["ddp"]
    )
    planned = {s["strategy"] for s in doc["strategies"]}
    assert "ddp" not in planned and "fsdp" in planned


def test_an_option_whose_default_is_none_is_said_to_be_left_out_not_null(capsys):
    mixtral = ["plan", "model=mixtral-8x7b", "gpu=H800", "gpus=16", "strategy_options.ep_size=16", "format=json"]
    assert runner.main(mixtral) == 0
    why = json.loads(capsys.readouterr().out)["not_planned"]["fsdp"]
    assert "would plan it without ep_size: drop it" in why and "null" not in why


def test_an_option_at_its_default_is_planned_and_a_what_if_is_named(capsys):
    assert runner.main([*GPT_350M, "strategies=[ddp]", "strategy_options.static_graph=false"]) == 0
    capsys.readouterr()
    args = ["strategies=[fsdp-tp]", "strategy_options.tp_size=4", "strategy_options.async_tp=true", "compile=true"]
    assert runner.main([*GPT_350M, *args]) == 0
    assert "strategy_options.async_tp is a what-if of the planner (fsdp-tp): train has no such option" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["strategies=[fsdp-tp]", "strategy_options.tp_size=1", "strategy_options.async_tp=true", "compile=true"],
            "tp 1",
        ),
        (["strategies=[fsdp]", "strategy_options.virtual_stages=2"], "pp 1"),
        (["model=mixtral-8x7b", "strategies=[fsdp-ep]", "strategy_options.async_tp=true", "compile=true"], "tp 1"),
    ],
)
def test_a_what_if_on_a_layout_without_its_dimension_is_one_line(capsys, args, says):
    """async_tp at tp 1 (fsdp-ep's mesh names no tp) and interleaving at pp 1 pipeline nothing: planned, the
    answer would be the layout without them, said to be priced with them; refused as cp_attention at cp 1 is."""
    err = _plan_error(capsys, *args)
    assert f"and this layout has {says}: set strategy_options." in err


def test_which_options_a_strategy_takes_is_read_from_the_registry(monkeypatch):
    """A strategy that takes tp, pp and cp sizes (as a composed mesh will) is planned with all three,
    with no list of options to edit in the planner."""
    names = registry_module._builtin_modules() + ["tests.plan.layout_strategies"]
    monkeypatch.setattr(registry_module, "_DEFAULT", registry_module.registry_of(names))
    assert {"tp_size", "pp_size", "cp_size"} <= takes("test-fsdp-tp-pp-cp")
    assert "tp_size" not in takes("fsdp")
    # A what-if only where the strategy takes the size it shapes: no interleaving without stages.
    assert "virtual_stages" in takes("test-zero1-tp-pp") and "virtual_stages" in takes("fsdp-pp")
    options = {"tp_size": 2, "pp_size": 2, "cp_size": 2}
    q = question(PlanConfig(model="llama3.1-8b", gpus=16, seq_len=16384, micro_batch=2, strategy_options=options))
    layout = plan_strategy("test-fsdp-tp-pp-cp", q).layout
    assert (layout.tp, layout.pp, layout.cp) == (2, 2, 2)
    assert plan_strategy("fsdp", q).layout.tp == 1  # a strategy without the option is not routed it


def test_every_searched_layout_runs_under_its_name_with_its_options():
    """The search varies only options its strategies take: each layout is one `train` accepts."""
    cfg = PlanConfig(
        model="gpt2-124m",
        model_kwargs={"block_size": 16384},  # its positions as long as the sequence, as train needs them
        gpus=4,
        seq_len=16384,
        global_batch_tokens="128K",
        search=True,
    )
    q, global_batch = search_question(cfg)
    result = search(q, ["fsdp-cp", "fsdp-pp", "zero1-pp", "fsdp-tp", "hsdp", "ddp-tp"], global_batch)
    registry = default_registry()
    for found in result.ranked + result.too_large:
        registry.check_options(found.strategy, dict(found.options))
    found = result.ranked + result.too_large
    # Megatron-LM's DDP x TP x PP and FSDP x TP x CP searched under the names that run them.
    assert {"ddp-tp", "fsdp-pp", "zero1-pp"} <= {s.strategy for s in found if s.plan.layout.pp > 1}
    assert {"fsdp-tp", "fsdp-cp"} <= {s.strategy for s in found if s.plan.layout.cp > 1}
    assert "zero1-pp" not in {s.strategy for s in found if s.plan.layout.cp > 1}  # DeepSpeed's takes none


def test_the_search_lists_one_layout_once(capsys):
    """fsdp-pp at pp 2 is fsdp-grad-op's layout with pp_size=2, fsdp-cp at pp 2 (its cp left 1) fsdp's: listed
    once, under the plain name."""
    args = ["plan", "search=true", "model=gpt2-124m", "gpus=2", "global_batch_tokens=32K", "format=json"]
    assert runner.main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {s["strategy"] for s in doc["layouts"]}.isdisjoint({"fsdp-pp", "fsdp-cp"})
    shown = [(s["strategy"], s["micro_batch"], s["activation_checkpointing"]) for s in doc["layouts"]]
    assert len(shown) == len(set(shown)) and "fsdp-grad-op" in {strategy for strategy, _, _ in shown}
    assert doc["listed_as"] == {"fsdp-pp at pp 2": "fsdp-grad-op", "fsdp-cp at pp 2": "fsdp"}


def _tp_plan(sequence_parallel: bool, checkpointing: str = "none"):
    cfg = PlanConfig(
        model="gpt2-350m",
        gpus=8,
        micro_batch=8,
        strategies=["fsdp-tp"],
        activation_checkpointing=checkpointing,
        strategy_options={"tp_size": 4, "sequence_parallel": sequence_parallel},
    )
    return plan_strategy("fsdp-tp", question(cfg))


@pytest.mark.parametrize("checkpointing", ["none", "full", "selective"])
def test_without_sequence_parallel_the_norms_are_whole_and_the_outputs_all_reduced(checkpointing):
    """Korthikanti et al. 2022 (arXiv 2205.05198) section 4.2.2: without sequence parallelism the norms'
    inputs are whole on every TP rank (10sbh of the 34sbh a layer keeps are not divided by t), and the
    same bytes go over the wire as all-reduces instead of all-gathers and reduce-scatters."""
    sp, whole = _tp_plan(True, checkpointing), _tp_plan(False, checkpointing)
    assert whole.activations.total > sp.activations.total
    if checkpointing == "none":
        # Two norms a block, whole instead of a quarter: 3/4 of their bytes more on each of 4 GPUs.
        dims, tokens = question(PlanConfig(model="gpt2-350m")).shape.dims, 8 * 1024
        norms = 2 * dims.width * 2 + 2 * 8  # bf16 input and fp32 mean and 1/std, a LayerNorm each
        grown = whole.activations.blocks - sp.activations.blocks
        assert grown == pytest.approx(dims.layers * tokens * norms * 3 / 4, rel=0.01)
    kinds = {c.kind for c in whole.collectives if c.what.startswith("tensor-parallel")}
    assert kinds == {"all-reduce"}
    tp_wire = [
        sum(c.wire_bytes() for c in plan.collectives if c.what.startswith("tensor-parallel")) for plan in (sp, whole)
    ]
    if checkpointing != "selective":
        assert tp_wire[0] == pytest.approx(tp_wire[1])  # the same volume (section 4.2.2)
    assert whole.peak_bytes > sp.peak_bytes


def test_accelerate_fsdp_tp_is_planned_without_sequence_parallel_as_it_runs():
    q = question(PlanConfig(model="gpt2-350m", gpus=8, micro_batch=8, strategy_options={"tp_size": 4}))
    accelerate, torch_tp = plan_strategy("accelerate-fsdp-tp", q), plan_strategy("fsdp-tp", q)
    assert not accelerate.backend.sequence_parallel and torch_tp.backend.sequence_parallel
    assert accelerate.activations.blocks > torch_tp.activations.blocks


@pytest.mark.parametrize(
    "option, says",
    [
        ("strategy_options.schedule=bogus", "strategy_options.schedule='bogus' is not one of gpipe, 1f1b"),
        ("strategy_options.async_tp=maybe", "async_tp='maybe' must be true or false"),
    ],
)
def test_a_value_every_strategy_given_it_refuses_is_one_line(capsys, option, says):
    # It was exit code 0 and a "Not planned" line for each strategy the option reached.
    assert runner.main([*GPT_350M, option]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_a_precision_train_does_not_run_is_said_to_be_a_what_if(capsys):
    """The plan prices fp8 for every strategy, but train runs torchao's float8 only where the strategy says
    so (not DeepSpeed's, not beside tensor parallel) and no fp4: the plan says which of its rows are what-ifs."""
    assert runner.main(["plan", "model=llama3.1-8b", "gpus=16", "precision=fp8"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("precision=fp8 is a what-if")]
    named = {name for line in lines for name in line.split(" for ")[1].split(":")[0].split(", ")}
    assert {"zero3", "zero1", "fsdp-tp", "ddp-tp"} <= named and not {"fsdp", "ddp", "fsdp-cp", "hsdp"} & named
    # fsdp-tp held at tp 1 by GPT-2 1.5B's 25 heads trains fp8 as fsdp does: nothing to say
    assert runner.main(["plan", "model=gpt2-1.5b", "gpus=8", "precision=fp8", "strategies=[fsdp-tp]"]) == 0
    assert "what-if" not in capsys.readouterr().out
    args = ["plan", "model=llama3.1-8b", "gpus=8", "gpu=B200", "precision=fp4", "strategies=[fsdp]"]
    assert runner.main(args) == 0
    assert "precision=fp4 is a what-if of the planner: train runs fp32, bf16, fp16, fp8" in capsys.readouterr().out
    args = ["plan", "search=true", "model=llama3.1-8b", "gpus=16", "batch_size=64", "precision=fp8"]
    assert runner.main(args) == 0
    assert "  precision=fp8 is a what-if of the planner for " in capsys.readouterr().out


def test_a_dimension_of_size_1_is_planned_as_the_layout_without_it(capsys):
    """ep_size=1 on fsdp is fsdp's own layout (its default, None, has no expert parallel): planned as
    without it, where ep_size=2, which the planner does not price for fsdp, stays refused."""
    mixtral = ["plan", "model=mixtral-8x7b", "gpus=16", "strategies=[fsdp]"]
    assert runner.main(mixtral) == 0
    without = capsys.readouterr().out
    assert runner.main([*mixtral, "strategy_options.ep_size=1"]) == 0
    row = next(line for line in without.splitlines() if line.startswith("fsdp "))
    assert row in capsys.readouterr().out
    assert runner.main([*mixtral, "strategy_options.ep_size=2"]) == 2
    assert "does not price strategy_options.ep_size=2" in capsys.readouterr().err
