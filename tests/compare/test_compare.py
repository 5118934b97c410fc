"""`runner.py compare`: failures are results, Ctrl-C still reports, nothing is left
running, and a small real sweep gives matching fp32 verdicts.

Failing strategies come from a test plugin registered through the
`parabench.strategies` entry-point group by a temporary *.dist-info on PYTHONPATH,
exactly as a third-party package would register them.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import runner
from harness.compare import compare_cli as compare
from harness.compare.kernel_oom import OomWatch, available_share, oom_kill_count
from harness.compare.progress import MetricsTail, SweepProgress
from harness.compare.supervise import classify, run_job
from tests.helpers import NANO, ROOT, RUNNER, env_for_tests, run_cli

PLUGIN_MODULE = """
import os, signal, time
from strategies.single import SingleDeviceStrategy

class Raises(SingleDeviceStrategy):
    description = "test plugin: raises in setup"
    def setup(self, model, optimizer_factory):
        raise RuntimeError("deliberate failure from a test plugin")

class KillsItself(SingleDeviceStrategy):
    description = "test plugin: rank 1 SIGKILLs itself"
    def setup(self, model, optimizer_factory):
        if self.ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)

class Hangs(SingleDeviceStrategy):
    description = "test plugin: ignores SIGTERM and never returns"
    def setup(self, model, optimizer_factory):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the SIGKILL that follows can stop it
        open(os.path.join(os.environ["HANG_FLAG_DIR"], f"hanging.{self.ctx.rank}"), "w").close()
        time.sleep(3600)

class GpuOnly(SingleDeviceStrategy):
    description = "test plugin: needs CUDA"
    @classmethod
    def unsupported_reason(cls, device_type, options):
        return None if device_type == "cuda" else "this test plugin needs CUDA"
"""
ENTRY_POINTS = {
    "raises": "Raises",
    "kills-itself": "KillsItself",
    "hangs": "Hangs",
    "gpu-only": "GpuOnly",
}
# Per run: four times and more what the runs that finish take (a one-process NANO run, or a crash
# soon after start-up: 3-4 s each on two idle cores, 5-6 s on two cores loaded twice over), short for a hang.
TIMEOUT_S = 15


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """Environment whose PYTHONPATH holds the failing plugins and their entry points."""
    site = tmp_path / "site"
    (site / "parabench_failing_plugins-1.0.dist-info").mkdir(parents=True)
    (site / "parabench_failing_plugins.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    dist = site / "parabench_failing_plugins-1.0.dist-info"
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: parabench-failing-plugins\nVersion: 1.0\n")
    lines = [f"{name} = parabench_failing_plugins:{cls}" for name, cls in ENTRY_POINTS.items()]
    (dist / "entry_points.txt").write_text("[parabench.strategies]\n" + "\n".join(lines) + "\n")
    env = env_for_tests(HANG_FLAG_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site)])
    return env


def processes_with(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (in their out_dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text().splitlines()
            state = next((line for line in status if line.startswith("State:")), "")
        except OSError:
            continue  # it exited while we looked
        if marker in cmdline and "zombie" not in state:
            found.append(f"{entry.name}: {cmdline}")
    return found


def by_name(out: Path) -> dict[str, dict]:
    doc = json.loads((out / "results.json").read_text())
    return {entry["name"]: entry for entry in doc["strategies"]}


@pytest.mark.slow
def test_failures_are_results_and_nothing_is_left_running(tmp_path, plugin_env):
    marker = f"pbmark{uuid.uuid4().hex[:10]}"
    out = tmp_path / marker
    # The sweep must go on after each failure, the hang included: `single` runs last. (Out-of-memory
    # is recognised from the log's text: test_failure_classification covers it without a run.)
    strategies = "[raises,kills-itself,hangs,gpu-only,single]"
    # noise_runs=0: the failures are what this is about (tests/compare/test_verdict.py runs the noise runs).
    proc = run_cli(
        [
            "compare",
            f"strategies={strategies}",
            "nproc=2",
            f"timeout_s={TIMEOUT_S}",
            "noise_runs=0",
            f"out_dir={out}",
            *NANO,
        ],
        env=plugin_env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = by_name(out)
    assert results["single"]["status"] == "ok" and results["single"]["verdict"] == "reference"
    expected_kinds = {"raises": "crash", "kills-itself": "signal", "hangs": "timeout"}
    assert {n: results[n]["error_kind"] for n in expected_kinds} == expected_kinds
    assert all(results[n]["status"] == "failed" for n in expected_kinds)
    assert "deliberate failure from a test plugin" in results["raises"]["error"]
    assert "SIGKILL" in results["kills-itself"]["error"]
    assert any("deliberate failure" in line for line in results["raises"]["log_tail"])
    assert results["gpu-only"]["status"] == "skipped" and "needs CUDA" in results["gpu-only"]["error"]
    # The hanging workers ignored SIGTERM: only the SIGKILL to their process group stopped them.
    assert sorted(p.name for p in tmp_path.glob("hanging.*")) == ["hanging.0", "hanging.1"]
    assert processes_with(marker) == []
    report = (out / "report.md").read_text()
    for name in expected_kinds:
        assert f"`{name}`" in report.split("## Failed and skipped strategies")[1]


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_and_still_reports(tmp_path, plugin_env):
    marker = f"pbmark{uuid.uuid4().hex[:10]}"
    out = tmp_path / marker
    # noise_runs=0: the default's noise runs of `single` would only delay the hang that Ctrl-C stops.
    cmd = [sys.executable, RUNNER, "compare", "strategies=[single,hangs,ddp]", "nproc=2", "noise_runs=0"]
    cmd += [f"out_dir={out}", *NANO]
    proc = subprocess.Popen(cmd, env=plugin_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("hanging.*"))) < 2:  # both hanging workers are up
            assert proc.poll() is None and time.monotonic() < deadline, "the hanging strategy never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # runner.py dumps its stacks: where did it stick?
            time.sleep(2)
            proc.kill()
            pytest.fail(f"compare did not stop after Ctrl-C:\n{proc.communicate()[0][-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    results = by_name(out)
    assert [results[n]["status"] for n in ("single", "hangs", "ddp")] == ["ok", "interrupted", "not run"]
    assert json.loads((out / "results.json").read_text())["interrupted"] is True
    assert "Interrupted" in (out / "report.md").read_text() and (out / "report.html").stat().st_size > 0
    assert processes_with(marker) == []


def test_bad_compare_input_is_one_line(tmp_path):
    proc = run_cli(["compare", "strategies=[single,no-such-thing]", f"out_dir={tmp_path}"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown strategy 'no-such-thing'" in proc.stderr
    with pytest.raises(ValueError, match=r"strategies=\[a,b\]"):
        compare.main(["strategy=ddp"])
    with pytest.raises(ValueError, match="multiple of 2"):
        compare.main(["batch_size=15", "strategies=ddp", "nproc=2", f"out_dir={tmp_path}"])
    with pytest.raises(ValueError, match="did you mean 'strategies'"):
        compare.main(["strategis=[ddp]"])
    with pytest.raises(ValueError, match="strategy_options.fsdp is for strategy 'fsdp', which this compare does not"):
        compare.main(["strategies=[single,ddp]", "strategy_options.fsdp.prefetch_blocks=1", f"out_dir={tmp_path}"])
    with pytest.raises(ValueError, match="prefetch_blocks is an option of none"):  # no compared strategy has it
        compare.main(["strategies=[single,ddp]", "strategy_options.prefetch_blocks=1", f"out_dir={tmp_path}"])
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize(
    "folder, says",
    [
        ("run", "holds a train run (metrics.jsonl): give the compare a folder of its own"),
        ("run/checkpoints", "holds a train run's checkpoints (step_2): give the compare a folder of its own"),
    ],
)
def test_a_train_runs_folder_is_no_compares_out_dir(tmp_path, capsys, folder, says):
    """A compare's run folders beside a train run's files, or among its checkpoints, would mix the two."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    for name in ("metrics.jsonl", "summary.json"):
        (run / name).write_text("{}")
    before = sorted(run.rglob("*"))
    assert runner.main(["compare", "strategies=[single,ddp]", f"out_dir={tmp_path / folder}", *NANO]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"out_dir={tmp_path / folder} {says}" in err, err
    assert sorted(run.rglob("*")) == before


def test_timeout_kills_workers_that_left_the_job_session(tmp_path):
    """As torchrun does, the launcher starts its worker in a session of its own; the
    worker ignores SIGTERM. A timeout must still leave no process behind."""
    marker = f"pbmark{uuid.uuid4().hex[:10]}"
    worker = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(tmp_path / 'up')!r}, 'w').close(); time.sleep(600)"
    )
    launcher = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}, {marker!r}], "
        "start_new_session=True); time.sleep(600)"
    )
    polls = []
    outcome = run_job(
        [sys.executable, "-c", launcher, marker],
        log_path=tmp_path / "log.txt",
        timeout_s=3,
        on_poll=lambda: polls.append(1),
        poll_interval_s=0.1,
        grace_s=1,
    )
    assert (tmp_path / "up").exists(), "the worker never started"
    assert outcome.kind == "timeout" and not outcome.ok and polls
    assert processes_with(marker) == []


def test_timeout_kills_a_worker_forked_as_its_launcher_died(tmp_path):
    """The launcher starts its worker in its SIGTERM handler, in a session of its own, then
    exits: the worker was never seen as the launcher's child. Adopted by the supervisor
    (a child subreaper), it must still be killed, and reaped."""
    marker = f"pbmark{uuid.uuid4().hex[:10]}"
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    launcher = (
        "import os, signal, subprocess, sys, time\n"
        "def spawn_and_die(*_):\n"
        f"    subprocess.Popen([sys.executable, '-c', {worker!r}, {marker!r}], start_new_session=True)\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGTERM, spawn_and_die)\n"
        f"open({str(tmp_path / 'up')!r}, 'w').close()\n"
        "time.sleep(600)\n"
    )
    outcome = run_job(
        [sys.executable, "-c", launcher], log_path=tmp_path / "log.txt", timeout_s=2, poll_interval_s=0.1, grace_s=3
    )
    assert (tmp_path / "up").exists(), "the launcher never started"
    assert outcome.kind == "timeout"
    assert processes_with(marker) == []
    zombies = [
        line
        for line in subprocess.run(
            ["ps", "-o", "stat=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
        if line.startswith("Z")
    ]
    assert zombies == []


def test_a_clean_exit_and_a_crash_are_told_apart(tmp_path):
    ok = run_job([sys.executable, "-c", "print('fine')"], log_path=tmp_path / "ok.txt", timeout_s=30)
    assert ok.ok and ok.returncode == 0 and ok.log_tail[-1] == "fine"
    assert ok.log_tail[0].startswith("$ ")  # the log starts with the command that made it
    bad = run_job(
        [sys.executable, "-c", "raise ValueError('bad value here')"], log_path=tmp_path / "bad.txt", timeout_s=30
    )
    assert bad.kind == "crash" and "ValueError: bad value here" in bad.message


TORCHRUN_SIGKILL = """
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 6376)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 6376
"""

# One worker raised; torchrun then stopped the other with SIGTERM, and saw that first.
TORCHRUN_RAISE_THEN_SIGTERM = """
RuntimeError: deliberate failure
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 7001)
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 7002)  (SIGTERM)
"""

# Both workers raised; one then aborted in its C++ teardown (seen under load) and torchrun SIGTERMed the other.
TORCHRUN_RAISE_THEN_ABORT = """
[rank1]: RuntimeError: deliberate failure
terminate called without an active exception
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7001)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 7002)  (SIGABRT)
"""

# One worker was SIGKILLed (say by the host's OOM killer): its peer's error is only the symptom.
TORCHRUN_SIGKILL_PEER_LOST = """
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4411
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 6376)  (SIGKILL)
"""


@pytest.mark.parametrize(
    "returncode, log, kind, words",
    [
        (0, "", None, "exited 0"),
        (
            1,
            "Traceback\nRuntimeError: boom\nE1122 failed (exitcode: 1)\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n",
            "crash",
            "RuntimeError: boom",
        ),
        (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "oom", "Tried to allocate"),
        (1, TORCHRUN_SIGKILL, "signal", "SIGKILL"),
        (1, TORCHRUN_RAISE_THEN_SIGTERM, "crash", "RuntimeError: deliberate failure"),
        (1, TORCHRUN_RAISE_THEN_ABORT, "crash", "RuntimeError: deliberate failure"),
        (1, TORCHRUN_SIGKILL_PEER_LOST, "signal", "SIGKILL"),
        (-15, "", "signal", "SIGTERM"),
        (3, "no exception here\n", "crash", "exited with code 3"),
    ],
)
def test_failure_classification(returncode, log, kind, words):
    got_kind, message = classify(returncode, log, None, 10)
    assert got_kind == kind and words in message


def test_a_sigkill_while_the_oom_killer_killed_reads_as_out_of_memory_with_what_to_lower():
    advice = "micro_batch=16, seq_len=1024 or nproc=2"
    for log in (TORCHRUN_SIGKILL, TORCHRUN_SIGKILL_PEER_LOST):
        kind, message = classify(1, log, None, 10, oom_killed=True, oom_advice=advice)
        assert (kind, message) == ("oom", f"out of memory (killed by the kernel's OOM killer): lower {advice}")
    assert classify(-9, "", None, 10, oom_killed=True)[0] == "oom"
    assert classify(1, TORCHRUN_RAISE_THEN_SIGTERM, None, 10, oom_killed=True)[0] == "crash"  # no SIGKILL


def _fake_watch(counts: list[int | None], available: float | None = 0.5) -> OomWatch:
    """An OOM-kill count that reads each of `counts` in turn (before the job, then after it)."""
    readings = iter(counts)
    return OomWatch(count=lambda: next(readings), available=lambda: available)


SIGKILL_ITSELF = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.mark.parametrize(
    "counts, available, kind",
    [
        ([3, 4], 0.5, "oom"),  # the cgroup's oom_kill count grew while the job ran
        ([3, 3], 0.0, "signal"),  # another SIGKILL: the count says so, whatever the memory
        ([None, None], 0.001, "oom"),  # no count readable: available memory near zero
        ([None, None], 0.5, "signal"),
    ],
)
def test_the_kernels_oom_kill_is_told_from_another_sigkill(tmp_path, counts, available, kind):
    outcome = run_job(
        [sys.executable, "-c", f"import time; time.sleep(0.3); {SIGKILL_ITSELF}"],
        log_path=tmp_path / "log.txt",
        timeout_s=30,
        poll_interval_s=0.05,
        oom_advice="micro_batch=8, seq_len=64 or nproc=2",
        oom_watch=_fake_watch(counts, available),
    )
    assert outcome.kind == kind, outcome.message
    if kind == "oom":
        assert outcome.message.endswith("OOM killer): lower micro_batch=8, seq_len=64 or nproc=2")


def test_the_oom_kill_count_reads_from_the_cgroup_or_the_machine():
    count = oom_kill_count()
    assert count is None or count >= 0
    assert 0 < (available_share() or 0.5) <= 1


def test_timeout_and_interrupt_win_over_exit_status():
    assert classify(-9, "CUDA out of memory", "timeout", 12)[0] == "timeout"
    assert classify(-15, "", "interrupted", 12)[0] == "interrupted"


def test_metrics_tail_reads_only_whole_new_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert not tail.poll()  # no file yet
    path.write_text('{"step": 1, "loss": 4.0}\n{"step": 2, "lo')
    assert tail.poll() and tail.last["step"] == 1
    with path.open("a") as f:
        f.write('ss": 3.5}\n')
    assert tail.poll() and tail.last == {"step": 2, "loss": 3.5}
    assert not tail.poll()


@pytest.mark.parametrize("live", [True, False])
def test_progress_shows_the_running_strategy_its_step_and_what_is_left(tmp_path, live):
    stream = io.StringIO()
    progress = SweepProgress(["single", "ddp", "fsdp"], total_steps=30, stream=stream, live=live)
    progress.finish("single", "ok", "30 steps")
    progress.start("ddp", tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "loss": 3.5}\n')
    progress.poll()
    text = stream.getvalue()
    assert "+ single" in text and "ddp" in text and "step 10/30" in text and "3.5000" in text
    if live:  # one status line redrawn in place, with the bar and what is left
        assert "\r[" in text and "1/3" in text and "left: fsdp" in text
    else:  # plain lines only, for logs
        assert "\r" not in text and "[2/3] ddp: running" in text
        assert "[1/3] single: ok" in text  # one that finished without a start keeps its number
