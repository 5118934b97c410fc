"""`compare resume=`: what a compare does with the runs an earlier compare left in its out_dir.

    resume=auto   keep each run (strategy or noise run) whose folder holds a finished run of the
                  same configuration; continue one that was stopped midway (interrupted, or
                  killed with its compare) from its last checkpoint where it wrote one, else
                  start it again; run the rest. A run folder of another configuration is a
                  one-line error naming what differs: a report never mixes two.
    resume=never  run everything again; the earlier runs' files are replaced (the explicit way to
                  overwrite an earlier compare).
    (unset)       run everything, into an out_dir that holds no earlier compare: one that holds
                  one, finished or stopped midway, is an error naming the ways on (resume=auto,
                  resume=never, another out_dir): earlier results are never replaced unasked.

Each run's folder says what it holds (run.json: harness/compare/run_record.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.schema import ConfigError
from harness.compare.identity import changed_configuration, identity_hash, recorded_as_now
from harness.compare.results import RESULTS_FILE
from harness.compare.run_record import RunRecord, read_record

RESUME_MODES = ("auto", "never")
KEEP, CONTINUE, FRESH = "keep", "continue", "fresh"
CHECKPOINT_DIR = "checkpoints"  # where `train` writes a run's checkpoints, in its out_dir


@dataclass(frozen=True)
class PlannedRun:
    """One job of the sweep that trains: a strategy, or a noise run of the reference."""

    label: str  # "ddp", "single noise 1"
    strategy: str
    run_dir: Path
    nproc: int
    identity: dict[str, Any]
    noise_seed: int | None = None  # a noise run's; None: the strategy's own run

    @property
    def config_hash(self) -> str:
        return identity_hash(self.identity)


def check_mode(resume: str | None) -> None:
    if resume is not None and resume not in RESUME_MODES:
        raise ConfigError(
            f"resume={resume!r}: a compare takes resume=auto (keep the finished runs of the same configuration "
            "in out_dir, continue the rest) or resume=never (run everything again)"
        )


def decide(runs: list[PlannedRun], resume: str | None, out_dir: Path) -> dict[str, str]:
    """KEEP, CONTINUE or FRESH for each run's label; raises a one-line error where the out_dir
    holds another configuration (resume=auto) or a compare stopped midway (resume unset)."""
    records = {run.label: read_record(run.run_dir) for run in runs}
    if resume == "never":
        return {run.label: FRESH for run in runs}
    if resume is None:
        midway = [label for label, record in records.items() if record is not None and record.stopped_midway]
        finished = [label for label, record in records.items() if record is not None and record.finished]
        if midway or _earlier_sweep_unfinished(out_dir):
            raise ConfigError(
                f"{out_dir} holds a compare that was stopped midway ({_listing(finished, midway)}): continue it "
                "with resume=auto, run it all again with resume=never, or give another out_dir"
            )
        if finished or (out_dir / RESULTS_FILE).is_file():
            held = _listing(finished, []) if finished else _earlier_strategies(out_dir)
            raise ConfigError(
                f"{out_dir} holds a finished compare ({held}): keep its runs and run what is "
                "missing with resume=auto, replace them all with resume=never, or give another out_dir"
            )
        return {run.label: FRESH for run in runs}
    for run in runs:
        record = records[run.label]
        earlier = recorded_as_now(record.identity, run.identity) if record is not None else None
        if earlier is not None and earlier != run.identity:
            raise changed_configuration(out_dir, run.label, earlier, run.identity)
    return {run.label: _decision(run, records[run.label]) for run in runs}


def _earlier_sweep_unfinished(out_dir: Path) -> bool:
    """Whether the compare that last wrote results.json there stopped before its end (between two
    runs, where no run folder shows it)."""
    try:
        state = json.loads((out_dir / RESULTS_FILE).read_text()).get("state")
    except (OSError, ValueError, AttributeError):
        return False
    return state in ("running", "interrupted", "stopped")


def _earlier_strategies(out_dir: Path) -> str:
    """The strategies the compare that wrote results.json there ran, where none is one of this
    compare's runs."""
    try:
        names = [entry["name"] for entry in json.loads((out_dir / RESULTS_FILE).read_text())["strategies"]]
    except (OSError, ValueError, KeyError, TypeError):
        return "its results.json"
    return f"of {', '.join(names)}" if names else "of no strategy"


def _decision(run: PlannedRun, record: RunRecord | None) -> str:
    if record is None:
        return FRESH
    if record.finished and (run.run_dir / "summary.json").is_file():
        return KEEP
    if record.stopped_midway and _has_checkpoints(run.run_dir):
        return CONTINUE
    return FRESH


def _has_checkpoints(run_dir: Path) -> bool:
    folder = run_dir / CHECKPOINT_DIR
    return folder.is_dir() and any(folder.iterdir())


def _listing(finished: list[str], midway: list[str]) -> str:
    done = f"{', '.join(finished)} finished" if finished else "none finished"
    return f"{done}; {', '.join(midway)} stopped" if midway else done
