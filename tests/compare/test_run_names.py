"""What a compare calls a config file given as a strategy and where its run writes: labels by
file name that tell two files apart, folders safe on any file system that never meet, and a
configuration identity that holds every file the strategy reads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from configs.schema import ConfigError
from harness.compare.compare_cli import Sweep
from harness.compare.compare_config import load_compare_config, train_options
from harness.compare.identity import differences
from harness.compare.progress import SweepProgress
from harness.compare.run_names import RunName, run_names, safe_name
from strategies.registry import default_registry

needs_backends = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("accelerate", "deepspeed")),
    reason="needs accelerate and deepspeed",
)

DDP_YAML = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: 'no'\nnum_processes: 2\n"
ZERO2 = {"zero_optimization": {"stage": 2}, "train_batch_size": "auto"}


def file(folder: Path, name: str, content: str | dict) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content) if isinstance(content, dict) else content)
    return path


@needs_backends
def test_a_file_is_labelled_by_its_name_and_runs_in_a_folder_of_its_own(tmp_path):
    mine = file(tmp_path, "configs/mine.yaml", DDP_YAML)
    names = ["single", f"accelerate:{mine}", f"deepspeed:{file(tmp_path, 'ds.json', ZERO2)}"]
    assert run_names(names, default_registry()) == {
        "single": RunName("single", "single"),
        names[1]: RunName("mine.yaml", "accelerate-mine.yaml"),
        names[2]: RunName("ds.json", "deepspeed-ds.json"),
    }


@needs_backends
def test_two_files_of_one_name_are_told_apart_by_their_folders(tmp_path):
    names = [f"accelerate:{file(tmp_path, f'{team}/mine.yaml', DDP_YAML)}" for team in ("a", "b")]
    shown = run_names(names, default_registry())
    assert [shown[n].label for n in names] == ["a/mine.yaml", "b/mine.yaml"]
    assert [shown[n].folder for n in names] == ["accelerate-a-mine.yaml", "accelerate-b-mine.yaml"]


@needs_backends
def test_a_file_named_like_a_strategy_or_its_folder_does_not_collide(tmp_path):
    # A DeepSpeed JSON named `zero2` beside the built-in zero2: the kind tells the labels apart.
    json_file = file(tmp_path, "zero2", ZERO2)
    assert run_names(["zero2", f"deepspeed:{json_file}"], default_registry())[f"deepspeed:{json_file}"] == RunName(
        "deepspeed:zero2", "deepspeed-deepspeed-zero2"
    )
    # a/mine.yaml and a file named a-mine.yaml would both write to accelerate-a-mine.yaml: a hash parts them.
    names = [f"accelerate:{file(tmp_path, name, DDP_YAML)}" for name in ("a/mine.yaml", "b/mine.yaml", "a-mine.yaml")]
    folders = [shown.folder for shown in run_names(names, default_registry()).values()]
    assert folders[:2] == ["accelerate-a-mine.yaml", "accelerate-b-mine.yaml"]
    assert folders[2].startswith("accelerate-a-mine.yaml-") and safe_name(folders[2]) == folders[2]


@needs_backends
def test_the_same_file_twice_is_refused(tmp_path):
    mine = file(tmp_path, "mine.yaml", DDP_YAML)
    with pytest.raises(ConfigError, match="twice"):
        run_names([f"accelerate:{mine}", f"accelerate:{tmp_path}/./mine.yaml"], default_registry())


@needs_backends
def test_the_identity_holds_the_file_and_the_deepspeed_json_it_names(tmp_path):
    json_file = file(tmp_path, "ds.json", ZERO2)
    accelerate = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": str(json_file)},
        "num_processes": 2,
    }
    name = f"accelerate:{file(tmp_path, 'mine.json', accelerate)}"
    cfg = load_compare_config([f"strategies=[single,{name}]", "device=cpu", f"out_dir={tmp_path / 'out'}"])
    shown = run_names(cfg.strategies, default_registry())
    sweep = Sweep(cfg, train_options(cfg, []), tmp_path / "out", 2, SweepProgress([], 1), "cpu", shown)
    before = sweep.planned_run(name, {})
    assert (before.label, before.run_dir.name) == ("mine.json", "accelerate-mine.json")
    file(tmp_path, "ds.json", {**ZERO2, "zero_optimization": {"stage": 2, "overlap_comm": True}})
    changed = [line.split(" was ")[0] for line in differences(before.identity, sweep.planned_run(name, {}).identity)]
    assert changed == ["file.strategy.deepspeed_config.deepspeed_config_file"]
