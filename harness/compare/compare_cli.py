"""`runner.py compare`: the same model, data, seed, global batch and steps under each
strategy, one launcher job after another, then results.json and the report.

Every strategy is its own job in its own session (harness.compare.supervise), so a crash,
an out-of-memory error, a signal or a hang is one strategy's result and the sweep
goes on; Ctrl-C (or SIGTERM) stops the running job, skips the rest and still
writes the report for what finished. `single` runs in one process with the same
global batch: it is the reference the others' loss curves are held to.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import shlex
import shutil
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import OmegaConf

from configs.schema import ConfigError, RunConfig, to_dict
from harness.common.writable import check_writable
from harness.compare import batch_search, slurm
from harness.compare.compare_config import (
    CompareConfig,
    check_own_options,
    load_compare_config,
    own_option_args,
    own_options,
    train_options,
)
from harness.compare.progress import SweepProgress
from harness.compare.results import (
    StrategyResult,
    assign_verdicts,
    from_run,
    load_metrics,
    pick_reference,
    write_results,
)
from harness.compare.supervise import INTERRUPTED, JobOutcome, run_job
from harness.compare.verdict import NoiseBand, measure_noise
from harness.train import RUNNER, preflight, torchrun_command, worker_env
from strategies.registry import StrategyRegistry, default_registry

REFERENCE = "single"
STALE_RUN_FILES = ("metrics.jsonl", "summary.json", "log.txt")


def main(args: list[str]) -> int:
    cfg = load_compare_config(args)
    if cfg.launcher == "slurm":
        device_type, nproc = _slurm_world(cfg)
    else:
        device_type = _device_type(cfg)
        nproc = cfg.nproc or _default_nproc(device_type)
    registry = default_registry()
    names = _strategy_names(cfg, registry)
    check_own_options(cfg, names, registry.names())
    planned = [(name, _skip_reason(registry, name, device_type)) for name in names]
    runnable = [name for name, reason in planned if reason is None]
    shared = train_options(cfg, registry.names())
    _preflight(cfg, shared, runnable, nproc)

    out = Path(cfg.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The reference runs again with rounding noise right after it finishes: the verdicts' yardstick.
    intended_reference = REFERENCE if REFERENCE in runnable else next(iter(runnable), None)
    noise = NoiseRuns(cfg.noise_runs if intended_reference else 0, intended_reference)
    sweep = Sweep(cfg, shared, out, nproc, SweepProgress(noise.listed_after_reference(names), cfg.steps), device_type)
    if cfg.dry_run:
        return _print_slurm_scripts(sweep, runnable)
    started = time.time()
    print(
        f"parabench compare | {cfg.model} | {cfg.precision} | {nproc} x {device_type} | global batch "
        f"{cfg.batch_size} | {cfg.steps} steps | {len(runnable)} of {len(names)} strategies to run"
        + (f" + {noise.count} noise runs of {intended_reference}" if noise.count else "")
        + f" | {out}"
    )

    results: list[StrategyResult] = []
    interrupted = False
    searched: dict | None = None
    with _stop_signals_interrupt():
        for name, reason in planned:
            description = registry.get(name).description
            if reason is not None:
                results.append(sweep.skipped(name, description, reason))
            elif interrupted:
                results.append(sweep.not_run(name, description))
            else:
                try:
                    result = sweep.run(name, description)
                except KeyboardInterrupt:  # between jobs: the job itself is over already
                    result = sweep.interrupted(name, description)
                results.append(result)
                interrupted = result.status == "interrupted"
                if name == intended_reference and not interrupted:
                    try:
                        noise.run(sweep, result)
                    except KeyboardInterrupt:  # the reference is done; the rest of the sweep is not run
                        interrupted = True
        if cfg.batch_search and not interrupted:
            searched = _batch_search(cfg, sweep, results, device_type)
            interrupted = bool(searched.get("interrupted"))

    band = noise.band(out, pick_reference(results))
    reference = assign_verdicts(results, out, precision=cfg.precision, tolerance=cfg.tolerance(), band=band)
    facts = _sweep_facts(cfg, args, results, device_type, nproc, reference, started, interrupted, searched)
    facts["noise"] = noise.facts(band)
    write_results(out, facts, results)
    if device_type == "cuda":  # the planner's speed model fitted to what this GPU measured
        from harness.plan import calibration_for_report

        facts["calibration"] = calibration_for_report(out)
        write_results(out, facts, results)
    from harness.report import build_report  # matplotlib is only needed once the runs are over

    md_path, html_path = build_report(out)
    _print_summary(results, reference)
    print(f"results: {out / 'results.json'}\nreport:  {md_path}\n         {html_path}")
    if interrupted:
        print("interrupted: the report covers the strategies that finished")
        return 130
    return 0 if any(r.ran for r in results) else 1


class Sweep:
    """Runs strategies as supervised launcher jobs into `<out>/<strategy>/`."""

    def __init__(
        self,
        cfg: CompareConfig,
        shared: dict[str, Any],
        out: Path,
        nproc: int,
        progress: SweepProgress,
        device_type: str = "cpu",
    ):
        self.cfg, self.out, self.nproc, self.progress = cfg, out, nproc, progress
        self.device_type = device_type
        # One file with the shared options: every run reads the very same configuration
        # (plus, on its command line, the strategy_options section of its own strategy).
        self.train_config = out / "train_config.yaml"
        OmegaConf.save(OmegaConf.create(shared), self.train_config)

    def train_args(self, name: str, run_dir: Path, command: str = "train") -> list[str]:
        return [
            command,
            f"config={self.train_config}",
            f"strategy={name}",
            f"out_dir={run_dir}",
            *own_option_args(self.cfg, name),
        ]

    def nproc_for(self, name: str) -> int:
        return 1 if name == REFERENCE else self.nproc

    def launch(
        self,
        name: str,
        run_dir: Path,
        extra: list[str],
        on_poll: Callable[[], None] | None = None,
        command: str = "train",
        log_path: Path | None = None,
        job: str | None = None,
    ) -> JobOutcome:
        """`runner.py <command>` (train, or the batch search's probe) for strategy `name` into
        `run_dir`, its output in `log_path` (default run_dir/log.txt). Under SLURM `job` (default
        `name`) names the script, so that a noise run or a probe does not overwrite the strategy's own."""
        nproc = self.nproc_for(name)
        for stale in STALE_RUN_FILES:
            (run_dir / stale).unlink(missing_ok=True)
        args = [*self.train_args(name, run_dir, command), f"nproc={nproc}", *extra]
        if self.cfg.launcher == "slurm":
            script = self.slurm_script(name, run_dir, args, job)
            cmd = slurm.submit_and_wait_command(script, run_dir / "slurm.log")
        else:
            # One process runs without torchrun, as `runner.py train` would run it for a user.
            cmd = torchrun_command(nproc, args) if nproc > 1 else [sys.executable, RUNNER, *args]
        log_path = log_path or run_dir / "log.txt"
        outcome = run_job(cmd, log_path=log_path, timeout_s=self.cfg.timeout_s, env=worker_env(), on_poll=on_poll)
        if self.cfg.launcher == "slurm" and outcome.kind in ("timeout", "interrupted"):
            slurm.cancel_submitted(log_path.read_text(errors="replace"))
        return outcome

    def slurm_script(self, name: str, run_dir: Path, args: list[str], job: str | None = None) -> Path:
        """Write `<out>/slurm/parabench-<job, default name>.sbatch`: the reference on one process, the rest on
        nodes x gpus_per_node."""
        nodes, per_node = (1, 1) if name == REFERENCE else (self.cfg.nodes, self.nproc // self.cfg.nodes)
        spec = slurm.SlurmJob(
            name=f"parabench-{job or name}",
            nodes=nodes,
            procs_per_node=per_node,
            runner_args=args,
            log_path=run_dir / "slurm.log",
            rdzv_port=self.cfg.rdzv_port,
            time_limit=self.cfg.slurm_time,
            partition=self.cfg.slurm_partition,
            request_gpus=self.device_type == "cuda",
        )
        run_dir.mkdir(parents=True, exist_ok=True)
        return slurm.write_scripts([spec], self.out / "slurm")[0]

    def run(self, name: str, description: str) -> StrategyResult:
        run_dir = self.out / name
        self.progress.start(name, run_dir / "metrics.jsonl")
        outcome = self.launch(name, run_dir, [], on_poll=self.progress.poll)
        result = from_run(name, description, self.nproc_for(name), run_dir, self.out, outcome)
        if result.ran:
            result.prediction = predicted(run_dir)
        self.progress.finish(name, result.status, _finish_detail(result))
        return result

    def skipped(self, name: str, description: str, reason: str) -> StrategyResult:
        self.progress.finish(name, "skipped", reason)
        return StrategyResult(name=name, description=description, status="skipped", error=reason)

    def interrupted(self, name: str, description: str) -> StrategyResult:
        self.progress.finish(name, "interrupted", INTERRUPTED)
        return StrategyResult(
            name=name, description=description, status="interrupted", error_kind="interrupted", error=INTERRUPTED
        )

    def not_run(self, name: str, description: str) -> StrategyResult:
        reason = "the sweep was interrupted before it"
        self.progress.finish(name, "not run", reason)
        return StrategyResult(name=name, description=description, status="not run", error=reason)


def predicted(run_dir: Path) -> dict[str, Any]:
    """What `runner.py plan` predicts for the run in `run_dir`, from its summary.json."""
    from harness.plan import PlanError, prediction_for_run

    summary = json.loads((run_dir / "summary.json").read_text())
    try:
        return prediction_for_run(RunConfig(**summary["config"]), summary)
    except PlanError as exc:
        return {"note": f"the planner could not answer: {exc}"}


class NoiseRuns:
    """The reference again, `count` times, with rounding noise (noise_seed=1..count): how far a
    correct backend may stray from the reference on this machine (harness/compare/verdict.py)."""

    def __init__(self, count: int, reference: str | None):
        self.count, self.reference = count, reference
        self.labels = [f"{reference} noise {seed}" for seed in range(1, count + 1)]
        self.outcomes: list[dict[str, Any]] = []
        self.skipped: str | None = None if count else "noise_runs=0: verdicts use the fixed loss_tolerance"

    def listed_after_reference(self, names: list[str]) -> list[str]:
        """The sweep's names with the noise runs where they run, for the progress view."""
        if not self.count:
            return names
        at = names.index(self.reference) + 1
        return [*names[:at], *self.labels, *names[at:]]

    def run(self, sweep: "Sweep", reference: StrategyResult) -> None:
        if not self.count:
            return
        if not reference.ran:
            self.skipped = f"the reference {self.reference} did not finish: verdicts use the fixed loss_tolerance"
            for label in self.labels:
                sweep.progress.finish(label, "skipped", "the reference did not finish")
            return
        sweep.progress.note(
            f"noise runs: {self.reference} again {self.count} time{'s' if self.count != 1 else ''}, its gradients "
            f"nudged by rounding-sized amounts, {reference.wall_time_s or 0:.0f} s each as the reference took: the "
            f"spread a correct backend may show (noise_runs=0 skips them)"
        )
        for seed, label in enumerate(self.labels, start=1):
            run_dir = sweep.out / "noise" / str(seed)
            sweep.progress.start(label, run_dir / "metrics.jsonl")
            outcome = sweep.launch(
                self.reference,
                run_dir,
                [f"noise_seed={seed}"],
                on_poll=sweep.progress.poll,
                job=f"{self.reference}-noise-{seed}",
            )
            if outcome.kind == "interrupted":
                raise KeyboardInterrupt
            steps = len(load_metrics(run_dir))
            self.outcomes.append(
                {
                    "seed": seed,
                    "run_dir": str(run_dir.relative_to(sweep.out)),
                    "status": "ok" if outcome.ok else outcome.kind,
                    "error": None if outcome.ok else outcome.message,
                    "steps": steps,
                    "wall_time_s": outcome.wall_time_s,
                }
            )
            sweep.progress.finish(
                label,
                "ok" if outcome.ok else "failed",
                f"{steps} steps  {outcome.wall_time_s:.1f}s" if outcome.ok else outcome.message,
            )

    def band(self, out: Path, reference: StrategyResult | None) -> NoiseBand | None:
        """The measured band, or None (with the reason kept) where there is none to judge by."""
        if self.skipped:
            return None
        if reference is None or reference.name != self.reference:
            self.skipped = f"the noise runs are of {self.reference}, which is not the reference here"
            return None
        reference_rows = load_metrics(out / str(reference.run_dir))
        curves = [load_metrics(out / o["run_dir"]) for o in self.outcomes if o["status"] == "ok"]
        curves = [rows for rows in curves if len(rows) == len(reference_rows)]
        if not curves:
            self.skipped = "no noise run finished: verdicts use the fixed loss_tolerance"
            return None
        return measure_noise(reference_rows, curves)

    def facts(self, band: NoiseBand | None) -> dict[str, Any]:
        """What results.json records: the runs, the band per step and its rule, or why there is none."""
        return {
            "reference": self.reference,
            "runs": self.outcomes,
            "skipped": self.skipped,
            "band": band.as_dict() if band else None,
        }


def _finish_detail(result: StrategyResult) -> str:
    if result.status == "failed":
        return f"{result.error_kind}: {result.error}"
    if not result.ran:
        return str(result.error)
    speed = f"{result.tokens_per_s:,.0f} tok/s" if result.tokens_per_s else "tok/s n/a"
    return f"{result.steps_done} steps  loss {result.final_loss:.4f}  {speed}  {result.wall_time_s:.1f}s"


def _slurm_world(cfg: CompareConfig) -> tuple[str, int]:
    """(device type of the compute nodes, world size) for launcher=slurm."""
    if not cfg.dry_run and not slurm.sbatch_available():
        raise ConfigError(
            "launcher=slurm but sbatch is not on PATH: run on a SLURM login node, "
            "or add dry_run=true to write the scripts only"
        )
    device_type = "cpu" if cfg.device == "cpu" else "cuda"
    per_node = cfg.gpus_per_node or _default_nproc(device_type)
    if per_node < 1:
        raise ConfigError("no GPU is visible here to count: give gpus_per_node= for the compute nodes")
    return device_type, cfg.nodes * per_node


def _print_slurm_scripts(sweep: Sweep, runnable: list[str]) -> int:
    """dry_run=true: write one sbatch script per strategy and print them; submit nothing."""
    for name in runnable:
        run_dir = sweep.out / name
        script = sweep.slurm_script(name, run_dir, sweep.train_args(name, run_dir))
        print(f"# ---- {script}\n{script.read_text()}")
    print(
        f"{len(runnable)} scripts written to {sweep.out / 'slurm'}; run the same command without "
        "dry_run=true to submit them one after another and gather the results into one report"
    )
    return 0


def _device_type(cfg: CompareConfig) -> str:
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is visible: use device=cpu or device=auto")
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return "cuda"


def _default_nproc(device_type: str) -> int:
    import torch

    # Every visible GPU; on a CPU-only machine two gloo processes, the smallest real world.
    return torch.cuda.device_count() if device_type == "cuda" else 2


def _strategy_names(cfg: CompareConfig, registry: StrategyRegistry) -> list[str]:
    names = list(dict.fromkeys(cfg.strategies or registry.names()))  # keep order, drop repeats
    for name in names:
        registry.get(name)  # an unknown name is an error that lists the known ones
    return names


def _skip_reason(registry: StrategyRegistry, name: str, device_type: str) -> str | None:
    entry = registry.get(name)
    if entry.unavailable_reason:
        return f"unavailable: {entry.unavailable_reason}"
    unsupported = entry.unsupported_reason(device_type)
    return f"unsupported on {device_type}: {unsupported}" if unsupported else None


def _preflight(cfg: CompareConfig, shared: dict[str, Any], runnable: list[str], nproc: int) -> None:
    """Bad input fails once, here, as one line, rather than once per strategy."""
    check_writable(cfg.out_dir)
    for name in runnable:
        options = {**shared, "strategy_options": {**shared["strategy_options"], **own_options(cfg, name)}}
        preflight(RunConfig(**options, strategy=name), 1 if name == REFERENCE else nproc)


def _batch_search(cfg: CompareConfig, sweep: Sweep, results: list[StrategyResult], device_type: str) -> dict:
    """Each finished strategy's search; Ctrl-C keeps the searches done and names the one it stopped."""
    from harness.common.testing_hooks import MEMORY_LIMIT_ENV, fake_memory_limit
    from harness.plan import SEARCH_FRACTION

    if device_type == "cpu" and fake_memory_limit() is None:
        sweep.progress.note(batch_search.CPU_SKIP_MESSAGE)
        return {"skipped": batch_search.CPU_SKIP_MESSAGE}
    if device_type == "cpu":
        sweep.progress.note(f"batch search on the CPU against the limit {MEMORY_LIMIT_ENV} fakes (a test)")
    started = time.monotonic()
    found = []
    current = interrupted = None
    try:
        for current in (r.name for r in results if r.ran):
            sweep.progress.note(f"batch search: {current}")
            searched = _search_one(cfg, sweep, current).as_result()
            sweep.progress.note(f"batch search: {current}: {batch_search.describe(searched)}")
            found.append(searched)
    except KeyboardInterrupt:
        interrupted = current
        stopped = sweep.out / "batch_search" / str(current) / batch_search.SEARCH_FILE
        if stopped.is_file():  # the probes it made before the stop
            found.append(batch_search.load(stopped).as_result())
    return {
        "results": found,
        "wall_time_s": time.monotonic() - started,
        "predicted_within": SEARCH_FRACTION,
        "interrupted": interrupted,
    }


def _search_one(cfg: CompareConfig, sweep: Sweep, name: str) -> batch_search.Search:
    """One strategy's search, its files in <out>/batch_search/<name>/ (search.json, a log per job)."""
    nproc = sweep.nproc_for(name)
    folder = sweep.out / "batch_search" / name
    shutil.rmtree(folder, ignore_errors=True)  # an earlier compare's probes into the same out_dir
    folder.mkdir(parents=True)
    if nproc > 1:
        why_not = (
            f"{nproc} ranks: one out of memory would leave the others blocked in a collective, so each "
            "probe is a job of its own"
        )
    elif not default_registry().get(name).recovers_from_oom():
        why_not = "the backend does not recover from an out-of-memory error in one process: a process per probe"
    else:
        why_not = None
    initial = batch_search.Search(
        strategy=name,
        world_size=nproc,
        fallback_start=cfg.micro_batch or max(1, cfg.batch_size // nproc),
        job_time_s=cfg.timeout_s,
        in_process=why_not is None,
        note=why_not,
    )
    jobs = itertools.count(1)

    def launch() -> JobOutcome:
        return sweep.launch(
            name, folder, [], command="probe", log_path=folder / f"job_{next(jobs)}.log", job=f"{name}-probe"
        )

    return batch_search.search(folder / batch_search.SEARCH_FILE, initial, launch)


def _sweep_facts(
    cfg: CompareConfig,
    args: list[str],
    results: list[StrategyResult],
    device_type: str,
    nproc: int,
    reference: str | None,
    started: float,
    interrupted: bool,
    searched: dict | None,
) -> dict[str, Any]:
    summary = _first_summary(Path(cfg.out_dir).resolve(), results)
    from harness.train import library_versions

    return {
        "command": shlex.join(["python", "runner.py", "compare", *args]),
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": time.time() - started,
        "interrupted": interrupted,
        "config": {**to_dict(cfg), "strategies": [r.name for r in results]},  # as resolved, defaults included
        "precision": cfg.precision,
        "tolerance": cfg.tolerance(),  # the rule when there is no noise band (noise_runs=0)
        "reference": reference,
        "device_type": device_type,
        "nproc": nproc,
        "loss_floor": summary.get("loss_floor"),
        "model": {
            "name": cfg.model,
            "num_params": summary.get("num_params"),
            "flops_per_token": summary.get("flops_per_token"),
        },
        "environment": {
            "device": summary.get("device") or device_type,
            "devices": nproc,
            "world_size": nproc,
            "host": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores",
            "versions": summary.get("versions") or library_versions(),
        },
        "batch_search": searched,
    }


def _first_summary(out: Path, results: list[StrategyResult]) -> dict[str, Any]:
    for result in results:
        path = out / str(result.run_dir) / "summary.json"
        if result.ran and path.is_file():
            return json.loads(path.read_text())
    return {}


def _print_summary(results: list[StrategyResult], reference: str | None) -> None:
    ran = sorted((r for r in results if r.ran), key=lambda r: -(r.tokens_per_s or 0))
    print(f"\n{'strategy':<18} {'tokens/s':>10} {'final loss':>10}  vs reference ({reference or 'none'})")
    for r in ran:
        speed = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "n/a"
        print(f"{r.name:<18} {speed:>10} {r.final_loss:>10.4f}  {r.verdict}")
    for r in results:
        if not r.ran:
            kind = f" ({r.error_kind})" if r.error_kind and r.error_kind != r.status else ""
            print(f"{r.name:<18} {r.status}{kind}: {r.error}")


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM to compare stops the sweep as Ctrl-C does: the running job's whole group is
    killed and the report is written (the jobs live in their own sessions: nothing else would stop them).

    SIGINT gets Python's handler explicitly: a shell without job control starts background
    commands with SIGINT ignored, and Python keeps an ignored SIGINT ignored."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
