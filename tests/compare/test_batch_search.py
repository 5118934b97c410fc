"""The batch search: its probe order on a fake memory limit, the planner's predicted start,
out-of-memory recovery in one process (CPU, the limit faked by PARABENCH_TEST_MEMORY_LIMIT),
and the fall-back to a process per probe where a backend does not recover or leaks.

The backends that do not recover are test plugins registered through the
`parabench.strategies` entry-point group, as a third-party package would register them.
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from configs.schema import RunConfig
from harness.compare import batch_search
from harness.compare.batch_search import ERROR, FITS, OOM, Probe, Search, next_size
from harness.compare.supervise import JobOutcome
from harness.plan.for_run import question_for_run
from harness.plan.memory.batch_limit import SEARCH_FRACTION, largest_micro_batch
from harness.plan.predict import plan_strategy
from tests.helpers import NANO, ROOT, env_for_tests, run_cli


def probe_order(limit: int, start: int, crash_at: int | None = None) -> list[Probe]:
    """The probes the search makes against a device where sizes up to `limit` fit."""
    probes: list[Probe] = []
    while (size := next_size(probes, start)) is not None:
        result = ERROR if size == crash_at else FITS if size <= limit else OOM
        probes.append(Probe(size, result, new_process=False, error="segfault" if result == ERROR else None))
        assert len(probes) < 40, [p.micro_batch for p in probes]
    return probes


def answer(probes: list[Probe], start: int) -> dict:
    return Search("x", 1, start, 60.0, True, start=start, probes=probes).as_result()


def test_an_exact_prediction_takes_two_probes():
    probes = probe_order(limit=37, start=37)
    assert [(p.micro_batch, p.result) for p in probes] == [(37, FITS), (38, OOM)]
    found = answer(probes, 37)
    assert found["largest_micro_batch"] == 37 and found["next_size_failed"] == 38 and not found["hit_limit"]


@pytest.mark.parametrize("start", [1, 30, 36, 38, 41, 90, 5000])
def test_a_prediction_off_either_way_still_finds_the_exact_limit(start):
    probes = probe_order(limit=37, start=start)
    found = answer(probes, start)
    assert found["largest_micro_batch"] == 37 and found["next_size_failed"] == 38  # the next size up seen to fail
    assert probes[0].micro_batch == min(start, batch_search.MAX_MICRO_BATCH)
    # Geometric steps away from the start, then bisection: about two probes per doubling of the error.
    assert len(probes) <= 2 * max(1, abs(start - 37)).bit_length() + 2


def test_the_order_grows_and_shrinks_by_powers_of_two_from_the_start():
    assert [p.micro_batch for p in probe_order(limit=100, start=20)][:6] == [20, 21, 22, 24, 28, 36]
    assert [p.micro_batch for p in probe_order(limit=5, start=40)][:6] == [40, 39, 38, 36, 32, 24]


def test_a_crash_ends_the_search_with_its_error():
    probes = probe_order(limit=37, start=30, crash_at=32)
    assert [p.micro_batch for p in probes] == [30, 31, 32]
    found = answer(probes, 30)
    assert found["largest_micro_batch"] == 31 and found["next_size_failed"] is None
    assert found["error"] == "micro_batch=32: segfault"


def test_the_search_limit_and_nothing_fitting():
    everything = [Probe(size, FITS, False) for size in (1, 2, 3, 5, 8)]
    assert next_size(everything, start=1, limit=8) is None
    assert Search("x", 1, 1, 60.0, True, limit=8, start=1, probes=everything).as_result()["hit_limit"]
    nothing = probe_order(limit=0, start=3)
    assert [p.micro_batch for p in nothing] == [3, 2, 1]
    found = answer(nothing, 3)
    assert found["largest_micro_batch"] is None and found["next_size_failed"] == 1


class FakeJobs:
    """Stands in for `runner.py probe` jobs: each call plays one job against the search file."""

    def __init__(self, path: Path, limit: int, die_in_process_at: int | None = None):
        self.path, self.limit, self.die_in_process_at = path, limit, die_in_process_at
        self.jobs: list[list[int]] = []  # the sizes each job probed (or died at)

    def __call__(self) -> JobOutcome:
        search = batch_search.load(self.path)
        search.start = search.start or 20  # the first job's prediction
        self.jobs.append([])
        outcome = JobOutcome(0, None, "exited 0", wall_time_s=9.0)
        while (size := search.next_size()) is not None:
            self.jobs[-1].append(size)
            first = len(self.jobs[-1]) == 1
            if size == self.die_in_process_at and not first:
                outcome = JobOutcome(-9, "signal", "a process was killed by SIGKILL (signal 9)", wall_time_s=9.0)
                break
            if size > self.limit and not search.in_process:  # one probe per job: its OOM ends the job
                outcome = JobOutcome(1, "oom", "torch.OutOfMemoryError: CUDA out of memory", wall_time_s=9.0)
                break
            search.probes.append(Probe(size, FITS if size <= self.limit else OOM, first, 1.0))
            if not search.in_process:
                break
        batch_search.save(self.path, search)
        return outcome


def test_a_job_that_dies_while_probing_in_process_hands_over_to_a_process_per_probe(tmp_path):
    path = tmp_path / batch_search.SEARCH_FILE
    jobs = FakeJobs(path, limit=22, die_in_process_at=22)
    found = batch_search.search(path, Search("single", 1, 8, 60.0, in_process=True), jobs)
    # 20 and 21 fitted in one process, which died at 22; 22 again and the rest in a process each.
    assert jobs.jobs == [[20, 21, 22], [22], [24], [23]]
    assert [(p.micro_batch, p.result, p.new_process) for p in found.probes] == [
        (20, FITS, True),
        (21, FITS, False),
        (22, FITS, True),
        (24, OOM, True),
        (23, OOM, True),
    ]
    assert "died at micro-batch 22 (signal" in found.note and not found.in_process
    assert found.probes[-1].error == "torch.OutOfMemoryError: CUDA out of memory"  # the job's OOM, as classified
    result = found.as_result()
    assert result["largest_micro_batch"] == 22 and result["next_size_failed"] == 23 and result["jobs"] == 4
    assert result["wall_time_s"] is not None and json.loads(path.read_text())["jobs"] == 4


def test_a_job_that_fails_before_its_first_probe_ends_the_search(tmp_path):
    path = tmp_path / batch_search.SEARCH_FILE
    crash = JobOutcome(1, "crash", "exited with code 1: ImportError: no deepspeed", wall_time_s=2.0)
    found = batch_search.search(path, Search("zero1", 1, 8, 60.0, in_process=False), lambda: crash)
    assert found.error == "the probe job failed before its first probe: exited with code 1: ImportError: no deepspeed"
    assert found.probes == [] and found.jobs == 1


def test_ctrl_c_during_a_probe_job_stops_the_search(tmp_path):
    interrupted = JobOutcome(None, "interrupted", "stopped by Ctrl-C")
    with pytest.raises(KeyboardInterrupt):
        batch_search.search(tmp_path / "search.json", Search("single", 1, 8, 60.0, True), lambda: interrupted)


def test_the_planner_predicts_the_largest_micro_batch_within_the_usable_memory():
    cfg = RunConfig(model="gpt2-124m", precision="bf16", seq_len=1024, batch_size=16)
    memory = 80e9
    question = question_for_run(cfg, 1, 1, memory)

    def peak(name: str, micro_batch: int) -> int:
        return plan_strategy(name, replace(question, micro_batch=micro_batch, grad_accum=1)).peak_bytes

    for name in ("single", "zero3"):
        largest = largest_micro_batch(name, question, limit=4096)
        assert peak(name, largest) <= SEARCH_FRACTION * memory < peak(name, largest + 1), name
    assert largest_micro_batch("single", question, limit=16) == 16
    assert largest_micro_batch("single", replace(question, capacity_bytes=1e9), limit=4096) == 0
    assert largest_micro_batch("no-such-backend", question, limit=4096) is None


def start_search(folder: Path, fallback_start: int) -> Path:
    folder.mkdir(parents=True)
    path = folder / batch_search.SEARCH_FILE
    batch_search.save(path, Search("single", 1, fallback_start, job_time_s=120.0, in_process=True))
    return path


def test_one_process_survives_out_of_memory_frees_it_and_finds_the_limit(tmp_path):
    path = start_search(tmp_path / "search", fallback_start=2)
    env = env_for_tests(PARABENCH_TEST_MEMORY_LIMIT="5")
    proc = run_cli(["probe", "strategy=single", f"out_dir={path.parent}", *NANO], env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    search = batch_search.load(path)
    assert search.prediction_note == "no device memory to predict against on a CPU" and search.start == 2
    # All in one process: 6 ran out of memory (its second step's forward), and 5 was tried after it there.
    assert [(p.micro_batch, p.result, p.new_process) for p in search.probes] == [
        (2, FITS, True),
        (3, FITS, False),
        (4, FITS, False),
        (6, OOM, False),
        (5, FITS, False),
    ]
    assert "PARABENCH_TEST_MEMORY_LIMIT=5, micro-batch 6" in search.probes[3].error
    # After each probe the job checks that its model, strategy and optimizer are gone: it would have
    # stopped probing in this process (and said why) had the failed probe's outlived the clean-up.
    assert search.in_process and search.note is None
    assert all(p.tokens_per_s > 0 for p in search.probes if p.result == FITS)
    assert (path.parent / "micro_batch_5" / "metrics.jsonl").is_file()
    result = search.as_result()
    assert result["largest_micro_batch"] == 5 and result["next_size_failed"] == 6


PLUGIN_MODULE = """
from strategies.single import SingleDeviceStrategy

KEPT = []

class Leaks(SingleDeviceStrategy):
    description = "test plugin: claims to recover from out-of-memory but keeps every model it set up"
    def setup(self, model, optimizer_factory):
        KEPT.append(model)
        return super().setup(model, optimizer_factory)

class NoRecovery(SingleDeviceStrategy):
    description = "test plugin: does not recover from out-of-memory in one process"
    @classmethod
    def recovers_from_oom(cls, options):
        return False
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    dist = site / "parabench_oom_plugins-1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "parabench_oom_plugins.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: parabench-oom-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[parabench.strategies]\nleaks = parabench_oom_plugins:Leaks\nno-recovery = parabench_oom_plugins:NoRecovery\n"
    )
    env = env_for_tests(PARABENCH_TEST_MEMORY_LIMIT="7")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site)])
    return env


# Two ways into a process per probe, each a compare of its own: a strategy whose model outlives its
# teardown (caught after the first probe, on every change) and one that says it cannot recover in one
# process (its out-of-memory ends the job and compare reads the kind from its log; under --all).
FALLBACKS = ["leaks", pytest.param("no-recovery", marks=pytest.mark.extended)]


@pytest.mark.slow
@pytest.mark.parametrize("name", FALLBACKS)
def test_compare_falls_back_to_a_process_per_probe_and_reports_the_search(tmp_path, plugin_env, name):
    out = tmp_path / "compare"
    proc = run_cli(
        [
            "compare",
            f"strategies=[{name}]",
            "nproc=1",
            "noise_runs=0",
            "batch_search=true",
            "timeout_s=60",
            f"out_dir={out}",
            *NANO,
        ],
        env=plugin_env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    found = {s["strategy"]: s for s in doc["batch_search"]["results"]}[name]
    # From the compare's micro-batch 8, against the faked limit 7.
    assert [(p["micro_batch"], p["result"], p["new_process"]) for p in found["probes"]] == [
        (8, OOM, True),
        (7, FITS, True),
    ]
    assert found["largest_micro_batch"] == 7 and found["next_size_failed"] == 8
    assert found["jobs"] == 2 and found["wall_time_s"] > 0
    if name == "leaks":  # caught after the first probe, which ran in one process and recorded its own OOM
        assert found["note"] == "the model of the last probe outlived its teardown: a process per probe from there"
    else:  # without recovery the OOM ended the job, and compare read the kind from its log
        assert "does not recover" in found["note"]
        assert "OutOfMemoryError" in found["probes"][0]["error"]
    assert (out / "batch_search" / name / "job_1.log").is_file()
    assert doc["batch_search"]["wall_time_s"] >= found["wall_time_s"]
    report = (out / "report.md").read_text().split("## Largest micro-batch per strategy")[1].split("## ")[0]
    assert f"| `{name}` | n/a | 7 | 8 ✗ | [8 ✗] [7 ✓] |" in report
