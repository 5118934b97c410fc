"""A compare that outlives its terminal: SIGHUP stops it as Ctrl-C does, results.json is kept
as the runs finish, and `resume=auto` picks up where a killed compare stopped, to the same
verdicts and, from a checkpoint, the same curve bit for bit.

The compare is caught in the middle of a strategy at a known step by a test plugin (a module
named in PARABENCH_PLUGINS): `ddp-pausing` is ddp that stops answering after a given step.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import termios
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from harness.compare.compare_cli import Sweep
from harness.compare.compare_config import load_compare_config, train_options
from harness.compare.identity import ConfigurationChanged, differences, run_identity
from harness.compare.out_dir_lock import OutDirBusy, OutDirLock, is_locked
from harness.compare.progress import SweepProgress
from harness.compare.resume import CONTINUE, FRESH, KEEP, PlannedRun, decide
from harness.compare.run_record import RunRecord
from harness.compare.stop_signals import StopSignals
from harness.compare.supervise import GRACE_S, JobOutcome
from harness.report.report_cli import build_report
from tests.compare.test_compare import processes_with
from tests.helpers import NANO, ROOT, RUNNER, env_for_tests, read_run, run_bounded, run_cli

PAUSING_PLUGIN = """
import os, time
from strategies.base import Preset
from strategies.ddp import DDPStrategy

class PausingDDP(DDPStrategy):
    description = "test plugin: ddp that stops answering after step PAUSE_AFTER_STEP"
    presets = (Preset("ddp-pausing", description),)

    def step(self):
        super().step()
        self.steps_done = getattr(self, "steps_done", 0) + 1
        if self.steps_done == int(os.environ.get("PAUSE_AFTER_STEP", "0")):
            if self.ctx.rank == 0:
                open(os.environ["PAUSE_FLAG"], "w").close()
            time.sleep(3600)
"""
STRATEGIES = ["single", "ddp", "ddp-pausing", "fsdp"]
# What the resumed compare is held to: a compare run through, of every strategy the resume runs or
# judges again. Not ddp: the resume keeps the killed compare's ddp run, its files untouched, and
# holds it to the verdict the killed compare gave it.
UNINTERRUPTED = ["single", "ddp-pausing", "fsdp"]
SWEEP = ["nproc=2", "noise_runs=1", "timeout_s=120"]
# Checkpoints every 4 steps; the pause after step 6: the killed run's last checkpoint is step 4.
CHECKPOINTS = "checkpoint_every=4"
COMPARE_TIMEOUT = 400
# From SIGTERM to SIGKILL when SLURM stops a job (its default KillWait): the time a compare has to stop.
SCHEDULER_GRACE_S = 30


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("plugin")
    (site / "pausing_plugin.py").write_text(textwrap.dedent(PAUSING_PLUGIN))
    env = env_for_tests(PARABENCH_PLUGINS="pausing_plugin")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site)])
    return env


def compare_args(out: Path, *extra: str, strategies: list[str] = STRATEGIES, checkpoints: bool = True) -> list[str]:
    saves = [CHECKPOINTS] if checkpoints else []
    return ["compare", f"strategies=[{','.join(strategies)}]", *SWEEP, *saves, f"out_dir={out}", *NANO, *extra]


def entries(out: Path) -> dict[str, dict]:
    return {entry["name"]: entry for entry in json.loads((out / "results.json").read_text())["strategies"]}


def losses(run_dir: Path) -> list[float]:
    return [row["loss"] for row in read_run(run_dir)[1]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, plugin_env) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    # Run straight through, it saves no checkpoint (a second each of its 2-process runs): the resumed
    # curves are held to curves that no save or restore touched.
    args = compare_args(out, strategies=UNINTERRUPTED, checkpoints=False)
    proc = run_cli(args, env=plugin_env, timeout=COMPARE_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory, plugin_env) -> dict:
    """A compare SIGKILLed while `ddp-pausing` (its third strategy) waits after step 6, looked
    at, then the same command with resume=auto."""
    root = tmp_path_factory.mktemp("killed")
    marker = f"pbmark{uuid.uuid4().hex[:10]}"
    out = root / marker
    flag = root / "paused"
    env = {**plugin_env, "PAUSE_AFTER_STEP": "6", "PAUSE_FLAG": str(flag)}
    proc = subprocess.Popen(
        [sys.executable, RUNNER, *compare_args(out)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + COMPARE_TIMEOUT
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "ddp-pausing never reached its pause"
            time.sleep(0.2)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    seen: dict = {"out": out}
    # The job's leader got SIGTERM from the kernel as the compare died, and stopped its workers.
    # A process's command line reads empty while it exits, before it lets go of its descriptors:
    # the out_dir's lock, which the report waits for, says when the last of them has gone.
    deadline = time.monotonic() + 30
    while (processes_with(marker) or is_locked(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    seen["left_running"], seen["still_locked"] = processes_with(marker), is_locked(out)
    seen["before"] = {
        name: ((out / name / "summary.json").stat().st_mtime_ns, (out / name / "summary.json").read_text())
        for name in ("single", "ddp", "noise/1")
    }
    seen["results_when_killed"] = json.loads((out / "results.json").read_text())
    build_report(out)  # results.json is older than ddp-pausing's folder: made again from the folders
    seen["rebuilt"] = json.loads((out / "results.json").read_text())
    seen["rebuilt_report"] = (out / "report.md").read_text()
    seen["resumed"] = run_cli(compare_args(out, "resume=auto"), env=plugin_env, timeout=COMPARE_TIMEOUT)
    return seen


def test_a_killed_compare_leaves_nothing_running_and_its_results_readable(killed_then_resumed):
    seen = killed_then_resumed
    assert seen["left_running"] == [] and not seen["still_locked"]
    # As the compare last wrote it: the first two strategies and the noise run done, the rest to come.
    written = {e["name"]: e["status"] for e in seen["results_when_killed"]["strategies"]}
    assert written == {"single": "ok", "ddp": "ok", "ddp-pausing": "not run", "fsdp": "not run"}
    assert seen["results_when_killed"]["state"] == "running"
    rebuilt = {e["name"]: e for e in seen["rebuilt"]["strategies"]}
    assert [rebuilt[n]["status"] for n in STRATEGIES] == ["ok", "ok", "interrupted", "not run"]
    assert rebuilt["ddp-pausing"]["steps_done"] == 5  # logged every 5 steps: step 5, not yet 10
    assert rebuilt["ddp"]["verdict_kind"] in ("matches", "within noise")
    assert seen["rebuilt"]["state"] == "stopped" and seen["rebuilt"]["noise"]["band"] is not None
    assert "Stopped before its end" in seen["rebuilt_report"] and "resume=auto" in seen["rebuilt_report"]


def test_resume_keeps_the_finished_runs_and_matches_an_uninterrupted_compare(killed_then_resumed, uninterrupted):
    seen, out = killed_then_resumed, killed_then_resumed["out"]
    proc = seen["resumed"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resume=auto: 3 kept, 1 to continue" in proc.stdout
    for name, (mtime, text) in seen["before"].items():  # not run again
        summary = out / name / "summary.json"
        assert (summary.stat().st_mtime_ns, summary.read_text()) == (mtime, text), name
    doc = json.loads((out / "results.json").read_text())
    assert doc["state"] == "finished" and doc["kept"] == ["single", "ddp", "single noise 1"]
    resumed, straight = entries(out), entries(uninterrupted)
    when_killed = {entry["name"]: entry for entry in seen["results_when_killed"]["strategies"]}
    assert [resumed[n]["kept"] for n in STRATEGIES] == [True, True, False, False]
    # Continued from its own checkpoint at step 4, to the uninterrupted curve bit for bit.
    assert resumed["ddp-pausing"]["resumed_from_step"] == 4
    assert losses(out / "ddp-pausing") == losses(uninterrupted / "ddp-pausing")
    for name in STRATEGIES:
        assert resumed[name]["status"] == "ok", (name, resumed[name]["error"], resumed[name]["log_tail"])
        if name in UNINTERRUPTED:
            assert losses(out / name) == losses(uninterrupted / name), name
        held_to = straight[name] if name in UNINTERRUPTED else when_killed[name]
        assert (resumed[name]["verdict"], resumed[name]["final_loss"]) == (held_to["verdict"], held_to["final_loss"])
    assert doc["noise"]["band"] == json.loads((uninterrupted / "results.json").read_text())["noise"]["band"]
    report = (out / "report.md").read_text()
    assert "Kept from an earlier compare into this folder" in report and "`single`, `ddp`, 1 noise run" in report
    assert "`ddp-pausing` from step 4" in report


def test_a_finished_compares_lost_results_are_rebuilt_as_finished(uninterrupted, tmp_path):
    """Every run ended: the rebuilt results say the compare finished, not that it was killed."""
    out = tmp_path / "copy"
    shutil.copytree(uninterrupted, out)
    (out / "results.json").unlink()
    build_report(out)
    doc = json.loads((out / "results.json").read_text())
    assert doc["state"] == "finished" and not doc["interrupted"] and "every run had ended" in doc["rebuilt"]
    report = (out / "report.md").read_text()
    assert "Stopped before its end" not in report and "every run had ended" in report


def test_resume_after_changing_steps_names_the_key(killed_then_resumed, plugin_env):
    """One line naming the changed key, before anything is touched (a changed seed:
    test_resume_decides_from_each_run_folder)."""
    out = killed_then_resumed["out"]
    written = (out / "results.json").stat().st_mtime_ns
    proc = run_cli([*compare_args(out, "resume=auto"), "steps=12"], env=plugin_env, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "(single: steps was 10, now 12): use the old value, or another out_dir, or resume=never" in proc.stderr
    assert (out / "results.json").stat().st_mtime_ns == written  # nothing touched


def test_a_requeued_compare_job_picks_up_with_resume_auto(killed_then_resumed, plugin_env):
    """configs/slurm/compare.sbatch started again (as SLURM does after a preemption) with the
    same arguments: every run finished already, so none runs again."""
    out = killed_then_resumed["out"]
    summaries = {name: (out / name / "summary.json").stat().st_mtime_ns for name in STRATEGIES}
    env = {**plugin_env, "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_ID": "4242"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])  # `python`: this environment's
    script = ROOT / "configs" / "slurm" / "compare.sbatch"
    proc = run_bounded(["bash", str(script), *compare_args(out)[1:]], env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resume=auto: 5 kept, 0 to continue" in proc.stdout
    assert {name: (out / name / "summary.json").stat().st_mtime_ns for name in STRATEGIES} == summaries


def on_the_terminal() -> None:
    """In the child: the pty on its stdin becomes its controlling terminal, and SIGHUP does what it
    does without nohup, whatever runs the tests."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.extended  # Ctrl-C's stop runs on every change (tests/compare/test_compare.py)
def test_sighup_stops_the_compare_as_ctrl_c_does(tmp_path):
    """The compare's terminal goes away (a pty whose other end closes, as when an ssh session
    drops) during its second strategy: the job stops within the grace period, the report is
    written, and what the compare said after the hangup is in compare.log."""
    marker = f"pbmark{uuid.uuid4().hex[:10]}"
    out = tmp_path / marker
    cmd = [sys.executable, RUNNER, "compare", "strategies=[single,ddp,fsdp]", "nproc=2", "noise_runs=0"]
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*cmd, f"out_dir={out}", *NANO],
        env=env_for_tests(),
        cwd=ROOT,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=on_the_terminal,
    )
    os.close(slave)
    try:
        deadline = time.monotonic() + 240
        while not (out / "ddp" / "log.txt").is_file():  # the second strategy's job has started
            assert proc.poll() is None and time.monotonic() < deadline, "ddp never started"
            if select.select([master], [], [], 0.2)[0]:
                os.read(master, 65536)  # keep the terminal drained, as a terminal would be
        time.sleep(1.0)
        hung_up = time.time()
        os.close(master)  # the hangup: the kernel sends SIGHUP to the compare, the terminal's controller
        proc.wait(timeout=120)
        exited = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    record = json.loads((out / "ddp" / "run.json").read_text())
    assert record["outcome"]["kind"] == "interrupted"
    assert record["ended_unix"] - hung_up < GRACE_S + 1.0  # the job was stopped within the grace period
    assert exited - hung_up < SCHEDULER_GRACE_S  # and the results and the report written well before a SIGKILL
    assert processes_with(marker) == []
    results = entries(out)
    assert [results[n]["status"] for n in ("single", "ddp", "fsdp")] == ["ok", "interrupted", "not run"]
    assert "SIGHUP" in results["ddp"]["error"]
    assert "Interrupted (Ctrl-C, SIGTERM or SIGHUP)" in (out / "report.md").read_text()
    said = (out / "compare.log").read_text()
    assert "the terminal hung up" in said and "interrupted (SIGHUP)" in said and "report:" in said


# ---- without training ------------------------------------------------------------------------

VERSIONS = {"torch": "2.13.0", "deepspeed": "0.19.8", "accelerate": "1.15.0", "python": "3.12"}


def identity(**options) -> dict:
    base = {"model": "gpt-nano", "steps": 10, "seed": 1337, "strategy": "ddp", "strategy_options": {}, "out_dir": "a"}
    return run_identity({**base, **options}, world_size=2, nodes=1, device_type="cpu", versions=VERSIONS)


def test_the_identity_holds_what_changes_results_and_files_by_content(tmp_path):
    assert identity(out_dir="b", log_every=1, checkpoint_every=5, pg_timeout_s=9) == identity()
    assert differences(identity(), identity(steps=40)) == ["steps was 10, now 40"]
    assert differences(identity(), identity(strategy_options={"bucket_cap_mb": 5})) == [
        "strategy_options.bucket_cap_mb was unset, now 5"
    ]
    newer = run_identity({"model": "gpt-nano"}, world_size=2, nodes=1, device_type="cpu", versions={"torch": "2.14"})
    assert "versions.torch was 2.13.0, now 2.14" in differences(
        run_identity({"model": "gpt-nano"}, world_size=2, nodes=1, device_type="cpu", versions=VERSIONS), newer
    )
    # A file an option names counts by its content; so does one named as `kind:path` (a strategy's config file).
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 3}}')
    named = identity(deepspeed_config=str(config), strategy=f"accelerate:{config}")
    config.write_text('{"zero_optimization": {"stage": 2, "overlap_comm": true}}')
    changed = [
        line.split(" was ")[0]
        for line in differences(named, identity(deepspeed_config=str(config), strategy=f"accelerate:{config}"))
    ]
    assert sorted(changed) == ["file.deepspeed_config", "file.strategy"]


def record_in(run_dir: Path, ident: dict, outcome: JobOutcome | None, summary: bool = False) -> None:
    record = RunRecord(
        label=run_dir.name, strategy=run_dir.name, nproc=2, sweep_id="earlier", identity=ident, config_hash=""
    )
    record.write(run_dir)
    if outcome is not None:
        record.ended(run_dir, outcome)
    if summary:
        (run_dir / "summary.json").write_text("{}")


def test_resume_decides_from_each_run_folder(tmp_path):
    ok, stopped = JobOutcome(0, None, "exited 0"), JobOutcome(-15, "interrupted", "stopped")
    record_in(tmp_path / "done", identity(), ok, summary=True)
    record_in(tmp_path / "killed", identity(), None)
    (tmp_path / "killed" / "checkpoints" / "step_4").mkdir(parents=True)
    record_in(tmp_path / "interrupted", identity(), stopped)  # no checkpoint: starts again
    record_in(tmp_path / "crashed", identity(), JobOutcome(1, "crash", "boom"))
    runs = [
        PlannedRun(name, "ddp", tmp_path / name, 2, identity())
        for name in ("done", "killed", "interrupted", "crashed", "new")
    ]
    assert decide(runs, "auto", tmp_path) == {
        "done": KEEP,
        "killed": CONTINUE,
        "interrupted": FRESH,
        "crashed": FRESH,
        "new": FRESH,
    }
    assert set(decide(runs, "never", tmp_path).values()) == {FRESH}
    with pytest.raises(ValueError, match=r"stopped midway \(done finished; killed, interrupted stopped\)"):
        decide(runs, None, tmp_path)
    # Stopped between two runs: only results.json shows it.
    (tmp_path / "results.json").write_text('{"state": "interrupted"}')
    with pytest.raises(ValueError, match=r"stopped midway \(done finished\): continue it with resume=auto"):
        decide(runs[:1], None, tmp_path)
    changed = [PlannedRun("done", "ddp", tmp_path / "done", 2, identity(seed=7))]
    # A finished compare is never replaced unasked: resume=never is how to run it all again there.
    (tmp_path / "results.json").write_text('{"state": "finished"}')
    with pytest.raises(ValueError, match=r"holds a finished compare \(done finished\): keep its runs .* resume=never"):
        decide(runs[:1], None, tmp_path)
    assert decide(runs[:1], "never", tmp_path) == {"done": FRESH}
    # Another compare's strategies there: named from its results.json, since none is one of this one's runs.
    (tmp_path / "results.json").write_text('{"state": "finished", "strategies": [{"name": "fsdp"}, {"name": "zero2"}]}')
    with pytest.raises(ValueError, match=r"holds a finished compare \(of fsdp, zero2\): keep its runs"):
        decide(runs[4:], None, tmp_path)
    with pytest.raises(ConfigurationChanged, match=r"\(done: seed was 1337, now 7\): use the old value, or another"):
        decide(changed, "auto", tmp_path)


def _planned_single(out: Path, *options: str) -> PlannedRun:
    """The `single` run a compare into `out` plans, with its identity (nothing trained)."""
    cfg = load_compare_config(["strategies=[single,ddp]", "device=cpu", f"out_dir={out}", *options])
    return Sweep(cfg, train_options(cfg, []), out, 2, SweepProgress([], 1), "cpu").planned_run("single", VERSIONS)


@pytest.mark.parametrize("trackers", [[], ["trackers=[mlflow]"]], ids=["group", "group-and-mlflow-store"])
def test_a_copied_or_renamed_compare_resumes(tmp_path, monkeypatch, trackers):
    """The tracker group (and MLflow store) a compare names after its out_dir, where the user gives none,
    is where its runs log, as out_dir is: not held against a run folder of the compare under another name."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = _planned_single(tmp_path / "first", *trackers)
    moved = _planned_single(tmp_path / "renamed", *trackers)
    ok = JobOutcome(0, None, "exited 0")
    record_in(moved.run_dir, before.identity, ok, summary=True)
    assert decide([moved], "auto", tmp_path / "renamed") == {"single": KEEP}
    # A folder written before the named options were left out holds them, with the old folder's name.
    named = {"tracker_group": "first"}
    if trackers:
        named["tracker_uri"] = f"sqlite:///{tmp_path / 'first' / 'mlflow.db'}"
    record_in(moved.run_dir, {**before.identity, **named}, ok, summary=True)
    assert decide([moved], "auto", tmp_path / "renamed") == {"single": KEEP}
    # A group the user sets is theirs: one the earlier runs did not log to is a change.
    mine = _planned_single(tmp_path / "renamed", *trackers, "tracker_group=mine")
    with pytest.raises(ConfigurationChanged, match=r"\(single: tracker_group was first, now mine\)"):
        decide([mine], "auto", tmp_path / "renamed")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_each_stop_signal_is_noted_and_stops_at_the_next_check(tmp_path, sig):
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as without nohup, whatever runs the tests
    try:
        with StopSignals(tmp_path) as stop:
            stop.check()  # nothing yet
            os.kill(os.getpid(), sig)
            assert stop.requested == sig.name
            with pytest.raises(KeyboardInterrupt):
                stop.check()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_under_nohup_a_hangup_stops_nothing(tmp_path):
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals(tmp_path) as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            stop.check()
            assert stop.requested is None
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_one_compare_at_a_time_in_an_out_dir(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from harness.compare.out_dir_lock import OutDirLock; "
            "OutDirLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env_for_tests(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_locked(tmp_path)
        waited = []
        with pytest.raises(OutDirBusy, match="another compare is running into"):
            OutDirLock(tmp_path).acquire(wait_s=0.5, on_wait=lambda: waited.append(1))
        assert waited == [1]
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not is_locked(tmp_path)  # the kernel let go of it with the process
    OutDirLock(tmp_path).acquire(wait_s=0)
