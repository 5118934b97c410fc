"""run.json: what a compare knows of one of its runs, kept in the run's folder.

Written when the job starts (which compare started it, its configuration's identity and hash)
and again when the job ends (how it ended, what the planner predicted for it). A folder whose
run.json has no outcome holds a run that was killed with its compare. So a run folder says by
itself whether it holds a finished run of a given configuration: what `resume=auto` keeps,
and what `runner.py report` rebuilds results.json from.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.compare.atomic_file import write_json_atomically
from harness.compare.supervise import JobOutcome

RUN_RECORD = "run.json"


@dataclass
class RunRecord:
    label: str  # as the compare lists it: "ddp", "single noise 1"
    strategy: str
    nproc: int
    sweep_id: str  # the compare that started the run
    identity: dict[str, Any]  # harness/compare/identity.py
    config_hash: str
    started_unix: float = field(default_factory=time.time)
    continued: bool = False  # started with resume=auto, from its own last checkpoint where it wrote one
    outcome: dict[str, Any] | None = None  # JobOutcome's fields once the job ended
    ended_unix: float | None = None
    prediction: dict[str, Any] | None = None  # the planner's figures for a run that finished

    @property
    def job_outcome(self) -> JobOutcome | None:
        return JobOutcome(**self.outcome) if self.outcome is not None else None

    @property
    def finished(self) -> bool:
        """Ran to its end (exit 0 and a summary.json, which from_run checks)."""
        return self.outcome is not None and self.outcome["kind"] is None

    @property
    def stopped_midway(self) -> bool:
        """Interrupted, or killed with its compare: what resume=auto continues."""
        return self.outcome is None or self.outcome["kind"] == "interrupted"

    def write(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomically(run_dir / RUN_RECORD, asdict(self))

    def ended(self, run_dir: Path, outcome: JobOutcome, prediction: dict[str, Any] | None = None) -> None:
        self.outcome, self.ended_unix, self.prediction = asdict(outcome), time.time(), prediction
        self.write(run_dir)


def read_record(run_dir: Path) -> RunRecord | None:
    """The folder's record, or None where there is none (never started by a compare, or unreadable:
    then nothing in the folder can be trusted to be a given configuration's run)."""
    try:
        return RunRecord(**json.loads((run_dir / RUN_RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None
