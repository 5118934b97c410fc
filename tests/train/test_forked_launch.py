"""The forked launch's own guards (harness/train/fork_gate.py), through tests/forked_torchrun.py: no
worker starts before its launch's last fork."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import FORKED_TORCHRUN, ROOT, env_for_tests, run_bounded

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).parent


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
