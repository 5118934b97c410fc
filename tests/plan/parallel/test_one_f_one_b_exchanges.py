"""The 1F1B steady state the planner prices (`Pipeline.steady_exchange_wait`: the first and the last
GPU wait on one exchange a micro-batch, a GPU between two others on two, each exchange a send and a
receive with one neighbour), held against torch's Schedule1F1B on three gloo ranks
(one_f_one_b_exchanges_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.plan.parallel.pipeline_cost import Pipeline
from tests.helpers import ROOT, env_for_tests, forked_torchrun, run_bounded

pytestmark = [pytest.mark.extended, pytest.mark.timeout(240)]
STAGES = 3
PAIRED = ("fwd_send_bwd_recv", "bwd_send_fwd_recv")  # the steady state's two waits a micro-batch


def _planned_exchanges(rank: int) -> int:
    """The exchanges the planner charges GPU `rank` (of three: the first, the one between, the last) a
    micro-batch: its wait when it alone computes, and so sets the pace."""
    seconds = [0.0, 0.0, 0.0]
    seconds[rank] = 1.0
    return round(Pipeline(STAGES, 6, "1f1b").steady_exchange_wait(tuple(seconds), 1e-3) / 1e-3)


def test_torchs_1f1b_waits_on_one_exchange_at_the_ends_and_two_between(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    worker = ROOT / "tests" / "plan" / "parallel" / "one_f_one_b_exchanges_worker.py"
    proc = run_bounded(forked_torchrun(STAGES, worker, str(out)), timeout=180, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    for rank in range(STAGES):
        calls = json.loads(Path(f"{out}.rank{rank}").read_text())
        # Each steady-state wait is one send and one receive with a neighbour, or nothing at an end.
        assert {n for d in PAIRED for n in calls[d]} <= {0, 2}, (rank, calls)
        exchanging = [d for d in PAIRED if all(n == 2 for n in calls[d])]
        idle = [d for d in PAIRED if all(n == 0 for n in calls[d])]
        assert len(exchanging) + len(idle) == 2, (rank, calls)
        assert len(exchanging) == _planned_exchanges(rank), (rank, calls)
