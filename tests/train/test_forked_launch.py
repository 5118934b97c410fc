"""The forked launch's own guards (harness/train/fork_gate.py, harness/train/join_watch.py), through
tests/forked_torchrun.py and runner.py's own launch: no worker starts before its launch's last fork,
and a rank that never joins its process group ends in seconds with its stacks, the launch made again
once."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import FORKED_TORCHRUN, NANO, ROOT, env_for_tests, losses_by_step, run_bounded

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).parent
# A healthy launch joins in about a second, on a loaded CPU too: 5 s where the launch made again must join;
# 1 s where no launch ever does (only the stuck rank's wait is bounded).
JOINS_WITHIN_S, NEVER_JOINS_WITHIN_S = 5, 1
# What the launcher says of a launch whose process group did not form; the stuck rank's stack names
# the function it blocked in.
NOT_FORMED = "forked_torchrun: the process group did not form within {} s of the ranks' start"
RUNNER_NOT_FORMED = "parabench: the process group did not form within {} s of the ranks' start"
STUCK_IN = "in _block_forever"
# The launcher's heading over each rank's stacks, which it prints rank by rank.
STACKS_OF = re.compile(r"^rank (\d+), outside its process group [\d.]+ s after its start:$", re.MULTILINE)


def _stuck_ranks(stderr: str) -> list[int]:
    """The ranks whose stacks, as the launcher printed them, show the block."""
    parts = STACKS_OF.split(stderr)  # [before, rank, stacks, rank, stacks, ...]
    return [int(rank) for rank, stacks in zip(parts[1::2], parts[2::2], strict=True) if STUCK_IN in stacks]


def test_no_worker_starts_before_its_launchs_last_fork(tmp_path):
    log = tmp_path / "order.txt"
    proc = run_bounded(
        [sys.executable, FORKED_TORCHRUN, "2", str(HERE / "fork_order_worker.py")],
        timeout=120,
        env=env_for_tests(FORK_ORDER_LOG=str(log)),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert log.read_text().split() == ["forking", "forking", "started", "started"]


def _never_joins(folder: Path, launches: int, within_s: int):
    cmd = [sys.executable, FORKED_TORCHRUN, f"--join-within={within_s}", "2", str(HERE / "never_joins_worker.py")]
    return run_bounded([*cmd, str(folder), str(launches)], timeout=90, env=env_for_tests(), cwd=ROOT)


def test_a_rank_that_never_joins_ends_in_seconds_and_the_launch_is_made_again(tmp_path):
    proc = _never_joins(tmp_path, launches=1, within_s=JOINS_WITHIN_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "joined").exists()
    assert proc.stderr.count(NOT_FORMED.format(JOINS_WITHIN_S)) == 1
    assert _stuck_ranks(proc.stderr) == [1], proc.stderr[-3000:]


@pytest.mark.extended  # the runner's own launch fails so on every change, through the same function
def test_a_rank_that_never_joins_again_fails_the_launch_in_seconds(tmp_path):
    proc = _never_joins(tmp_path, launches=2, within_s=NEVER_JOINS_WITHIN_S)
    assert proc.returncode != 0
    assert not (tmp_path / "joined").exists()
    assert proc.stderr.count(NOT_FORMED.format(NEVER_JOINS_WITHIN_S)) == 1
    assert _stuck_ranks(proc.stderr) == [1, 1], proc.stderr[-3000:]


def _runner_never_joins(folder: Path, launches: int, within_s: int):
    """`runner.py train nproc=2` on NANO, rank 1 of its first `launches` launches blocked before it joins."""
    script = str(HERE / "runner_never_joins.py")
    args = ["train", "strategy=ddp", "nproc=2", f"out_dir={folder / 'run'}", *NANO]
    return run_bounded(
        [sys.executable, script, str(folder), str(launches), str(within_s), *args],
        timeout=180,
        env=env_for_tests(),
        cwd=ROOT,
    )


def test_the_runners_own_launch_is_made_again_where_a_rank_never_joined(tmp_path):
    proc = _runner_never_joins(tmp_path, launches=1, within_s=JOINS_WITHIN_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(RUNNER_NOT_FORMED.format(JOINS_WITHIN_S)) == 1
    assert _stuck_ranks(proc.stderr) == [1], proc.stderr[-3000:]
    assert max(losses_by_step(tmp_path / "run")) == 10  # the whole run, trained by the second launch


def test_the_runners_launch_that_never_forms_twice_ends_with_one_line(tmp_path):
    proc = _runner_never_joins(tmp_path, launches=2, within_s=NEVER_JOINS_WITHIN_S)
    assert proc.returncode == 1
    assert proc.stderr.count(RUNNER_NOT_FORMED.format(NEVER_JOINS_WITHIN_S)) == 1
    assert _stuck_ranks(proc.stderr) == [1, 1], proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parabench: error: a worker was still outside its process group"), last
