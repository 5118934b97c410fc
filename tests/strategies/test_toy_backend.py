"""A backend added as one file (tests/strategies/toy_backend.py, loaded through PARABENCH_PLUGINS)
appears in `runner.py list`, runs in `runner.py compare` beside `single` and matches it, is planned
by `runner.py plan` and appears in the report. One compare, shared by the checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from strategies.registry import PLUGINS_ENV, default_registry
from tests.helpers import NANO, env_for_tests, run_cli
from tests.strategies.toy_backend import NAME, ToyAllReduceStrategy

MODULE = "tests.strategies.toy_backend"


@pytest.fixture(scope="module")
def plugin_env() -> dict[str, str]:
    return env_for_tests(**{PLUGINS_ENV: MODULE})


@pytest.fixture(scope="module")
def compared(tmp_path_factory, plugin_env) -> Path:
    out = tmp_path_factory.mktemp("toy-compare")
    # noise_runs=0: one fp32 run each; the verdict is then the fixed fp32 tolerance.
    args = ["compare", f"strategies=[single,{NAME}]", *NANO, "noise_runs=0", "nproc=2", f"out_dir={out}"]
    proc = run_cli(args, env=plugin_env, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out


def test_listed_with_its_description(plugin_env):
    proc = run_cli(["list"], env=plugin_env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.split()[:1] == [NAME])
    assert ToyAllReduceStrategy.description in line and line.endswith("[available]")


def test_not_there_without_the_plugin_variable():
    assert PLUGINS_ENV not in os.environ and NAME not in default_registry().names()


def test_compared_beside_single_on_two_processes_and_matches(compared):
    results = json.loads((compared / "results.json").read_text())
    toy = next(r for r in results["strategies"] if r["name"] == NAME)
    assert (toy["status"], toy["nproc"], toy["steps_done"]) == ("ok", 2, 10)
    assert toy["verdict_kind"] == "matches", toy["verdict"]
    assert toy["max_rel_loss_diff"] < 1e-5  # fp32: only the order of the sums differs
    # The planner's prediction, from the class's PlanModel, is recorded beside what it measured.
    assert toy["prediction"]["mem_params_bytes"] == toy["mem_params_bytes"]


def test_in_the_report(compared):
    report = (compared / "report.md").read_text()
    summary_rows = [line for line in report.splitlines() if line.startswith(f"| `{NAME}` |")]
    assert summary_rows and "matches (max rel. diff" in summary_rows[0]
    assert f"<td><code>{NAME}</code></td>" in (compared / "report.html").read_text()


def test_planned(plugin_env):
    proc = run_cli(["plan", "model=gpt-nano", "gpus=2", "micro_batch=4"], env=plugin_env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.split()[:1] == [NAME])
    ddp = next(line for line in proc.stdout.splitlines() if line.split()[:1] == ["ddp"])
    # A full replica per GPU, as ddp: the same model states (params, grads, optimizer).
    assert row.split()[1:4] == ddp.split()[1:4]
