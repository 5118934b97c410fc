"""The curves in the trackers people read: TensorBoard event files in every run folder (read
back with TensorBoard's own reader), and with `trackers=[wandb,mlflow]` a W&B run (offline) and
an MLflow run per strategy, each holding what metrics.jsonl holds. A tracker whose library is
missing is one line naming the package.

One small compare (single, ddp on 2 ranks) feeds most tests; W&B and MLflow join it where they
are installed, and their tests skip where they are not.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import runner
from configs.schema import ConfigError, load_config
from harness.train.trackers import TrackerError, check_trackers, enabled, group_name, run_name
from tests.helpers import NANO, env_for_tests, run_cli
from tests.train.test_checkpoint import launch, straight_run

HAS_WANDB = importlib.util.find_spec("wandb") is not None
HAS_MLFLOW = all(importlib.util.find_spec(m) is not None for m in ("mlflow", "sqlalchemy", "alembic"))
RUNS = ("single", "ddp")  # each the tracker run's name and its folder in the compare


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run folder's event files, through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trackers") / "sweep-7"
    extra = [name for name, present in (("wandb", HAS_WANDB), ("mlflow", HAS_MLFLOW)) if present]
    proc = run_cli(
        [
            "compare",
            "strategies=[single,ddp]",
            "noise_runs=0",
            *NANO,
            f"trackers=[{','.join(extra)}]",
            f"out_dir={out}",
        ],
        timeout=400,
        env=env_for_tests(WANDB_MODE="offline", WANDB_SILENT="true", MLFLOW_TRACKING_URI=""),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_tensorboard_has_every_run_step_by_step_as_metrics_jsonl(compare_dir):
    for folder in RUNS:
        rows = read_rows(compare_dir / folder)
        scalars = tensorboard_scalars(compare_dir / folder)
        # One loss per step, equal to metrics.jsonl's (a float32 there as in the event file).
        assert scalars["loss"] == [(r["step"], float(np.float32(r["loss"]))) for r in rows], folder
        assert [step for step, _ in scalars["throughput/tokens_per_s"]] == [r["step"] for r in rows]
        assert {"lr", "throughput/step_time_s", "memory/params_bytes", "memory/optimizer_bytes"} <= set(scalars)
        assert not any("peak" in tag for tag in scalars)  # not measured on CPU: not logged as zeros
    # `tensorboard --logdir <compare>` finds one run per folder, the strategy's name.
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    runs = EventMultiplexer().AddRunsFromDirectory(str(compare_dir)).Runs()
    assert set(runs) == set(RUNS)


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install wandb)")
def test_wandb_writes_one_offline_run_per_strategy(compare_dir):
    for name in RUNS:
        (offline,) = (compare_dir / name / "wandb").glob("offline-run-*")
        (log,) = offline.glob("run-*.wandb")
        records = log.read_bytes()
        # W&B's transaction log holds the run's name, its group (the compare's folder), project and scalars.
        for text in (name, "sweep-7", "parabench", "loss", "lr", "throughput/tokens_per_s", "memory/params_bytes"):
            assert text.encode() in records, (name, text)


@pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow (with sqlalchemy and alembic) is not installed")
def test_mlflow_holds_the_compare_as_one_experiment(compare_dir):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{compare_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sweep-7")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert set(runs) == set(RUNS)
    for name in RUNS:
        rows = read_rows(compare_dir / name)
        history = client.get_metric_history(runs[name].info.run_id, "loss")
        assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in rows], name
        assert runs[name].info.status == "FINISHED"
        assert runs[name].data.params["steps"] == "10" and runs[name].data.params["strategy"] == name


def test_a_resumed_run_replaces_the_steps_it_redoes(tmp_path, tmp_path_factory):
    """`train` alone: event files in its out_dir; resumed from step 10 of 20, TensorBoard shows
    steps 11-20 once, from the resumed run, as metrics.jsonl does. The first run is a copy of
    tests/train/test_checkpoint.py's straight `single` run (trained once a session)."""
    out = tmp_path / "run"
    shutil.copytree(straight_run("single", tmp_path_factory.getbasetemp()), out)
    assert len(list(out.glob("events.out.tfevents.*"))) == 1
    resumed = launch("single", out, f"resume={out / 'checkpoints' / 'step_10'}")
    assert resumed.returncode == 0, resumed.stderr
    assert len(list(out.glob("events.out.tfevents.*"))) == 2
    rows = read_rows(out)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert tensorboard_scalars(out)["loss"] == [(r["step"], float(np.float32(r["loss"]))) for r in rows]


def test_a_missing_tracker_library_is_one_line_naming_the_package(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec answers None
    with pytest.raises(TrackerError, match="tracker wandb needs the wandb package.*pip install wandb"):
        check_trackers(load_config(["trackers=wandb"]))
    code = runner.main(["train", "trackers=[wandb]", *NANO, f"out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install wandb" in err, err
    monkeypatch.setitem(sys.modules, "alembic", None)
    with pytest.raises(TrackerError, match="mlflow keeps its runs in sqlite:///.*needs alembic"):
        check_trackers(load_config(["trackers=[mlflow]", f"out_dir={tmp_path}"]))
    check_trackers(load_config(["trackers=[mlflow]", "tracker_uri=http://mlflow.example:5000"]))  # a server: no db


def test_a_noise_run_is_named_apart_from_its_strategy():
    noise = load_config(["strategy=single", "noise_seed=2", "out_dir=runs/sweep/noise/2"])
    assert run_name(noise) == "single noise 2"
    assert run_name(load_config(["strategy=ddp"])) == "ddp"
    assert group_name(noise) == "2" and group_name(load_config(["tracker_group=mine"])) == "mine"


def test_tensorboard_unasked_is_written_where_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    check_trackers(load_config([]))  # not installed, not asked for: no event files, no error
    assert enabled(load_config([])) == []
    with pytest.raises(TrackerError, match="tracker tensorboard needs the tensorboard package"):
        check_trackers(load_config(["tensorboard=true"]))


def test_tracker_names_are_checked():
    with pytest.raises(ConfigError, match="did you mean 'tensorboard'"):
        load_config(["trackers=[tensorbord]"])
    with pytest.raises(ConfigError, match="tensorboard=false but trackers= lists tensorboard"):
        load_config(["tensorboard=false", "trackers=[tensorboard]"])
