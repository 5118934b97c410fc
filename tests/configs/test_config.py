"""Configuration: every bad key or value is one line that names it and what is allowed."""

from __future__ import annotations

import pytest

import runner
from configs.schema import ConfigError, RunConfig, load_config
from harness.compare.compare_config import load_compare_config
from harness.plan.plan_options import PlanConfig
from tests.helpers import run_cli


@pytest.mark.parametrize(
    "args, expected",
    [
        (["stepz=3"], "unknown config key 'stepz': did you mean 'steps'?"),
        (["precision=fp4"], "precision='fp4' is not one of fp32, bf16, fp16, fp8"),
        (["steps=abc"], "bad value for 'steps'"),
        (["steps=0"], "steps=0 must be a positive number"),
        (["lr=-1"], "lr=-1.0 must be positive"),
        (["steps"], "is not key=value"),
        # What `deepspeed runner.py train ... --deepspeed --deepspeed_config ds.json` hands the runner.
        (["--deepspeed", "--deepspeed_config", "ds.json"], "'--deepspeed' is a flag of DeepSpeed's own scripts"),
        (["--deepspeed_config=ds.json"], "give the JSON as strategy=deepspeed:<file.json> (its ZeRO stage"),
        (["config=does-not-exist.yaml"], "config file 'does-not-exist.yaml' not found"),
        (["config=defaultt"], "config file 'defaultt' not found (did you mean config=default?)"),
        (["config=configs"], "config=configs is a folder: give a YAML file in it"),
        (["device=tpu"], "device='tpu' is not one of auto, cpu, cuda"),
        # NaN passes `<= 0` and infinity every range: a number is first finite.
        (["lr=nan"], "lr=nan must be a finite number"),
        (["grad_clip=inf"], "grad_clip=inf must be a finite number"),
        # omegaconf reads any integer as a boolean.
        (["deterministic=5"], "deterministic=5: give true or false"),
        (["activation_checkpointing=selectiv"], "give true or false (or none, full, selective)"),
        (["steps=abc"], "could not be converted to Integer: give a whole number"),
        (["data.path=x.bin"], "it takes one value, not named entries: give data=<value>"),
        (["strategy=[fsdp,ddp]"], "strategy= takes one name: to run several, use runner.py compare"),
        # a list where the config holds named entries: omegaconf's merge raised a TypeError
        (["model_kwargs=[1]"], "bad value for 'model_kwargs': give its entries as model_kwargs.<name>=value"),
        (["resume="], "resume= is empty: give a value, or leave resume= out"),
        (["data="], "data= is empty: give a value, or leave data= out"),
        (
            ["pg_timeout_s=0.001"],
            "pg_timeout_s=0.001 must be at least 1 (seconds): the ranks need that long to connect",
        ),
        (["strategy_options=[1]"], "bad value for 'strategy_options': give its entries as strategy_options.<name>="),
        (["strategy_options=3"], "set its entries as strategy_options.<name>=value"),
        (["strategies=[ddp,,"], "cannot read 'strategies=[ddp,,': write lists as strategies=[a,b]"),
    ],
)
def test_bad_input_is_one_clear_line(args, expected):
    with pytest.raises(ConfigError) as err:
        load_config(args)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_layers_apply_in_order(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("steps: 7\nlr: 0.5\n")
    cfg = load_config([f"config={preset}", "lr=0.25", "strategy_options.bucket_cap_mb=5"])
    assert (cfg.steps, cfg.lr, cfg.strategy_options) == (7, 0.25, {"bucket_cap_mb": 5})


@pytest.mark.parametrize("load", [lambda args: load_config(args, schema=PlanConfig), load_compare_config])
@pytest.mark.parametrize(
    "value, names",
    [
        ("ddp", ["ddp"]),
        ("ddp,fsdp", ["ddp", "fsdp"]),
        ("[ddp, fsdp]", ["ddp", "fsdp"]),
        ("deepspeed:a.json", ["deepspeed:a.json"]),
    ],
)
def test_strategies_take_a_bare_list_in_every_command(load, value, names):
    assert load([f"strategies={value}"]).strategies == names


def test_bundled_preset_by_name():
    assert load_config(["config=default"]).model == "gpt-nano"


def test_bad_yaml_is_one_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config([f"config={broken}"])


@pytest.mark.parametrize(
    "fields, world, expected",
    [
        (dict(batch_size=16), 2, (8, 1)),
        (dict(batch_size=16, micro_batch=2), 2, (2, 4)),
        (dict(batch_size=16, grad_accum=4), 2, (2, 4)),
        (dict(batch_size=16, micro_batch=2, grad_accum=4), 2, (2, 4)),
    ],
)
def test_micro_batch_and_accumulation_tile_the_global_batch(fields, world, expected):
    assert RunConfig(**fields).world_batch(world) == expected


@pytest.mark.parametrize(
    "fields, world, expected",
    [
        (dict(batch_size=10), 4, "does not divide over 4 processes"),
        (dict(batch_size=16, micro_batch=3), 2, "micro_batch=3 does not divide"),
        (dict(batch_size=16, micro_batch=2, grad_accum=2), 2, "set only one of micro_batch and grad_accum"),
    ],
)
def test_batch_that_does_not_tile_is_an_error(fields, world, expected):
    with pytest.raises(ConfigError, match=expected):
        RunConfig(**fields).world_batch(world)


def test_cli_reports_config_errors_in_one_line():
    proc = run_cli(["train", "stepz=3"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("parabench: error: unknown config key 'stepz'")
    assert proc.stderr.strip().count("\n") == 0


def test_cli_reports_missing_data_file_in_one_line(tmp_path):
    proc = run_cli(["train", f"data={tmp_path / 'missing.bin'}", "steps=1"], timeout=60)
    assert proc.returncode == 2 and "not found" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_reports_unknown_model_in_one_line():
    proc = run_cli(["train", "model=gpt-huge", "steps=1"], timeout=60)
    assert proc.returncode == 2 and "unknown model 'gpt-huge'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["true", "False", "1", "0", "yes"])
def test_booleans_take_yaml_spellings(value):
    assert load_config([f"deterministic={value}"]).deterministic in (True, False)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["gpu_mem_gb=nan"], "gpu_mem_gb=nan must be a finite number"),
        (["gpu="], "gpu= is empty: give a value"),
        (["fused_loss=2"], "fused_loss=2: give true or false"),
    ],
)
def test_plan_values_are_checked_alike(args, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(args, schema=PlanConfig)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["timeout_s=nan"], "timeout_s=nan must be a finite number"),
        (["rdzv_port=-1"], "rdzv_port=-1 is not a TCP port"),
        (["rdzv_port=70000"], "rdzv_port=70000 is not a TCP port"),
        (["slurm_time=abc"], "slurm_time='abc' is not a time sbatch reads"),
    ],
)
def test_compare_values_are_checked(args, expected):
    with pytest.raises(ConfigError, match=expected):
        load_compare_config(args)


@pytest.mark.parametrize("time", ["90", "01:00:00", "2-00:00:00", "2-12", "UNLIMITED"])
def test_compare_takes_sbatch_times(time):
    assert load_compare_config([f"slurm_time={time}"]).slurm_time == time


def test_a_libraries_several_line_error_is_printed_as_one_line(capsys, monkeypatch):
    # pydantic's validation errors (DeepSpeed's config) span lines and point to a web page.
    message = (
        "1 validation error for DeepSpeedZeroConfig\nbogus_key\n"
        "  Extra inputs are not permitted [type=extra_forbidden]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/extra_forbidden"
    )

    def fails(args):
        raise ValueError(message)

    monkeypatch.setattr("harness.train.list_cli.main", fails)
    assert runner.main(["list"]) == 2
    assert capsys.readouterr().err == (
        "parabench: error: 1 validation error for DeepSpeedZeroConfig; bogus_key; "
        "Extra inputs are not permitted [type=extra_forbidden]\n"
    )


def test_profile_steps_takes_one_step_without_brackets():
    assert load_config(["profile_steps=2"]).profile_steps == [2]
    assert load_config(["profile_steps=[6,7,8]"]).profile_steps == [6, 7, 8]


@pytest.mark.parametrize("load", [load_config, load_compare_config])
def test_the_planners_checkpointing_words_read_as_trains(load):
    """`plan search=true` prints its pick's arguments with activation_checkpointing=none|full|selective:
    pasted into train or compare, none and full run as false and true, selective as true with
    selective_checkpointing, and false turns a preset's selective off with it."""
    for word, expected in (("none", (False, False)), ("full", (True, False)), ("selective", (True, True))):
        cfg = load([f"activation_checkpointing={word}"])
        assert (cfg.activation_checkpointing, cfg.selective_checkpointing) == expected
    cfg = load(["activation_checkpointing=selective", "activation_checkpointing=false"])
    assert (cfg.activation_checkpointing, cfg.selective_checkpointing) == (False, False)
    with pytest.raises(ConfigError, match="give activation_checkpointing=selective"):
        load(["selective_checkpointing=true"])


@pytest.mark.parametrize("load", [load_config, load_compare_config])
def test_a_presets_checkpointing_words_read_as_the_command_lines(load, tmp_path):
    """A YAML preset with the planner's `activation_checkpointing: full` was refused as not a boolean, where
    the same word on the command line runs; selective reads as on the command line too."""
    for word, expected in (("full", (True, False)), ("none", (False, False)), ("selective", (True, True))):
        preset = tmp_path / f"{word}.yaml"
        preset.write_text(f"activation_checkpointing: {word}\n")
        cfg = load([f"config={preset}"])
        assert (cfg.activation_checkpointing, cfg.selective_checkpointing) == expected


def test_the_planner_keeps_its_own_checkpointing_words():
    planned = load_config(["activation_checkpointing=selective"], schema=PlanConfig)
    assert planned.activation_checkpointing == "selective"
