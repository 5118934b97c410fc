"""results.json: one entry per strategy (ran, failed or skipped) and the sweep's facts.

Each entry carries what the report needs without the run folders (status, error,
throughput, memory, the loss verdict against the reference); the loss curves
themselves stay in each run's metrics.jsonl, which `report` reads again. The compare
rewrites the file, whole, after every run (harness/compare/collect.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.compare.atomic_file import write_json_atomically
from harness.compare.run_record import RunRecord
from harness.compare.supervise import JobOutcome
from harness.compare.verdict import NoiseBand, at_capacity, judge

RESULTS_FILE = "results.json"
# 2: verdicts against measured noise (verdict_kind, noise_ratio, the sweep's "noise");
# 3: the batch search's prediction, probes and times;
# 4: rewritten after every run: the sweep's state, each run's configuration hash, the runs kept from before.
# 5: config files as strategies: an entry's strategy as given, the built-in it ran as, what it followed.
# 6: compare plan=: the sweep's "from_plan" (the search file, each layout's planned figures and settings here).
# 7: the sweep's "deepspeed_config": the file given and the strategies it reached.
FORMAT_VERSION = 7
# Figures copied from each run's summary.json.
SUMMARY_FIELDS = (
    "final_loss",
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "peak_mem_allocated_bytes",
    "peak_mem_reserved_bytes",
    "mem_params_bytes",
    "mem_grads_bytes",
    "mem_optimizer_bytes",
    "loss_dtype",
    "resumed_from_step",
)


# A run whose run.json has no outcome: its compare was killed while it ran (the job with it).
KILLED = "stopped with its compare before it ended (the compare was killed): resume=auto continues it"


class ResultsError(ValueError):
    """A compare folder without usable results (one line, says what to do)."""


@dataclass
class StrategyResult:
    name: str  # as the compare labels it (harness/compare/run_names.py)
    description: str = ""
    # A config file given as a strategy: the strategy as given (`accelerate:configs/mine.yaml`), the
    # built-in it ran as and what it followed of the file; None and empty for a registered name.
    strategy: str | None = None
    runs_as: str | None = None
    followed: list[str] = field(default_factory=list)
    # ok (ran to the end), failed (error_kind says how), skipped (never started: unavailable or
    # unsupported here), interrupted (stopped by Ctrl-C, SIGTERM or SIGHUP, or killed with the compare),
    # not run (after those, or not reached yet).
    status: str = "ok"
    error_kind: str | None = None  # oom | crash | signal | timeout | interrupted
    error: str | None = None  # one line: the reason it failed or was skipped
    log_tail: list[str] = field(default_factory=list)
    nproc: int | None = None
    run_dir: str | None = None  # relative to the compare folder
    wall_time_s: float | None = None
    steps_done: int = 0
    final_loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    # Per rank (the maximum over ranks); peak figures are None on CPU, where nothing measures them.
    peak_mem_allocated_bytes: int | None = None
    peak_mem_reserved_bytes: int | None = None
    mem_params_bytes: int | None = None
    mem_grads_bytes: int | None = None
    mem_optimizer_bytes: int | None = None
    prediction: dict[str, Any] | None = None  # the planner's figures for the run, beside what it measured
    loss_dtype: str | None = None  # the dtype the backend returned the loss in (its resolution)
    # Against the reference (harness/compare/verdict.py): the largest relative loss difference over all
    # steps, the first step past what is allowed (None: never), and the largest share of the
    # allowed bound used at any step (over 1: differs).
    max_rel_loss_diff: float | None = None
    first_step_differs: int | None = None
    noise_ratio: float | None = None
    verdict_kind: str | None = None  # reference | matches | within noise | differs | not comparable
    matches_reference: bool | None = None  # matches or within noise
    verdict: str = ""
    config_hash: str | None = None  # of the run's configuration (harness/compare/identity.py)
    kept: bool = False  # finished in an earlier compare into this folder, kept by resume=auto
    resumed_from_step: int | None = None  # continued from its own checkpoint at this step (0: from the start)

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    @property
    def model_state_bytes(self) -> int | None:
        parts = (self.mem_params_bytes, self.mem_grads_bytes, self.mem_optimizer_bytes)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StrategyResult":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def from_run(
    name: str, description: str, nproc: int, run_dir: Path, compare_dir: Path, outcome: JobOutcome
) -> StrategyResult:
    """The entry for a strategy that was started, from its outcome and whatever it wrote."""
    result = StrategyResult(
        name=name,
        description=description,
        nproc=nproc,
        run_dir=str(run_dir.relative_to(compare_dir)),
        wall_time_s=outcome.wall_time_s,
        steps_done=len(load_metrics(run_dir)),
    )
    summary_path = run_dir / "summary.json"
    if outcome.ok and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        for key in SUMMARY_FIELDS:
            setattr(result, key, summary.get(key))
        result.description = summary.get("description") or description
        return result
    result.status = "interrupted" if outcome.kind == "interrupted" else "failed"
    result.error_kind = outcome.kind or "crash"
    result.error = outcome.message if not outcome.ok else "exited 0 but wrote no summary.json"
    result.log_tail = outcome.log_tail
    return result


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's per-step rows (empty when it logged none); a torn last line is left out."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def pick_reference(results: list[StrategyResult]) -> StrategyResult | None:
    """`single` when it ran; otherwise the first strategy that did (named as such in the report)."""
    ran = [r for r in results if r.ran]
    return next((r for r in ran if r.name == "single"), ran[0] if ran else None)


def assign_verdicts(
    results: list[StrategyResult], compare_dir: Path, *, precision: str, tolerance: float, band: NoiseBand | None
) -> str | None:
    """Fill each finished strategy's loss verdict against the reference (judged against `band`
    where the compare measured one, else against the fixed `tolerance`); returns the reference's name."""
    reference = pick_reference(results)
    if reference is None:
        return None
    ref_rows = load_metrics(compare_dir / str(reference.run_dir))
    for result in results:
        if not result.ran:
            continue
        if result is reference:
            result.max_rel_loss_diff, result.first_step_differs = 0.0, None
            result.verdict_kind, result.matches_reference, result.verdict = "reference", True, "reference"
            continue
        verdict = judge(
            load_metrics(compare_dir / str(result.run_dir)),
            ref_rows,
            band,
            precision=precision,
            tolerance=tolerance,
            loss_dtype=result.loss_dtype,
            reference_loss_dtype=reference.loss_dtype,
        )
        verdict = at_capacity(verdict, _capacity_factor(compare_dir, result), _capacity_factor(compare_dir, reference))
        result.max_rel_loss_diff, result.first_step_differs = verdict.max_rel_diff, verdict.first_step_over
        result.noise_ratio, result.verdict_kind, result.verdict = verdict.noise_ratio, verdict.kind, verdict.text
        result.matches_reference = verdict.agrees
    return reference.name


def run_summary(compare_dir: Path, result: StrategyResult) -> dict[str, Any]:
    """The summary.json a compare's run wrote in its folder; {} where it wrote none."""
    path = compare_dir / str(result.run_dir) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _capacity_factor(compare_dir: Path, result: StrategyResult) -> Any:
    """The capacity factor a run's experts dropped tokens at (its summary's router); None: dropless or no experts."""
    return (run_summary(compare_dir, result).get("router") or {}).get("capacity_factor")


def from_record(name: str, description: str, run_dir: Path, compare_dir: Path, record: RunRecord) -> StrategyResult:
    """The entry for a run from what its folder holds (run.json, summary.json, metrics.jsonl)."""
    outcome = record.job_outcome
    result = from_run(
        name, description, record.nproc, run_dir, compare_dir, outcome or JobOutcome(None, "interrupted", KILLED)
    )
    if outcome is None:
        result.wall_time_s = None  # it never ended under the compare's watch
    result.config_hash, result.prediction = record.config_hash, record.prediction if result.ran else None
    return result


def write_results(compare_dir: Path, sweep: dict[str, Any], results: list[StrategyResult]) -> Path:
    """Write results.json whole or not at all: a compare killed at any moment leaves a readable one."""
    doc = {"format": FORMAT_VERSION, **sweep, "strategies": [asdict(r) for r in results]}
    path = compare_dir / RESULTS_FILE
    write_json_atomically(path, doc)
    return path


RUN_AGAIN = "run `runner.py compare` again"


def read_results(compare_dir: Path, fix: str = RUN_AGAIN) -> tuple[dict[str, Any], list[StrategyResult]]:
    """(the sweep's facts, the entries) from `<compare_dir>/results.json`; `fix` ends the line
    where it is not a results file."""
    path = compare_dir / RESULTS_FILE
    if not path.is_file():
        raise ResultsError(f"{compare_dir} has no {RESULTS_FILE}: give the out_dir of a `runner.py compare` run")
    try:
        doc = json.loads(path.read_text())
        results = [StrategyResult.from_dict(entry) for entry in doc.pop("strategies")]
    except (ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path} is not a parabench results file ({exc}): {fix}") from None
    return doc, results
