"""results.json made from what is on the disk: the compare's plan (compare.json) and each run
folder's run.json, summary.json and metrics.jsonl. The compare rewrites it so after every run;
`runner.py report` makes it again where results.json is missing, or older than the run folders
(the compare was killed before it could write them).

A run folder counts for the compare in the plan where that compare started the run, or kept
it from an earlier one (resume=auto); anything else in it is an earlier compare's, to be run
again, and is listed as not run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness.compare.out_dir_lock import is_locked
from harness.compare.results import (
    KILLED,
    RESULTS_FILE,
    RUN_AGAIN,
    StrategyResult,
    assign_verdicts,
    from_record,
    load_metrics,
    pick_reference,
    read_results,
    run_summary,
    write_results,
)
from harness.compare.run_record import RUN_RECORD, RunRecord, read_record
from harness.compare.supervise import JobOutcome
from harness.compare.sweep_plan import PlannedStrategy, SweepPlan, noise_dir, read_plan
from harness.compare.verdict import NoiseBand, measure_noise

# The sweep's state, as results.json records it. running: the compare is at work; finished: it ran
# everything; interrupted: Ctrl-C, SIGTERM or SIGHUP stopped it and it wrote its results; stopped: it
# was killed before it could (results made again by `runner.py report`). What a run not started is then:
NOT_REACHED = {
    "running": "not reached yet: the compare is still running",
    "interrupted": "the sweep was interrupted before it",
    "stopped": "the compare was stopped (killed) before it: resume=auto runs it",
}
REBUILT = "rebuilt from the run folders by `runner.py report`: the compare was stopped before it wrote them"
REBUILT_ENDED = "rebuilt from the run folders by `runner.py report`: every run had ended, its results file lost"
REMAKE = "remove it, and `runner.py report {out}` makes it again from the run folders"


def collect(out: Path, plan: SweepPlan, state: str) -> tuple[dict[str, Any], list[StrategyResult]]:
    """(the sweep's facts, an entry per planned strategy with its verdict) as the disk has them."""
    results = [_strategy_result(out, plan, entry, state) for entry in plan.strategies]
    noise, band = _noise(out, plan, results, state)
    reference = assign_verdicts(results, out, precision=plan.precision, tolerance=plan.tolerance, band=band)
    summary = _first_summary(out, results)
    facts = {
        "state": state,
        "interrupted": state in ("interrupted", "stopped"),
        "sweep_id": plan.sweep_id,
        "command": plan.command,
        "started_at": plan.started_at,
        "wall_time_s": _last_activity(out, plan) - plan.started_unix,
        "config": plan.config,
        "precision": plan.precision,
        "tolerance": plan.tolerance,
        "reference": reference,
        "device_type": plan.device_type,
        "nproc": plan.nproc,
        "kept": plan.kept,
        "compare_wide_options": plan.compare_wide_options,
        "deepspeed_config": plan.deepspeed_config,
        "from_plan": plan.from_plan,
        "loss_floor": summary.get("loss_floor"),
        "model": {
            "name": plan.config.get("model"),
            "num_params": summary.get("num_params"),
            "flops_per_token": summary.get("flops_per_token"),
        },
        "environment": {
            "device": summary.get("device") or plan.device_type,
            "devices": plan.nproc,
            "world_size": plan.nproc,
            "host": plan.host,
            "versions": summary.get("versions") or plan.versions,
        },
        "noise": noise,
        "batch_search": None,
    }
    return facts, results


def results_for_report(out: Path) -> tuple[dict[str, Any], list[StrategyResult]]:
    """results.json, or where it is missing or older than the run folders and no compare is at
    work there, the results made again from the folders (and written, so that they stay)."""
    plan = read_plan(out)
    results_path = out / RESULTS_FILE
    if plan is None or is_locked(out) or not _stale(out, plan, results_path):
        # With the plan here a damaged results.json is made again from the run folders, as a missing one
        # is; `runner.py compare` again would refuse this out_dir, which holds that compare's runs.
        return read_results(out, RUN_AGAIN if plan is None else REMAKE.format(out=out))
    ended = _every_run_ended(out, plan)
    facts, results = collect(out, plan, "finished" if ended else "stopped")
    facts["rebuilt"] = REBUILT_ENDED if ended else REBUILT
    write_results(out, facts, results)
    return facts, results


def _every_run_ended(out: Path, plan: SweepPlan) -> bool:
    """Whether every run the compare planned (noise runs too) ended, as its run.json says: a results
    file lost after the compare finished, not a compare killed or interrupted before its end."""
    folders = [out / entry.run_folder for entry in plan.strategies if entry.skipped is None]
    folders += [noise_dir(out, seed) for seed in range(1, plan.noise_runs + 1)]
    records = [read_record(folder) for folder in folders]
    return all(_counts(record, plan) and not record.stopped_midway for record in records)  # type: ignore[union-attr]


def _stale(out: Path, plan: SweepPlan, results_path: Path) -> bool:
    if not results_path.is_file():
        return True
    written = results_path.stat().st_mtime_ns
    return any(path.stat().st_mtime_ns > written for path in _run_files(out, plan))


def _run_files(out: Path, plan: SweepPlan) -> list[Path]:
    folders = [out / entry.run_folder for entry in plan.strategies if entry.skipped is None]
    folders += [noise_dir(out, seed) for seed in range(1, plan.noise_runs + 1)]
    names = (RUN_RECORD, "summary.json", "metrics.jsonl")
    return [folder / name for folder in folders for name in names if (folder / name).is_file()]


def _last_activity(out: Path, plan: SweepPlan) -> float:
    """When this compare last did something: the newest of its runs' files, or now while it starts."""
    times = [path.stat().st_mtime for path in _run_files(out, plan)]
    return max([plan.started_unix, *times]) if times else time.time()


def _counts(record: RunRecord | None, plan: SweepPlan) -> bool:
    return record is not None and (record.sweep_id == plan.sweep_id or record.label in plan.kept)


def _strategy_result(out: Path, plan: SweepPlan, entry: PlannedStrategy, state: str) -> StrategyResult:
    result = _outcome(out, plan, entry, state)
    if entry.label is not None:  # a config file given as a strategy
        result.strategy, result.runs_as, result.followed = entry.name, entry.runs_as, list(entry.followed)
    return result


def _outcome(out: Path, plan: SweepPlan, entry: PlannedStrategy, state: str) -> StrategyResult:
    if entry.skipped is not None:
        return StrategyResult(name=entry.shown, description=entry.description, status="skipped", error=entry.skipped)
    run_dir = out / entry.run_folder
    record = read_record(run_dir)
    if not _counts(record, plan):
        reason = NOT_REACHED.get(state, NOT_REACHED["interrupted"])
        return StrategyResult(name=entry.shown, description=entry.description, status="not run", error=reason)
    assert record is not None
    result = from_record(entry.shown, entry.description, run_dir, out, record)
    result.kept = record.label in plan.kept
    return result


def _noise(
    out: Path, plan: SweepPlan, results: list[StrategyResult], state: str
) -> tuple[dict[str, Any], NoiseBand | None]:
    """What results.json records of the noise runs (the runs, the band and its rule, or why there
    is none), and the band the verdicts are judged against."""
    runs = []
    for seed in range(1, plan.noise_runs + 1):
        run_dir = noise_dir(out, seed)
        record = read_record(run_dir)
        if not _counts(record, plan):
            continue
        assert record is not None
        outcome = record.job_outcome or JobOutcome(None, "interrupted", KILLED)
        runs.append(
            {
                "seed": seed,
                "run_dir": str(run_dir.relative_to(out)),
                "status": "ok" if outcome.ok else outcome.kind,
                "error": None if outcome.ok else outcome.message,
                "steps": len(load_metrics(run_dir)),
                "wall_time_s": outcome.wall_time_s,
                "kept": record.label in plan.kept,
            }
        )
    band, skipped = _band(out, plan, results, runs, state)
    facts = {
        "reference": plan.noise_reference,
        "runs": runs,
        "skipped": skipped,
        "band": band.as_dict() if band else None,
    }
    return facts, band


def _band(
    out: Path, plan: SweepPlan, results: list[StrategyResult], runs: list[dict[str, Any]], state: str
) -> tuple[NoiseBand | None, str | None]:
    """The measured band, or None and the reason there is none to judge by."""
    if not plan.noise_runs or plan.noise_reference is None:
        return None, "noise_runs=0: verdicts use the fixed loss_tolerance"
    ran = {r.name: r for r in results}
    intended = ran.get(plan.noise_reference)
    if intended is None or not intended.ran:
        if state == "running":
            return None, f"not measured yet: {plan.noise_reference} has not finished"
        return None, f"the reference {plan.noise_reference} did not finish: verdicts use the fixed loss_tolerance"
    reference = pick_reference(results)
    if reference is None or reference.name != plan.noise_reference:
        return None, f"the noise runs are of {plan.noise_reference}, which is not the reference here"
    reference_rows = load_metrics(out / str(reference.run_dir))
    curves = [load_metrics(out / run["run_dir"]) for run in runs if run["status"] == "ok"]
    curves = [rows for rows in curves if len(rows) == len(reference_rows)]
    if not curves:
        if state == "running":
            return None, "not measured yet: no noise run has finished"
        return None, "no noise run finished: verdicts use the fixed loss_tolerance"
    return measure_noise(reference_rows, curves), None


def _first_summary(out: Path, results: list[StrategyResult]) -> dict[str, Any]:
    for result in results:
        summary = run_summary(out, result) if result.ran else {}
        if summary:
            return summary
    return {}
