"""Bad input a run's workers used to find is found in the parent, before any worker starts: one
line (exit code 2), not a traceback from each rank beside torchrun's failure table."""

from __future__ import annotations

import pytest

import runner
from tests.helpers import NANO

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "args, says",
    [
        (["device=cuda"], "device=cuda but no CUDA device is visible: use device=cpu or device=auto"),
        (["seq_len=300"], "seq_len=300 exceeds gpt-nano's block_size=256 (its positions): give seq_len<=256"),
        (["strategy=fsdp-cp", "seq_len=600"], "seq_len=600 exceeds gpt-nano's block_size=256"),
        (["model_kwargs.n_layer=0"], "model 'gpt-nano': model_kwargs.n_layer=0 must be a whole number of at least 1"),
        (["model_kwargs.vocab_size=-1"], "model_kwargs.vocab_size=-1 must be a whole number of at least 1"),
        (["model_kwargs.bias=maybe"], "model_kwargs.bias='maybe' must be true or false"),
        (["model_kwargs.dropout=2"], "model_kwargs.dropout=2 must be at least 0 and below 1"),
        (["strategy_options.bucket_cap_mb=-1"], "strategy_options.bucket_cap_mb=-1 must be above 0"),
        (["model=hf:/no/such/config.json"], "a config.json or its folder is read by `plan` only (and /no/such"),
    ],
)
def test_found_before_any_worker_starts(args, says, tmp_path, capsys, monkeypatch):
    if "device=cuda" in args:
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    launched = []
    monkeypatch.setattr("harness.train.train_cli.run_under_torchrun", lambda *a, **k: launched.append(a) or 0)
    strategy = [] if any(a.startswith("strategy=") for a in args) else ["strategy=ddp"]
    code = runner.main(["train", *strategy, *NANO, "nproc=2", f"out_dir={tmp_path}", *args])
    err = capsys.readouterr().err
    assert code == 2 and not launched
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize(
    "name, kind, says",
    [
        ("summary.json", "folder", "holds a folder summary.json where the run writes a file"),
        ("metrics.jsonl", "folder", "holds a folder metrics.jsonl where the run writes a file"),
        ("log.txt", "folder", "holds a folder log.txt where the run writes a file"),
        ("profile", "file", "holds a file profile where the run writes a folder"),
        ("checkpoints", "file", "holds a file checkpoints where the run writes a folder"),
    ],
)
def test_a_name_the_run_writes_held_by_the_wrong_kind_stops_it_first(name, kind, says, tmp_path, capsys, monkeypatch):
    # summary.json as a folder used to fail after the last step, the run's results lost.
    (tmp_path / name).mkdir() if kind == "folder" else (tmp_path / name).write_text("")
    launched = []
    monkeypatch.setattr("harness.train.train_cli.run_under_torchrun", lambda *a, **k: launched.append(a) or 0)
    code = runner.main(["train", "strategy=ddp", *NANO, "nproc=2", f"out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and not launched
    assert err.count("\n") == 1 and f"out_dir={tmp_path} {says}: remove it or give another out_dir" in err, err


@pytest.mark.parametrize("strategy", ["ddp", "fsdp-tp", "accelerate-ddp"])
@pytest.mark.parametrize("launcher", [False, True])
def test_a_deepspeed_config_beside_a_strategy_without_deepspeed_is_refused(
    strategy, launcher, tmp_path, capsys, monkeypatch
):
    """deepspeed_config= used to be ignored by every strategy but DeepSpeed's: the run trained without it,
    and said nothing. Refused in one line, from torchrun's workers too."""
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"overlap_comm": false}}')
    monkeypatch.setattr("harness.train.train_cli.launched_by_launcher", lambda: launcher)
    monkeypatch.setattr("harness.train.train_cli.run_under_torchrun", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr("harness.train.train_cli._train", lambda cfg: pytest.fail("trained"))
    args = [f"strategy={strategy}", *NANO, f"deepspeed_config={ds}", f"out_dir={tmp_path / 'run'}"]
    code = runner.main(["train", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"deepspeed_config={ds} configures DeepSpeed, and strategy {strategy} runs no DeepSpeed" in err, err
    assert "zero1, zero2, zero3" in err and "accelerate-zero1" in err
