"""A compare's strategy options and strategy names: a compare-wide `strategy_options.<key>=` reaches
the strategies that have the option, and a misspelt name or option is one line saying what to give."""

from __future__ import annotations

import pytest

import runner
from configs.schema import ConfigError
from harness.compare import compare_cli
from harness.compare.compare_config import (
    load_compare_config,
    options_for,
    takers_of_compare_wide_options,
    train_options,
)
from strategies.registry import default_registry


def _takers(*args: str) -> dict[str, list[str]]:
    cfg = load_compare_config(list(args))
    return takers_of_compare_wide_options(cfg, cfg.strategies, default_registry())


def test_a_compare_wide_option_reaches_each_strategy_that_has_it_and_no_other():
    args = [
        "strategies=[single,fsdp,hsdp,fsdp-tp]",
        "strategy_options.tp_size=2",
        "strategy_options.shard_size=2",
        "strategy_options.hsdp.prefetch_blocks=1",
    ]
    # hsdp takes a tp_size (HSDP x TP); fsdp does not (that is fsdp-tp).
    assert _takers(*args) == {"tp_size": ["hsdp", "fsdp-tp"], "shard_size": ["hsdp"]}
    cfg, registry = load_compare_config(args), default_registry()
    assert options_for(cfg, "single", registry) == options_for(cfg, "fsdp", registry) == {}
    assert options_for(cfg, "hsdp", registry) == {"tp_size": 2, "shard_size": 2, "prefetch_blocks": 1}
    assert options_for(cfg, "fsdp-tp", registry) == {"tp_size": 2}


def test_an_option_no_compared_strategy_has_is_one_line_with_the_closest():
    with pytest.raises(ConfigError, match=r"strategy_options.tp_sise is an option of none .* did you mean 'tp_size'"):
        _takers("strategies=[single,fsdp-tp]", "strategy_options.tp_sise=2")
    with pytest.raises(ConfigError, match="strategy .single. has no option tp_size: its options are none"):
        _takers("strategies=[single]", "strategy_options.tp_size=2")


def test_the_slurm_scripts_carry_each_strategy_its_own_options(tmp_path, capsys):
    code = runner.main(
        [
            "compare",
            "launcher=slurm",
            "dry_run=true",
            "nodes=2",
            "gpus_per_node=2",
            "device=cpu",
            "strategies=[single,fsdp,fsdp-tp]",
            "strategy_options.tp_size=2",
            f"out_dir={tmp_path}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    launches = {line.split("strategy=")[1].split()[0]: line for line in out.splitlines() if " train " in line}
    assert "tp_size" not in launches["single"] and "tp_size" not in launches["fsdp"]
    assert "strategy_options.tp_size=2" in launches["fsdp-tp"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["compare", "strategies=[single,deepspeed:]"], "strategy 'deepspeed:' names no file: write the path"),
        (["compare", "strategies=single,accelerate:"], "strategy 'accelerate:' names no file"),
        (["compare", "strategies=[single,zero3x]"], "unknown strategy 'zero3x': did you mean 'zero3'?"),
        (["compare", "strategies=[single,deepspeed]"], "did you mean 'deepspeed:<file>'?"),
        (["train", "strategy=deepspeed:"], "strategy 'deepspeed:' names no file"),
        (["train", "strategy=single", "steps=[1,"], "cannot read 'steps=[1,'"),
    ],
)
def test_a_bad_strategy_spelling_is_one_line(tmp_path, capsys, args, words):
    assert runner.main([*args, f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and words in err, err


def test_a_strategy_that_cannot_lay_out_the_model_is_skipped_with_why(tmp_path):
    """accelerate-fsdp-tp at tp 2 (4 processes: 2 left for FSDP2 to shard over) cannot split the GPT's fused
    q;k;v: the compare runs the rest."""
    cfg = load_compare_config(["strategies=[single,accelerate-fsdp-tp]", "nproc=4", f"out_dir={tmp_path}"])
    shared = train_options(cfg, default_registry().names())
    followed, cannot = compare_cli._preflight(cfg, shared, ["single", "accelerate-fsdp-tp"], 4)
    assert list(followed) == ["single"]
    assert cannot["accelerate-fsdp-tp"].startswith(f"cannot run {cfg.model} on 4 processes: accelerate-fsdp-tp cannot")


def test_the_preflight_writes_nothing_outside_the_compares_out_dir(tmp_path, monkeypatch):
    """The runs' checks try the compare's out_dir, not RunConfig's default runs/train under the working
    directory: a compare started from a folder it may not write into, with an out_dir it may, runs."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_compare_config(["strategies=[single,ddp]", "nproc=2", f"out_dir={tmp_path / 'cmp'}"])
    compare_cli._preflight(cfg, train_options(cfg, default_registry().names()), ["single", "ddp"], 2)
    assert list(elsewhere.iterdir()) == []


def test_a_size_no_world_lays_out_stops_the_compare_in_one_line(tmp_path, capsys):
    """tp_size=0 is a typo, not a mesh this many processes cannot hold: one line before any run, as
    train gives it, where a size that does not divide the processes skips that strategy."""
    assert (
        runner.main(["compare", "strategies=[single,fsdp-tp]", "strategy_options.tp_size=0", f"out_dir={tmp_path}"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "strategy_options.tp_size=0 must be a whole number >= 1" in err, err
    assert not (tmp_path / "results.json").exists()


def test_a_strategy_that_refuses_this_model_or_mesh_is_skipped_with_its_reason(tmp_path, capsys):
    """fsdp-cp's cp 4 and fsdp-tp's tp 3 on 4 processes: one refuses gpt-nano's 2 heads, the other the mesh;
    both are skipped with the line a lone train stops with, and the rest of the compare goes on. (fsdp-cp
    left to its default runs cp 2 there: the most that shares out the heads.)"""
    code = runner.main(
        [
            "compare",
            "launcher=slurm",
            "dry_run=true",
            "nodes=1",
            "gpus_per_node=4",
            "device=cpu",
            "strategies=[single,fsdp-cp,fsdp-tp,ddp]",
            "strategy_options.fsdp-cp.cp_size=4",
            "strategy_options.fsdp-tp.tp_size=3",
            f"out_dir={tmp_path}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "# skipped fsdp-cp: cannot run gpt-nano on 4 processes: strategy_options.cp_size=4 does not share" in out
    assert "# skipped fsdp-tp: cannot run gpt-nano on 4 processes: strategy_options.tp_size=3 does not divide" in out
    assert "2 scripts written" in out  # single and ddp
    alone = ["train", "strategy=fsdp-cp", "nproc=4", "strategy_options.cp_size=4", f"out_dir={tmp_path / 'alone'}"]
    assert runner.main(alone) == 2
    err = capsys.readouterr().err.strip()
    assert "cp_size=4 does not share out the model's 2 attention heads" in err and "\n" not in err


def _deepspeed_json(tmp_path) -> str:
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"overlap_comm": false}}')
    return str(ds)


def test_deepspeed_config_reaches_the_strategies_that_run_deepspeed_alone(tmp_path, capsys):
    """It used to go to every run in the shared config, which all but DeepSpeed's ignored (and which train
    now refuses beside them): it travels on the command line of the runs that merge it."""
    ds = _deepspeed_json(tmp_path)
    whole = tmp_path / "whole.json"  # a strategy's whole DeepSpeed config: the other is not merged over it
    whole.write_text('{"zero_optimization": {"stage": 2}}')
    code = runner.main(
        [
            "compare",
            "launcher=slurm",
            "dry_run=true",
            "nodes=1",
            "gpus_per_node=2",
            "device=cpu",
            f"strategies=[single,ddp,zero2,accelerate-zero1,deepspeed:{whole}]",
            f"deepspeed_config={ds}",
            f"out_dir={tmp_path / 'cmp'}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    launches = {line.split("strategy=")[1].split()[0]: line for line in out.splitlines() if " train " in line}
    assert set(launches) == {"single", "ddp", "zero2", "accelerate-zero1", f"deepspeed:{whole}"}
    for name, line in launches.items():
        assert (f"deepspeed_config={ds}" in line) == (name in ("zero2", "accelerate-zero1")), line


def test_deepspeed_config_is_no_part_of_the_identity_of_a_run_it_does_not_reach(tmp_path):
    """resume=auto keeps a finished ddp run when deepspeed_config= is added, changed or dropped: it changes
    nothing ddp measures; a zero2 run it reaches is another configuration."""
    from harness.compare.progress import SweepProgress

    def identity(name: str, *args: str) -> dict:
        cfg = load_compare_config([f"strategies=[{name}]", "nproc=2", f"out_dir={tmp_path / 'cmp'}", *args])
        shared = train_options(cfg, default_registry().names())
        sweep = compare_cli.Sweep(cfg, shared, tmp_path / "cmp", 2, SweepProgress([name], cfg.steps))
        return sweep.planned_run(name, versions={}).identity

    given = f"deepspeed_config={_deepspeed_json(tmp_path)}"
    assert identity("ddp", given) == identity("ddp")
    assert identity("zero2", given) != identity("zero2")
    assert "file.deepspeed_config" in identity("zero2", given)


def test_deepspeed_config_no_compared_strategy_takes_is_one_line(tmp_path, capsys):
    ds = _deepspeed_json(tmp_path)
    code = runner.main(["compare", "strategies=[single,ddp]", f"deepspeed_config={ds}", f"out_dir={tmp_path / 'c'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0, err
    assert f"deepspeed_config={ds} configures DeepSpeed, and no strategy of this compare takes it" in err
    assert not (tmp_path / "c").exists()
