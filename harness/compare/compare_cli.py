"""`runner.py compare`: the same model, data, seed, global batch and steps under each
strategy, one launcher job after another, then results.json and the report.

Every strategy is its own job in its own session (harness.compare.supervise), so a crash,
an out-of-memory error, a signal or a hang is one strategy's result and the sweep
goes on; Ctrl-C, SIGTERM or SIGHUP (harness.compare.stop_signals) stops the running job, skips
the rest and still writes the report for what finished. `single` runs in one process with the
same global batch: it is the reference the others' loss curves are held to. A user's own
config file runs beside the built-ins (`accelerate:mine.yaml`, `deepspeed:ds.json`), labelled by
its file's name, its run in a folder of its own (harness/compare/run_names.py). `plan=<search json>`
runs a `plan search=true`'s best layouts instead, each as its strategy with its settings
(harness/compare/from_plan.py).

What the sweep learns is on the disk as it comes: compare.json (the plan) when it starts, each
run's run.json in its folder, and results.json rewritten after every run, so a compare killed by
anything leaves what finished readable, and `resume=auto` (harness.compare.resume) picks up
where it stopped.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from configs.schema import ConfigError, RunConfig, to_dict
from harness.common.writable import check_writable
from harness.compare import batch_search, from_plan, slurm
from harness.compare.collect import collect
from harness.compare.compare_config import (
    CompareConfig,
    check_own_options,
    deepspeed_config_for,
    load_compare_config,
    option_args,
    options_for,
    out_dir_named,
    takers_of_compare_wide_options,
    takers_of_deepspeed_config,
    train_options,
)
from harness.compare.fit_here import usable_bytes
from harness.compare.from_plan import PlannedLayout
from harness.compare.identity import run_identity
from harness.compare.out_dir_lock import OutDirLock
from harness.compare.progress import SweepProgress
from harness.compare.results import StrategyResult, write_results
from harness.compare.resume import CONTINUE, KEEP, PlannedRun, decide
from harness.compare.run_names import RunName, run_names, safe_name
from harness.compare.run_record import RUN_RECORD, RunRecord
from harness.compare.stop_signals import StopSignals
from harness.compare.supervise import JobOutcome, run_job
from harness.compare.sweep_plan import PlannedStrategy, SweepPlan, noise_dir
from harness.train import (
    RUN_FILES,
    RUN_FOLDERS,
    RUNNER,
    adopt_file_settings,
    library_versions,
    preflight,
    refuse_a_train_run,
    worker_env,
)
from strategies.base import ModelUnsupported
from strategies.registry import StrategyRegistry, default_registry

REFERENCE = "single"
# precision=fp8 is judged against the reference in bf16, and bf16's noise: what fp8 training is for is
# to learn what bf16 training learns.
FP8_REFERENCE_PRECISION = "bf16"
# What a run writes into its folder, removed before it runs afresh (a run continued from its
# checkpoint keeps its metrics, which `train` cuts back to the checkpoint's step, and its log).
STALE_RUN_FILES = (*RUN_FILES, RUN_RECORD)
STALE_RUN_DIRS = RUN_FOLDERS


def main(args: list[str]) -> int:
    cfg = load_compare_config(args)
    from_plan.check_plan_args(cfg, args)
    refuse_a_train_run(cfg.out_dir, "give the compare a folder of its own")
    if cfg.launcher == "slurm":
        device_type, nproc = _slurm_world(cfg)
    else:
        device_type = _device_type(cfg)
        nproc = cfg.nproc or _default_nproc(device_type)
    registry = default_registry()
    cfg, layouts, searched_plan = _plan_layouts(cfg, nproc, device_type)
    names = [REFERENCE, *layouts] if layouts else _strategy_names(cfg, registry)
    strategies = [name for name in names if name not in layouts]  # the names the registry knows
    cfg, adopted = adopt_file_settings(cfg, strategies)  # a DeepSpeed JSON's scheduler: every strategy's schedule
    shown = run_names(strategies, registry) | {key: RunName(key, layout.folder) for key, layout in layouts.items()}
    check_own_options(cfg, strategies, registry.names())
    takers = takers_of_compare_wide_options(cfg, strategies, registry)
    runs_as = {name: run_settings(cfg, name, layouts)[0] for name in names}
    deepspeed_takers = takers_of_deepspeed_config(cfg, runs_as, registry)
    shared = train_options(cfg, registry.names())
    # A plan's layouts are preflighted against the compare's own out_dir, as _preflight's runs are.
    checked = {**shared, "out_dir": cfg.out_dir}
    planned = [
        (name, _skip_reason(registry, name, device_type, checked, layouts, run_settings(cfg, name, layouts)[1]))
        for name in names
    ]
    runnable = [name for name, reason in planned if reason is None]
    followed, cannot = _preflight(cfg, shared, runnable, nproc, layouts)
    planned = [(name, cannot.get(name, reason)) for name, reason in planned]
    runnable = [name for name in runnable if name not in cannot]

    out = Path(cfg.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The reference runs again with rounding noise right after it finishes: the verdicts' yardstick.
    intended_reference = REFERENCE if REFERENCE in runnable else next(iter(runnable), None)
    noise_count = cfg.noise_runs if intended_reference else 0
    reference_label = shown[intended_reference].label if intended_reference else None
    labels = _listed_with_noise([shown[name].label for name in names], reference_label, noise_count)
    sweep = Sweep(cfg, shared, out, nproc, SweepProgress(labels, cfg.steps), device_type, shown, layouts)
    if cfg.dry_run:
        return _print_slurm_scripts(sweep, runnable, {name: why for name, why in planned if why})
    lock = OutDirLock(out)
    lock.acquire(on_wait=lambda: print(f"waiting for the last job of the compare stopped in {out} to end"))
    sweep.lock_fd = lock.fd

    versions = library_versions()
    runs = {name: sweep.planned_run(name, versions) for name in runnable}
    noise = [sweep.planned_run(intended_reference, versions, seed) for seed in range(1, noise_count + 1)]
    decisions = decide([*runs.values(), *noise], cfg.resume, out)  # refuses another configuration's runs
    started = time.time()
    plan = SweepPlan(
        sweep_id=uuid.uuid4().hex[:12],
        command=shlex.join(["python", "runner.py", "compare", *args]),
        started_at=datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        started_unix=started,
        config={**to_dict(cfg), "strategies": names},  # as resolved, defaults included
        precision=cfg.precision,
        tolerance=cfg.tolerance(),  # the rule when there is no noise band (noise_runs=0)
        device_type=device_type,
        nproc=nproc,
        host=f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores",
        versions=versions,
        strategies=[
            _planned(registry, name, reason, shown[name], followed.get(name, []), layouts.get(name))
            for name, reason in planned
        ],
        noise_reference=reference_label,
        noise_runs=noise_count,
        kept=[label for label, decision in decisions.items() if decision == KEEP],
        compare_wide_options={
            key: {"value": cfg.strategy_options[key], "taken_by": [shown[name].label for name in names]}
            for key, names in takers.items()
        },
        deepspeed_config=(
            {"value": cfg.deepspeed_config, "taken_by": [shown[name].label for name in deepspeed_takers]}
            if deepspeed_takers
            else None
        ),
        from_plan=from_plan.plan_facts(str(cfg.plan), searched_plan, list(layouts.values())) if searched_plan else None,
    )
    sweep.start(plan, decisions)
    kept, continued = plan.kept, [label for label, decision in decisions.items() if decision == CONTINUE]
    print(
        f"parabench compare | {cfg.model} | {cfg.precision} | {nproc} x {device_type} | global batch "
        f"{cfg.batch_size} | {cfg.steps} steps | {len(runnable)} of {len(names)} strategies to run"
        + (f" + {noise_count} noise runs of {intended_reference}" if noise_count else "")
        + (f" | resume=auto: {len(kept)} kept, {len(continued)} to continue" if cfg.resume == "auto" else "")
        + f" | {out}"
    )
    for line in adopted:
        print(line)
    if note := untimed_note(cfg.steps, cfg.timing_warmup):
        print(note)
    for key, taken in plan.compare_wide_options.items():
        print(f"strategy_options.{key}={json.dumps(taken['value'])} reaches {', '.join(taken['taken_by'])}")
    if plan.deepspeed_config:
        taken = plan.deepspeed_config
        print(f"deepspeed_config={taken['value']} reaches {', '.join(taken['taken_by'])} (the others run no DeepSpeed)")
    for entry in plan.strategies:
        if entry.runs_as is not None:
            print(f"{entry.shown} ({entry.name}): {entry.description}")
            for line in entry.followed:
                print(f"  {line}")
    refused = dict(planned)
    if searched_plan and searched_plan["reference_fitted"]:
        print(searched_plan["reference_fitted"])
    for key, layout in layouts.items():  # how each layout runs here, before any runs
        print(f"{key}: {layout.describe()}")
        for line in (layout.scaled, refused[key] and f"not run: {refused[key]}"):
            if line:
                print(f"  {line}")

    interrupted = False
    searched: dict | None = None
    with StopSignals(out) as stop:
        sweep.stop = stop
        for entry in plan.strategies:
            if entry.skipped is not None:
                sweep.progress.finish(entry.shown, "skipped", entry.skipped)
                continue
            if interrupted:
                sweep.progress.finish(entry.shown, "not run", "the sweep was interrupted before it")
                continue
            result = sweep.run(runs[entry.name])
            interrupted = result.status == "interrupted" or stop.requested is not None
            if entry.name == intended_reference and not interrupted:
                interrupted = not sweep.run_noise(noise, result) or stop.requested is not None
        if cfg.batch_search and not interrupted:
            searched = _batch_search(cfg, sweep, sweep.results, device_type)
            interrupted = bool(searched.get("interrupted"))

        facts, results = sweep.publish("interrupted" if interrupted else "finished", searched)
        if device_type == "cuda":  # the planner's speed model fitted to what this GPU measured
            from harness.plan import calibration_for_report

            facts["calibration"] = calibration_for_report(out)
            write_results(out, facts, results)
        from harness.report import build_report  # matplotlib is only needed once the runs are over

        md_path, html_path = build_report(out)
        _print_summary(results, facts["reference"])
        print(f"results: {out / 'results.json'}\nreport:  {md_path}\n         {html_path}")
        if interrupted:
            stopped_by = stop.requested or "a stop"
            print(f"interrupted ({stopped_by}): the report covers what finished; resume=auto continues the sweep")
            return 130
    return 0 if any(r.ran for r in results) else 1


def processes_for(name: str, nproc: int) -> int:
    """The processes strategy `name` runs on: one where it drives every device from one process
    (single, dataparallel), else the compare's nproc."""
    return 1 if default_registry().get(name).one_process else nproc


class Sweep:
    """Runs strategies and noise runs as supervised launcher jobs into `<out>/<strategy's folder>/`
    and `<out>/noise/<seed>/`, each with its run.json, and rewrites results.json after each."""

    def __init__(
        self,
        cfg: CompareConfig,
        shared: dict[str, Any],
        out: Path,
        nproc: int,
        progress: SweepProgress,
        device_type: str = "cpu",
        shown: dict[str, RunName] | None = None,
        layouts: dict[str, PlannedLayout] | None = None,
    ):
        self.cfg, self.shared, self.out, self.nproc, self.progress = cfg, shared, out, nproc, progress
        self.device_type = device_type
        self.shown = shown or {}  # each strategy's label and folder; a name not in it is both
        self.layouts = layouts or {}  # compare plan=: each layout by its label, run as its strategy
        # One file with the shared options: every run reads the very same configuration
        # (plus, on its command line, the strategy_options section of its own strategy).
        self.train_config = out / "train_config.yaml"
        self.plan: SweepPlan | None = None
        self.decisions: dict[str, str] = {}
        self.results: list[StrategyResult] = []  # as last written to results.json
        self.lock_fd: int | None = None  # the out_dir's lock: every job's leader holds it too
        self.stop: StopSignals | None = None

    def write_train_config(self) -> None:
        OmegaConf.save(OmegaConf.create(self.shared), self.train_config)

    def train_args(self, name: str, run_dir: Path, command: str = "train") -> list[str]:
        layout = self.layouts.get(name)
        deepspeed = run_settings(self.cfg, name, self.layouts)[1].get("deepspeed_config")
        return [
            command,
            f"config={self.train_config}",
            f"strategy={layout.strategy if layout else name}",
            f"out_dir={run_dir}",
            *(layout.train_args() if layout else option_args(self.cfg, name, default_registry())),
            *([f"deepspeed_config={deepspeed}"] if deepspeed else []),
        ]

    def what_to_lower(self, name: str, nproc: int) -> str:
        """The settings that set a run's memory, as it ran them: what an out-of-memory line tells to lower."""
        layout = self.layouts.get(name)
        micro_batch: int | None = layout.micro_batch if layout else None
        if layout is None:
            options = options_for(self.cfg, name, default_registry())
            try:
                mesh = default_registry().mesh_layout(name, nproc, nproc, **options)
                micro_batch = self.cfg.world_batch(mesh.data_parallel(0)[1], data_parallel=mesh.declared)[0]
            except ValueError:  # the run says itself why it could not split the batch
                micro_batch = None
        batch = f"micro_batch={micro_batch}, " if micro_batch is not None else "micro_batch, "
        return f"{batch}seq_len={self.cfg.seq_len} or nproc={nproc}"

    def nproc_for(self, name: str) -> int:
        layout = self.layouts.get(name)
        return layout.nproc if layout else processes_for(name, self.nproc)

    def name_of(self, name: str) -> RunName:
        return self.shown.get(name) or RunName(name, name)

    def strategy_labelled(self, label: str) -> str:
        """The strategy name behind a label of results.json."""
        return next((name for name, shown in self.shown.items() if shown.label == label), label)

    def planned_run(self, name: str, versions: dict[str, Any], noise_seed: int | None = None) -> PlannedRun:
        """Strategy `name`'s run (or its noise run `noise_seed`), with its configuration's identity."""
        strategy, settings = run_settings(self.cfg, name, self.layouts)
        options = {**self.shared, **settings, "strategy": strategy, "noise_seed": noise_seed}
        named = out_dir_named(self.cfg)  # the folder's name, in another form: a renamed compare is the same
        nodes = 1 if self.nproc_for(name) == 1 or self.cfg.launcher == "local" else self.cfg.nodes
        file = default_registry().get(strategy).config_file
        identity = run_identity(
            {key: value for key, value in options.items() if key not in named},
            world_size=self.nproc_for(name),
            nodes=nodes,
            device_type=self.device_type,
            versions=versions,
            files={f"strategy.{key}": path for key, path in file.choice.files.items()} if file else None,
        )
        shown = self.name_of(name)
        if noise_seed is None:
            return PlannedRun(shown.label, name, self.out / shown.folder, self.nproc_for(name), identity)
        return PlannedRun(
            f"{shown.label} noise {noise_seed}",
            name,
            noise_dir(self.out, noise_seed),
            self.nproc_for(name),
            identity,
            noise_seed=noise_seed,
        )

    def start(self, plan: SweepPlan, decisions: dict[str, str]) -> None:
        """Write the plan, the shared options and results.json (every run to come not run yet)."""
        self.plan, self.decisions = plan, decisions
        self.write_train_config()
        plan.write(self.out)
        self.publish("running")

    def publish(self, state: str, searched: dict | None = None) -> tuple[dict[str, Any], list[StrategyResult]]:
        """Rewrite results.json from what the run folders hold now."""
        assert self.plan is not None
        facts, self.results = collect(self.out, self.plan, state)
        facts["wall_time_s"] = time.time() - self.plan.started_unix
        facts["batch_search"] = searched
        write_results(self.out, facts, self.results)
        return facts, self.results

    def run(self, run: PlannedRun) -> StrategyResult:
        """Run (or keep) a strategy; its entry as results.json now holds it."""
        try:
            if self.decisions[run.label] != KEEP:
                self.execute(run)
        except KeyboardInterrupt:  # a stop came before the job started
            self.progress.finish(run.label, "not run", "the sweep was interrupted before it")
            return StrategyResult(name=run.label, status="not run")
        _, results = self.publish("running")
        result = next(r for r in results if r.name == run.label)
        self.progress.finish(run.label, "kept" if result.kept else result.status, _finish_detail(result))
        return result

    def run_noise(self, runs: list[PlannedRun], reference: StrategyResult) -> bool:
        """The noise runs of the reference that just finished (or was kept); False when a stop came."""
        if not runs:
            return True
        if not reference.ran:
            for run in runs:
                self.progress.finish(run.label, "skipped", "the reference did not finish")
            return True
        to_run = [run for run in runs if self.decisions[run.label] != KEEP]
        if to_run:
            self.progress.note(
                f"noise runs: {reference.name} again {len(to_run)} time{'s' if len(to_run) != 1 else ''}, its "
                f"gradients nudged by rounding-sized amounts, {reference.wall_time_s or 0:.0f} s each as the reference "
                "took: the spread a correct backend may show (noise_runs=0 skips them)"
            )
        for run in runs:
            kept = self.decisions[run.label] == KEEP
            try:
                outcome = None if kept else self.execute(run)
            except KeyboardInterrupt:  # a stop came before the job started
                return False
            facts, _ = self.publish("running")
            noise = next(n for n in facts["noise"]["runs"] if n["seed"] == run.noise_seed)
            if noise["status"] == "ok":
                detail = f"{noise['steps']} steps  {noise['wall_time_s']:.1f}s"
                self.progress.finish(run.label, "kept" if kept else "ok", detail)
            else:
                self.progress.finish(run.label, noise["status"], noise["error"])
            if outcome is not None and outcome.kind == "interrupted":
                return False
        return True

    def execute(self, run: PlannedRun) -> JobOutcome:
        """The run's job, with its run.json written before it starts and when it ends."""
        assert self.plan is not None
        if self.stop is not None:
            self.stop.check()
        continued = self.decisions[run.label] == CONTINUE
        _clear_for(run.run_dir, continued)
        record = RunRecord(
            label=run.label,
            strategy=run.strategy,
            nproc=run.nproc,
            sweep_id=self.plan.sweep_id,
            identity=run.identity,
            config_hash=run.config_hash,
            continued=continued,
        )
        record.write(run.run_dir)
        self.progress.start(run.label, run.run_dir / "metrics.jsonl")
        extra = [f"noise_seed={run.noise_seed}"] if run.noise_seed is not None else []
        outcome = self.launch(
            run.strategy,
            run.run_dir,
            [*extra, *(["resume=auto"] if continued else [])],
            on_poll=self.poll,
            job=safe_name(run.label),
            append_log=continued,
        )
        ran = outcome.ok and (run.run_dir / "summary.json").is_file()
        record.ended(run.run_dir, outcome, predicted(run.run_dir) if ran and run.noise_seed is None else None)
        return outcome

    def poll(self) -> None:
        """While a job runs: the progress view, and a stop signal, which run_job answers as Ctrl-C."""
        self.progress.poll()
        if self.stop is not None:
            self.stop.check()

    def launch(
        self,
        name: str,
        run_dir: Path,
        extra: list[str],
        on_poll: Callable[[], None] | None = None,
        command: str = "train",
        log_path: Path | None = None,
        job: str | None = None,
        append_log: bool = False,
    ) -> JobOutcome:
        """`runner.py <command>` (train, or the batch search's probe) for strategy `name` into
        `run_dir`, its output in `log_path` (default run_dir/log.txt). Under SLURM `job` (default
        the strategy's folder) names the script, so that a noise run or a probe does not overwrite
        the strategy's own."""
        nproc = self.nproc_for(name)
        args = [*self.train_args(name, run_dir, command), f"nproc={nproc}", *extra]
        if self.cfg.launcher == "slurm":
            script = self.slurm_script(name, run_dir, args, job)
            cmd = slurm.submit_and_wait_command(script, run_dir / "slurm.log")
        else:
            # As `runner.py train` runs it for a user: one process without torchrun, more under
            # torchrun's agent in that process (on a CPU, each worker forked from it).
            cmd = [sys.executable, RUNNER, *args]
        log_path = log_path or run_dir / "log.txt"
        outcome = run_job(
            cmd,
            log_path=log_path,
            timeout_s=self.cfg.timeout_s,
            env=worker_env(),
            on_poll=on_poll,
            pass_fds=(self.lock_fd,) if self.lock_fd is not None else (),
            append_log=append_log,
            oom_advice=self.what_to_lower(name, nproc),
        )
        if self.cfg.launcher == "slurm" and outcome.kind in ("timeout", "interrupted"):
            slurm.cancel_submitted(log_path.read_text(errors="replace"))
        return outcome

    def slurm_script(self, name: str, run_dir: Path, args: list[str], job: str | None = None) -> Path:
        """Write `<out>/slurm/parabench-<job, default the strategy's folder>.sbatch`: the reference on one
        process, the rest on nodes x gpus_per_node."""
        one = self.nproc_for(name) == 1
        nodes, per_node = (1, 1) if one else (self.cfg.nodes, self.nproc // self.cfg.nodes)
        spec = slurm.SlurmJob(
            name=f"parabench-{job or self.name_of(name).folder}",
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


def _clear_for(run_dir: Path, continued: bool) -> None:
    """Remove what an earlier run left in `run_dir`; a run continued from its checkpoint keeps its
    checkpoints, metrics and log."""
    (run_dir / "summary.json").unlink(missing_ok=True)
    if continued:
        return
    for stale in STALE_RUN_FILES:
        (run_dir / stale).unlink(missing_ok=True)
    for stale in STALE_RUN_DIRS:
        shutil.rmtree(run_dir / stale, ignore_errors=True)


def _listed_with_noise(names: list[str], reference: str | None, count: int) -> list[str]:
    """The sweep's names with the noise runs where they run, for the progress view."""
    if not count:
        return names
    at = names.index(reference) + 1
    return [*names[:at], *(f"{reference} noise {seed}" for seed in range(1, count + 1)), *names[at:]]


def predicted(run_dir: Path) -> dict[str, Any]:
    """What `runner.py plan` predicts for the run in `run_dir`, from its summary.json; a config file
    given as a strategy is planned as the built-in it ran as, with the batch split it followed."""
    from harness.plan import PlanError, prediction_for_run

    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = RunConfig(**summary["config"])
    try:
        runs_as = default_registry().get(cfg.strategy).resolves_to
    except ValueError as exc:  # the file is gone or broken since the run read it
        return {"note": f"the planner could not answer: {exc}"}
    split = (summary.get("micro_batch"), summary.get("grad_accum"))
    if runs_as is not None and None not in split and split[0] * split[1] * summary["world_size"] == cfg.batch_size:
        cfg.micro_batch, cfg.grad_accum = split
    try:
        prediction = prediction_for_run(cfg, summary)
    except (PlanError, ConfigError) as exc:  # a run the planner cannot lay out is still measured
        return {"note": f"the planner could not answer: {exc}"}
    except Exception as exc:  # a planner defect must not end a sweep whose runs are measured
        return {"note": f"the planner failed on this run ({type(exc).__name__}: {exc}); the measurement stands"}
    return {**prediction, "planned_as": runs_as} if runs_as is not None else prediction


def untimed_note(steps: int, timing_warmup: int) -> str | None:
    """Why a sweep will show no tokens/s: throughput leaves out the first `timing_warmup` steps, and
    `steps` leaves none after them; None where some step is timed."""
    if steps > timing_warmup:
        return None
    return (
        f"steps={steps} leaves no step past the first {timing_warmup} (timing_warmup), which throughput leaves "
        f"out: tokens/s and step time will read n/a; give steps={timing_warmup + 1} or more to time them"
    )


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


def _print_slurm_scripts(sweep: Sweep, runnable: list[str], skipped: dict[str, str]) -> int:
    """dry_run=true: write one sbatch script per strategy and print them, and why any other is
    skipped; submit nothing."""
    sweep.write_train_config()  # what the scripts name
    for name in runnable:
        run_dir = sweep.out / sweep.name_of(name).folder
        script = sweep.slurm_script(name, run_dir, sweep.train_args(name, run_dir))
        print(f"# ---- {script}\n{script.read_text()}")
    for name, why in skipped.items():
        print(f"# skipped {sweep.name_of(name).label}: {why}")
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
        registry.get(name)  # an unknown name is an error that lists the known ones; a config file is read
    return names


def _planned(
    registry: StrategyRegistry,
    name: str,
    skipped: str | None,
    shown: RunName,
    followed: list[str],
    layout: PlannedLayout | None = None,
) -> PlannedStrategy:
    if layout is not None:
        return PlannedStrategy(name, layout.describe(), skipped, folder=layout.folder)
    entry = registry.get(name)
    if entry.config_file is None:
        return PlannedStrategy(name, entry.description, skipped)
    return PlannedStrategy(name, entry.description, skipped, shown.label, shown.folder, entry.resolves_to, followed)


def _skip_reason(
    registry: StrategyRegistry,
    name: str,
    device_type: str,
    shared: dict[str, Any] | None = None,
    layouts: dict[str, PlannedLayout] | None = None,
    settings: dict[str, Any] | None = None,
) -> str | None:
    """Why `name` never starts here (with its run's `settings`, from run_settings); a plan's layout
    also where it cannot run as planned."""
    layout = (layouts or {}).get(name)
    entry = registry.get(layout.strategy if layout else name)
    if entry.unavailable_reason:
        return f"unavailable: {entry.unavailable_reason}"
    unsupported = entry.unsupported_reason(device_type, (settings or {}).get("strategy_options"))
    if unsupported:
        return f"unsupported on {device_type}: {unsupported}"
    return from_plan.refusal(layout, shared or {}) if layout else None


def run_settings(cfg: CompareConfig, name: str, layouts: dict[str, PlannedLayout]) -> tuple[str, dict[str, Any]]:
    """(the strategy `name` runs as, what its run sets beyond the shared options): its strategy
    options, and for a plan's layout its micro-batch, accumulation and checkpointing too."""
    layout = layouts.get(name)
    reference = {"precision": FP8_REFERENCE_PRECISION} if name == REFERENCE and cfg.precision == "fp8" else {}
    registry = default_registry()
    if layout is None:
        options = options_for(cfg, name, registry)
        return name, {"strategy_options": options, **deepspeed_config_for(cfg, name, registry), **reference}
    deepspeed = deepspeed_config_for(cfg, layout.strategy, registry)
    return layout.strategy, {**layout.run_settings(), **deepspeed, **reference}


def _plan_layouts(
    cfg: CompareConfig, nproc: int, device_type: str
) -> tuple[CompareConfig, dict[str, PlannedLayout], dict | None]:
    """With plan=: the compare on the plan's model, seq_len and global batch, its `top` best layouts
    by label (each at a micro-batch that fits here: from_plan.fitted_here), and the search result, with
    what fitting changed of the reference under "reference_fitted"; without: the compare as given."""
    if cfg.plan is None:
        return cfg, {}, None
    top = from_plan.DEFAULT_TOP if cfg.top is None else cfg.top
    search = from_plan.read_search(cfg.plan, top)
    from_plan.check_fits_here(search)
    cfg = replace(cfg, **from_plan.plan_settings(search))
    layouts = from_plan.layouts_of(search, top, nproc)
    cfg, layouts, note = from_plan.fitted_here(cfg, layouts, device_type, usable_bytes(device_type))
    return cfg, {layout.label: layout for layout in layouts}, {**search, "reference_fitted": note}


def _preflight(
    cfg: CompareConfig,
    shared: dict[str, Any],
    runnable: list[str],
    nproc: int,
    layouts: dict[str, PlannedLayout] | None = None,
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Bad input fails once, here, as one line, rather than once per strategy. Returns what each
    strategy followed of its config file, in words, and why each that cannot lay out the model
    is skipped."""
    check_writable(cfg.out_dir)
    layouts = layouts or {}
    followed, cannot = {}, {}
    for name in runnable:
        strategy, settings = run_settings(cfg, name, layouts)
        processes = layouts[name].nproc if name in layouts else processes_for(name, nproc)
        # The compare's own out_dir, checked above: the runs' out_dir is per run, and RunConfig's
        # default (runs/train) would be created in the working directory, or refused where it is read-only.
        config = RunConfig(**{**shared, **settings}, strategy=strategy, out_dir=cfg.out_dir)
        try:
            # Under launcher=slurm the runs' device is the compute nodes', not this login node's.
            elsewhere = _slurm_world(cfg)[0] if cfg.launcher == "slurm" else None
            followed[name] = preflight(config, processes, device_type=elsewhere).followed
        except ModelUnsupported as exc:
            cannot[name] = f"cannot run {cfg.model} on {processes} process{'es' if processes > 1 else ''}: {exc}"
    return followed, cannot


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
            searched = _search_one(cfg, sweep, sweep.strategy_labelled(current)).as_result()
            sweep.progress.note(f"batch search: {current}: {batch_search.describe(searched)}")
            found.append(searched)
    except KeyboardInterrupt:
        interrupted = current
        stopped = sweep.out / "batch_search" / sweep.name_of(sweep.strategy_labelled(str(current))).folder
        stopped = stopped / batch_search.SEARCH_FILE
        if stopped.is_file():  # the probes it made before the stop
            found.append(batch_search.load(stopped).as_result())
    return {
        "results": found,
        "wall_time_s": time.monotonic() - started,
        "predicted_within": SEARCH_FRACTION,
        "interrupted": interrupted,
    }


def _search_one(cfg: CompareConfig, sweep: Sweep, name: str) -> batch_search.Search:
    """One strategy's search, its files in <out>/batch_search/<its folder>/ (search.json, a log per job)."""
    nproc = sweep.nproc_for(name)
    shown = sweep.name_of(name)
    folder = sweep.out / "batch_search" / shown.folder
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
        strategy=shown.label,
        world_size=nproc,
        fallback_start=cfg.micro_batch or max(1, cfg.batch_size // nproc),
        job_time_s=cfg.timeout_s,
        in_process=why_not is None,
        note=why_not,
    )
    jobs = itertools.count(1)

    def launch() -> JobOutcome:
        return sweep.launch(
            name,
            folder,
            [],
            on_poll=sweep.poll,
            command="probe",
            log_path=folder / f"job_{next(jobs)}.log",
            job=f"{shown.folder}-probe",
        )

    return batch_search.search(folder / batch_search.SEARCH_FILE, initial, launch)


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
