"""How `nproc=N` starts its workers (harness/train/launch.py): on a CPU forked from the launching
process, on a GPU as new interpreters through torchrun. Both are run here on the CPU (the second
through run_under_torchrun directly) and must train the same curve, bit for bit. A worker's
failure under the forked path is tests/train/test_faults.py's."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.helpers import NANO, ROOT, env_for_tests, losses_by_step, run_bounded, run_cli, trained_once
from tests.train.test_checkpoint import straight_run

pytestmark = pytest.mark.timeout(300)

ARGS = ["train", "strategy=ddp", *NANO]


def _new_interpreters(args: list[str]):
    """`runner.py <args>` with its workers started as new interpreters (the GPU path)."""
    code = (
        "import sys; from harness.train.launch import run_under_torchrun; "
        f"sys.exit(run_under_torchrun(2, {args!r}, fork_workers=False))"
    )
    return run_bounded([sys.executable, "-c", code], timeout=240, env=env_for_tests(), cwd=ROOT)


def test_forked_and_new_interpreter_workers_train_the_same_curve(tmp_path, tmp_path_factory):
    # `train strategy=ddp nproc=2` on NANO, as tests/strategies/test_equivalence_torch.py holds it to
    # single: trained once a session for both.
    forked = trained_once(tmp_path_factory.getbasetemp(), "ddp", nproc=2)
    (tmp_path / "spawned").mkdir()  # the preflight, which runs before either, makes it
    spawned = _new_interpreters([*ARGS, f"out_dir={tmp_path / 'spawned'}"])
    assert spawned.returncode == 0, spawned.stderr[-3000:]
    assert losses_by_step(forked) == losses_by_step(tmp_path / "spawned")
    assert "step    10 | loss" in (forked / "stdout.txt").read_text() and "step    10 | loss" in spawned.stdout


def test_a_one_line_error_every_worker_meets_is_printed_once(tmp_path, tmp_path_factory):
    """A damaged checkpoint is found by the workers (rank 0 verifies it, every rank stops with its
    line): the launcher prints that line once and exits 2, without torchrun's failure table."""
    # A copy of a two-rank ddp checkpoint that tests/train/test_checkpoint.py trains once a session.
    checkpoint = tmp_path / "step_10"
    shutil.copytree(straight_run("ddp", tmp_path_factory.getbasetemp()) / "checkpoints" / "step_10", checkpoint)
    model = checkpoint / "state" / "model.pt"
    model.write_bytes(model.read_bytes()[:100])
    again = run_cli(
        [*ARGS, "nproc=2", "steps=20", "checkpoint_every=10", f"out_dir={tmp_path / 'run'}", f"resume={checkpoint}"],
        timeout=240,
    )
    assert again.returncode == 2, again.stderr[-3000:]
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"parabench: error: checkpoint {checkpoint} is damaged"), lines


def test_resume_given_as_a_boolean_is_one_line_before_any_worker_starts(tmp_path):
    proc = run_cli([*ARGS, "nproc=2", f"out_dir={tmp_path}", "resume=true"], timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "parabench: error: resume=True: give resume=auto (the newest intact checkpoint under out_dir) or a "
        "checkpoint folder such as runs/x/checkpoints/step_20"
    ]


def test_an_error_rank_0_meets_alone_is_its_one_line_not_its_peers_failure(tmp_path):
    """MLflow starts on rank 0 only: its error stops rank 0, and rank 1 then loses its peer in the
    next collective. The line is the cause; rank 1's lost connection and the failure table are not."""
    pytest.importorskip("mlflow")
    proc = run_cli(
        [*ARGS, "nproc=2", "steps=2", "trackers=[mlflow]", "tracker_uri=bogus://x", f"out_dir={tmp_path}"], timeout=240
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parabench: error: MLflow could not start a run at bogus://x"), lines


def test_an_nproc_the_launcher_did_not_start_is_one_line_not_dropped(tmp_path):
    """Under a launcher (its RANK and WORLD_SIZE: torchrun --nproc_per_node=2) nproc=4 was dropped
    without a word and the run laid out for 2; it is refused before the run starts, and an nproc= that
    names the launcher's world (as parabench's own jobs pass it) or this node's processes runs."""
    from harness.train.distributed import check_nproc_under_launcher

    launched = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    proc = run_cli([*ARGS, "nproc=4", f"out_dir={tmp_path / 'run'}"], timeout=120, env={**env_for_tests(), **launched})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "parabench: error: nproc=4, but the launcher started 2 processes: nproc= starts processes only where no "
        "launcher did; drop it, or have the launcher start 4 (torchrun --nproc_per_node=4)"
    ]
    assert not (tmp_path / "run").exists()
    for nproc in (None, 2):
        check_nproc_under_launcher(nproc, launched)
    two_nodes = {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_SIZE": "8"}  # the deepspeed launcher's names
    for nproc in (8, 16):
        check_nproc_under_launcher(nproc, two_nodes)
