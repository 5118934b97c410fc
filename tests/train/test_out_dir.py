"""An out_dir that cannot be created or written is one line and exit 2 before any process
starts, for `train` (in this process or under torchrun), `compare` and `report`; so is one that
holds a finished run, for a `train` that would write over it."""

from __future__ import annotations

import pytest

from harness.common.writable import FolderError, check_writable
from tests.helpers import NANO, run_cli

FORBIDDEN = "/proc/forbidden"  # /proc takes no new entries, even from root


@pytest.mark.parametrize(
    "args",
    [
        ["train", "strategy=single", *NANO],
        ["train", "strategy=ddp", "nproc=2", *NANO],
        ["compare", "strategies=[single,ddp]", *NANO],
    ],
    ids=["train", "train-nproc2", "compare"],
)
def test_unwritable_out_dir_is_one_line_before_any_process(args):
    proc = run_cli([*args, f"out_dir={FORBIDDEN}"], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("parabench: error: "), proc.stderr
    assert f"out_dir={FORBIDDEN} cannot be created" in proc.stderr and "choose a folder" in proc.stderr
    assert proc.stdout == ""  # nothing started: no header, no progress


def test_a_file_in_the_way_and_the_report_folder(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(FolderError, match="is a file, not a folder"):
        check_writable(tmp_path / "taken")
    with pytest.raises(FolderError, match="a part of the path is a file"):
        check_writable(tmp_path / "taken" / "run")
    proc = run_cli(["report", "/proc"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "the compare folder /proc cannot be written" in proc.stderr


def test_a_writable_folder_is_made_and_left_clean(tmp_path):
    folder = check_writable(tmp_path / "a" / "b")
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_finished_runs_out_dir_is_refused_and_left_as_it_was(tmp_path):
    """A fresh run would write its metrics.jsonl and summary.json over the earlier run's."""
    earlier = {"metrics.jsonl": '{"step": 1, "loss": 4.2}\n', "summary.json": '{"steps": 1}\n', "log.txt": "earlier\n"}
    for name, text in earlier.items():
        (tmp_path / name).write_text(text)
    proc = run_cli(["train", "strategy=single", *NANO, "steps=1", f"out_dir={tmp_path}"], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("parabench: error: "), proc.stderr
    assert f"{tmp_path} already holds a finished run (summary.json" in proc.stderr
    assert "give a fresh out_dir" in proc.stderr and "remove the folder" in proc.stderr
    assert proc.stdout == ""  # nothing started
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == earlier


def test_a_run_its_checks_stop_leaves_no_folder_it_made(tmp_path):
    """The default out_dir under the working directory, or a new one given, is made to try it; a model the
    checks then refuse takes it away again, and an out_dir that was there stays."""
    proc = run_cli(["train", "model=gpt-huge", "steps=1"], timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "unknown model 'gpt-huge'" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    given = tmp_path / "new" / "run"
    assert run_cli(["train", "model=gpt-huge", f"out_dir={given}"], timeout=60).returncode == 2
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    assert run_cli(["train", "model=gpt-huge", f"out_dir={tmp_path / 'kept'}"], timeout=60).returncode == 2
    assert (tmp_path / "kept").is_dir()


def test_a_checkpoint_or_checkpoints_folder_as_out_dir_is_refused_and_left_intact(tmp_path, tmp_path_factory):
    """out_dir= the checkpoint resume= names wrote the run's log.txt into it, after which the checkpoint
    no longer matched its manifest: damaged for this resume and every later one. A checkpoint, or a
    run's checkpoints folder, given as out_dir is one line before the run starts, and left as it was."""
    import shutil

    from tests.train.test_checkpoint import straight_run

    # A copy of the ddp checkpoints tests/train/test_checkpoint.py trains once a session.
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(straight_run("ddp", tmp_path_factory.getbasetemp()) / "checkpoints", checkpoints)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    step = checkpoints / "step_10"
    for out_dir, says in ((step, "is a checkpoint (manifest.json)"), (checkpoints, "is a run's checkpoints folder")):
        args = ["train", "strategy=ddp", "nproc=2", *NANO, "steps=20", f"out_dir={out_dir}", f"resume={step}"]
        proc = run_cli(args, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"parabench: error: out_dir={out_dir} {says}") and proc.stderr.count("\n") == 1
        assert proc.stdout == ""
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    resumed = run_cli(["train", "strategy=ddp", *NANO, "steps=20", f"out_dir={tmp_path / 'run'}", f"resume={step}"])
    assert resumed.returncode == 0 and "resumed at step 10" in resumed.stdout, resumed.stderr[-2000:]
