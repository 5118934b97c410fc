"""Surviving faults: a rank SIGKILLed, a job restarted by torchrun, a rank that hangs.

The kill is deterministic: `PARABENCH_TEST_FAULT=kill@<rank>:<step>` makes that rank
SIGKILL itself once step <step> (and its checkpoint) is done. Every curve is held to
the uninterrupted run's loss at every step, bit for bit: the same weights, optimizer
state, generators, data position (the step) and learning rate (a function of the step)
give the same floating-point operations in the same order.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.common.testing_hooks import FAULT_ENV
from harness.train.distributed import free_port, restart_hazard
from tests.helpers import NANO, RUNNER, env_for_tests
from tests.train.test_checkpoint import STRATEGIES, launch, log, losses, straight_run

PG_TIMEOUT_S = 5


def _last_rank(strategy: str) -> int:
    return 0 if strategy == "single" else 1


# Each path once where a second strategy adds no new one: a kill then resume=auto under fsdp (its DCP
# checkpoint; ddp's is single's format, which single's own run covers), torchrun's restart under ddp.
# On every change: fsdp's kill (DCP) and ddp's restart (the torch format, resumed by torchrun's
# restart); single's kill and restart, the same format under one process, are `extended`.
KILLED = [pytest.param(s, marks=pytest.mark.extended) if s == "single" else s for s in STRATEGIES if s != "ddp"]
RESTARTED = [pytest.param(s, marks=pytest.mark.extended) if s == "single" else s for s in STRATEGIES if s != "fsdp"]


@pytest.mark.parametrize("strategy", KILLED)
def test_killed_rank_fails_the_job_and_a_resume_matches_the_uninterrupted_run(strategy, tmp_path_factory, tmp_path):
    reference = losses(straight_run(strategy, tmp_path_factory.getbasetemp()))
    out = tmp_path / "killed"
    killed = launch(strategy, out, fault=f"kill@{_last_rank(strategy)}:10")
    # Under torchrun the agent stops the other rank and exits 1; alone, the process dies of SIGKILL.
    assert killed.returncode != 0, log(killed)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_10"]

    resumed = launch(strategy, out, "resume=auto")
    assert resumed.returncode == 0, log(resumed)
    assert "resumed at step 10" in resumed.stdout
    assert losses(out) == reference


@pytest.mark.parametrize("strategy", RESTARTED)
def test_torchrun_restarts_the_job_and_it_resumes_by_itself(strategy, tmp_path_factory, tmp_path):
    reference = losses(straight_run(strategy, tmp_path_factory.getbasetemp()))
    out = tmp_path / "restarted"
    # Killed at step 13, between the checkpoints of steps 10 and 15: steps 11-13 are redone.
    proc = launch(
        strategy, out, "resume=auto", "checkpoint_every=5", fault=f"kill@{_last_rank(strategy)}:13", restarts=1
    )
    assert proc.returncode == 0, log(proc)
    assert "starting at step 0" in proc.stdout and "resumed at step 10" in proc.stdout
    assert "pytorch#135712" not in proc.stdout + proc.stderr  # the store is not shared: no warning
    assert losses(out) == reference


def test_a_restartable_job_on_torchruns_shared_store_is_warned_about(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restart_hazard()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert restart_hazard() is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert restart_hazard() is None


def test_a_hung_rank_fails_the_job_after_the_process_group_timeout(tmp_path):
    """No launcher watching: only the process-group timeout stops rank 0 waiting for rank 1."""
    env = env_for_tests(**{FAULT_ENV: "hang@1:3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    args = ["train", "strategy=ddp", f"out_dir={tmp_path}", *NANO, f"pg_timeout_s={PG_TIMEOUT_S}"]
    ranks = [
        subprocess.Popen(
            [sys.executable, RUNNER, *args],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        started = time.monotonic()
        _, err = ranks[0].communicate(timeout=120)
        waited = time.monotonic() - started
        assert ranks[0].returncode != 0, err[-3000:]
        assert f"Timed out waiting {PG_TIMEOUT_S * 1000}ms" in err, err[-3000:]
        assert ranks[1].poll() is None  # still hung: rank 0 gave up on its own
        assert waited < 90, f"rank 0 took {waited:.0f}s to give up"
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate()
