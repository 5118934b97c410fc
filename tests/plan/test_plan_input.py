"""Bad input to `runner.py plan` found by an audit: each is one line that says what to give (exit
code 2), where it was a traceback from deep in the planner or was planned as if it made sense."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import runner
from harness.plan.model.model_shape import PlanError, shape_of_spec
from harness.plan.plan_options import PlanConfig, check

LLAMA_TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}


def one_line_error(capsys, *args: str) -> str:
    """The error `runner.py plan args` prints, once it is checked to be one line and nothing else."""
    code = runner.main(["plan", *args])
    out = capsys.readouterr()
    assert code == 2 and out.out == "", out.out
    assert out.err.count("\n") == 1 and out.err.startswith("parabench: error: "), out.err
    return out.err


@pytest.mark.parametrize(
    "args, says",
    [
        (["model=[]", "gpus=8"], "model=[] names no model: give model=a or model=[a,b]"),
        (["gpus=[]", "model=gpt2-124m"], "gpus=[] names no GPU count: give gpus=8 or gpus=[8,64]"),
    ],
)
def test_an_empty_sweep_is_one_line(capsys, args, says):
    assert says in one_line_error(capsys, *args)


@pytest.mark.parametrize("model", ["model=3", "model=[gpt2-124m,3]"])
def test_a_model_that_is_not_a_name_is_one_line(capsys, model):
    assert "model=3 is not a model name: give a zoo name" in one_line_error(capsys, model)


def _config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_TINY, **fields}))
    return path


@pytest.mark.parametrize(
    "args, says",
    [
        (["model=hf:LlamaConfig", "model_kwargs.num_hidden_layers=abc"], "num_hidden_layers='abc' in hf:LlamaConfig"),
        (["model=hf:LlamaConfig", "model_kwargs.hidden_size=1.5"], "hidden_size=1.5 in hf:LlamaConfig"),
        (["model=hf:MixtralConfig", "model_kwargs.hidden_size=abc"], "hidden_size='abc' in hf:MixtralConfig"),
        (["model=hf:GPT2Config", "model_kwargs.n_layer=abc"], "n_layer='abc' in hf:GPT2Config"),
    ],
)
def test_a_hugging_face_size_that_is_not_a_whole_number_is_one_line(capsys, args, says):
    assert f"{says} must be a whole number" in one_line_error(capsys, *args)


def test_a_zoo_models_misspelt_setting_names_the_one_it_has(capsys):
    err = one_line_error(capsys, "model=gpt2-124m", "model_kwargs.n_layr=2")
    assert "no setting model_kwargs.n_layr (did you mean model_kwargs.n_layer?): its settings are n_layer" in err


@pytest.mark.parametrize("value", ["abc", None, 64.5])
def test_a_config_files_size_that_is_not_a_whole_number_is_one_line_naming_the_file(capsys, tmp_path, value):
    path = _config(tmp_path, hidden_size=value)
    err = one_line_error(capsys, f"model=hf:{path}")
    assert f"hidden_size={value!r} in hf:{path} must be a whole number" in err


def test_a_config_files_whole_float_reads_as_the_whole_number(tmp_path):
    """4096.0 is a whole number as JSON may write it: planned as 4096, not refused."""
    (tmp_path / "whole").mkdir()
    as_float = shape_of_spec(f"hf:{_config(tmp_path, hidden_size=64.0)}")
    assert as_float.params == shape_of_spec(f"hf:{_config(tmp_path / 'whole', hidden_size=64)}").params
    assert as_float.dims is not None and type(as_float.dims.width) is int


@pytest.mark.parametrize(
    "options",
    [
        {"params": math.inf},
        {"params": math.nan},
        {"model": "gpt2-124m", "gpu_mem_gb": math.nan},
        {"model": "gpt2-124m", "gpu_mem_gb": math.inf},
        {"model": "gpt2-124m", "hbm_tb_s": math.nan},
        {"model": "gpt2-124m", "peak_tflops": math.inf},
        {"model": "gpt2-124m", "moe_imbalance": math.inf},
    ],
)
def test_a_number_that_is_not_finite_is_refused(options):
    """NaN passes a `<= 0` check and infinity a lower bound: each figure must be a finite number."""
    (name, value), *_ = ((k, v) for k, v in options.items() if k != "model")
    with pytest.raises(PlanError, match=f"{name}={value}"):
        check(PlanConfig(**options))


@pytest.mark.parametrize("name, content", [("results.json", "[1, 2]"), ("summary.json", "3"), ("results.json", "null")])
def test_calibrating_from_a_file_that_is_not_a_runs_results_is_one_line(capsys, tmp_path, name, content):
    (tmp_path / name).write_text(content)
    err = one_line_error(capsys, "model=gpt2-124m", f"calibrate={tmp_path}")
    assert f"{tmp_path / name} holds no JSON object of results: give the out_dir of a finished compare" in err


def test_an_empty_calibration_is_refused_not_ignored(capsys):
    assert "calibrate=[] names no folder" in one_line_error(capsys, "model=gpt2-124m", "calibrate=[]")


@pytest.mark.parametrize(
    "asked",
    [
        ["gpus=8"],
        ["gpus=[8,16]"],
        ["gpus=8", "search=true", "global_batch_tokens=1M"],
    ],
)
def test_an_out_dir_the_plots_cannot_go_to_is_one_line_before_planning(capsys, tmp_path, asked):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out_dir, why in ((a_file, "is a file, not a folder"), (a_file / "plots", "cannot be created")):
        err = one_line_error(capsys, "model=gpt2-124m", *asked, "plot=true", f"out_dir={out_dir}")
        assert f"out_dir={out_dir} (where plot=true writes its charts) {why}" in err


@pytest.mark.parametrize(
    "args, says, not_said",
    [
        (["gpus=8", "gpus_per_node=3"], "over 3 nodes of gpus_per_node=3: give gpus= a multiple of 3", "nodes=3"),
        (["gpus=9"], "gpus=9 is not whole hosts of 8 GPUs (the H100", "nodes=2"),
        # Not two hosts of 6 with 6 cards each: whole hosts of the card's 8 beyond one.
        (["gpus=12"], "gpus=12 is not whole hosts of 8 GPUs (the H100", "6 GPUs"),
        (["gpus=8", "nodes=3"], "does not split over nodes=3", "gpus_per_node"),
        # Not four hosts of 2: a gpus= given is not what nodes= and gpus_per_node= make.
        (
            ["gpu=B200", "gpus=8", "nodes=4", "gpus_per_node=8"],
            "nodes=4 of gpus_per_node=8 is 32 GPUs, not gpus=8: give gpus=32, or only one of nodes=",
            "does not split",
        ),
        (
            ["gpus=16", "gpus_per_node=32"],
            "gpus=16 is less than one node of gpus_per_node=32: give gpus= a multiple of 32, or gpus_per_node=16",
            "nodes=",
        ),
        (["gpus=[8,64]", "gpus_per_node=16"], "gpus=8 is less than one node of gpus_per_node=16", "nodes="),
        (["gpu=B200", "precision=nvfp4"], "give precision=fp4 (NVFP4 and MXFP4 are both planned as fp4)", "Traceback"),
        (["gpu=B200", "precision=MXFP8"], "give precision=fp8 fp8_block_scaling=true", "Traceback"),
        (
            ["gpu=B200", "precision=BF16"],
            "precision='BF16' is not one of fp32, bf16, fp16, fp8, fp4: give precision=bf16",
            "T",
        ),
        (
            ["strategy_options.nosuch.tp_size=2"],
            "unknown strategy 'nosuch' in strategy_options.nosuch.*: known strategies are single, ddp",
            "option of none",
        ),
        (
            ["strategy_options.fsdpp.tp_size=2"],
            "unknown strategy 'fsdpp' in strategy_options.fsdpp.*: did you mean 'fsdp'?",
            "option of none",
        ),
    ],
)
def test_the_error_names_what_the_user_gave(capsys, args, says, not_said):
    err = one_line_error(capsys, "model=gpt2-124m", *args)
    assert says in err and not_said not in err, err


@pytest.mark.parametrize(
    "spec, field", [("hf:LlamaConfig", "attention_dropout=0.0"), ("hf:MixtralConfig", "attention_dropout=0.0")]
)
def test_a_field_outside_the_shape_may_be_zero(spec, field):
    """Only the shape's sizes must be positive: a dropout of 0 is how these models train."""
    key, value = field.split("=")
    assert shape_of_spec(spec, {key: float(value)}).params > 0


def test_a_shape_size_of_zero_is_one_line(capsys):
    err = one_line_error(capsys, "model=hf:LlamaConfig", "model_kwargs.hidden_size=0")
    assert "model_kwargs.hidden_size=0 must be positive" in err


def test_a_fabric_is_read_as_written_not_as_yaml_reads_numbers(capsys):
    # YAML read inter_node=0x400 as hexadecimal: one card of 1,024 Gb/s.
    err = one_line_error(capsys, "model=llama3.1-8b", "gpus=16", "inter_node=0x400")
    assert "inter_node=0x400: the cards and their rate must be positive" in err


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["model=gpt2-1.5b", "seq_len=100000"],
            "seq_len=100000 exceeds gpt2-1.5b's block_size=1024 (its positions): give seq_len<=1024 or "
            "model_kwargs.block_size=100000",
        ),
        (["model=moe-nano", "seq_len=512"], "exceeds moe-nano's block_size=256"),
        (["model=hf:GPT2Config", "seq_len=2048"], "exceeds hf:GPT2Config's n_positions=1024"),
        (["model=[llama3.1-8b,gpt2-124m]", "seq_len=2048"], "exceeds gpt2-124m's block_size=1024"),
    ],
)
def test_a_sequence_beyond_the_models_learned_positions_is_one_line(capsys, args, says):
    """As train refuses it: the tokens past the learned positions have no embedding."""
    assert says in one_line_error(capsys, "gpus=8", *args)


@pytest.mark.parametrize(
    "args",
    [
        ["model=llama3.1-8b", "seq_len=1000000"],  # rotary positions: no hard limit
        ["model=gpt2-124m", "seq_len=4096", "model_kwargs.block_size=4096"],
        ["layers=4", "width=256", "seq_len=100000"],  # a described GPT's positions are the sequence's
    ],
)
def test_a_long_sequence_is_planned_where_the_model_takes_it(capsys, args):
    assert runner.main(["plan", "gpus=8", "format=json", *args]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("model", "tokens"), [("gpt-nano", 256), ("gpt2-124m", 1024), ("llama3.1-8b", 1024)])
def test_an_unset_seq_len_is_1024_or_the_models_positions_where_fewer(capsys, model, tokens):
    assert runner.main(["plan", f"model={model}", "gpus=2", "format=json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["question"]["seq_len"] == tokens


@pytest.mark.parametrize(
    "args, says",
    [
        (["strategy_options.ep_size=8"], "strategy_options.ep_size=8 splits a mixture of experts' experts"),
        (["strategy_options.fsdp.ep_size=2"], "strategy_options.fsdp.ep_size=2 splits a mixture of experts' experts"),
        (["search=true", "batch_size=16", "strategy_options.ep_size=2"], "strategy_options.ep_size=2 splits"),
        (["moe_imbalance=1.5"], "moe_imbalance=1.5 is a mixture of experts' busiest GPU's expert load"),
    ],
)
def test_a_mixtures_input_on_a_dense_model_is_one_line(capsys, args, says):
    """train refuses ep_size above 1 on a model without experts, and a dense model has no expert load: a plan
    says so rather than answering for the strategies it could plan without them, or without the imbalance."""
    err = one_line_error(capsys, "model=llama3.1-8b", "gpus=8", *args)
    assert says in err and "llama3.1-8b has" in err


def test_an_out_dir_without_plot_is_one_line_not_ignored(capsys, tmp_path):
    """A plan writes only plot=true's charts: out_dir= alone would be ignored, nothing written and nothing said."""
    err = one_line_error(capsys, "model=gpt2-124m", "gpus=8", f"out_dir={tmp_path / 'plan'}")
    assert "is where plot=true writes its charts" in err and "give plot=true, or leave out_dir out" in err
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("search", [[], ["search=true", "batch_size=64"]])
def test_an_empty_strategy_list_is_one_line_as_compare_says_it(capsys, search):
    """strategies=[] names none: compare refuses it, and a plan of every strategy would answer another question."""
    err = one_line_error(capsys, "model=gpt2-124m", "gpus=8", "strategies=[]", *search)
    assert "strategies=[] names no strategy: list some, or leave it out" in err


@pytest.mark.parametrize("gpus, says", [(1, "| 1 GPU on "), (8, "| 8 GPUs on ")])
def test_the_header_counts_one_gpu_in_the_singular(capsys, gpus, says):
    assert runner.main(["plan", "model=gpt2-124m", f"gpus={gpus}"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert says in f"| {header.strip()}"
