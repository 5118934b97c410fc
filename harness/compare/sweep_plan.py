"""compare.json: what a compare set out to do, written once when it starts: the strategies in
order (and why any is skipped), the noise runs, the runs kept from an earlier compare, and the
facts of the sweep (command, devices, precision). With the run folders it is all that
results.json is made of (harness/compare/collect.py): a compare killed by anything leaves
enough behind for `runner.py report` to rebuild its results.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.compare.atomic_file import write_json_atomically

PLAN_FILE = "compare.json"
NOISE_DIR = "noise"


@dataclass
class PlannedStrategy:
    name: str  # as given: `fsdp`, `accelerate:configs/mine.yaml`
    description: str
    skipped: str | None = None  # why it never starts here (unavailable, unsupported); None: it runs
    # A config file's label and folder (harness/compare/run_names.py); None: the name is both.
    label: str | None = None
    folder: str | None = None
    runs_as: str | None = None  # the built-in a config file runs as
    followed: list[str] = field(default_factory=list)  # what its strategy followed of the file, in words

    @property
    def shown(self) -> str:
        return self.label or self.name

    @property
    def run_folder(self) -> str:
        return self.folder or self.name


@dataclass
class SweepPlan:
    sweep_id: str
    command: str
    started_at: str  # ISO 8601, for people
    started_unix: float
    config: dict[str, Any]  # the compare's options as resolved, defaults included
    precision: str
    tolerance: float  # the verdicts' rule without noise runs
    device_type: str
    nproc: int
    host: str
    versions: dict[str, Any]
    strategies: list[PlannedStrategy]
    noise_reference: str | None  # the label of the strategy the noise runs repeat
    noise_runs: int
    kept: list[str] = field(default_factory=list)  # labels of the runs kept from an earlier compare
    # `strategy_options.<key>=` given for the whole compare: {key: {"value": ..., "taken_by": [labels]}},
    # the strategies that have the option (the others run without it).
    compare_wide_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # deepspeed_config= given for the compare: {"value": ..., "taken_by": [labels]}, the strategies that run
    # DeepSpeed (the others run without it); None where none was given.
    deepspeed_config: dict[str, Any] | None = None
    # compare plan=: the plan file, the question it answered and each layout's planned figures
    # and settings here (harness/compare/from_plan.py plan_facts).
    from_plan: dict[str, Any] | None = None

    def noise_label(self, seed: int) -> str:
        return f"{self.noise_reference} noise {seed}"

    def write(self, out_dir: Path) -> None:
        write_json_atomically(out_dir / PLAN_FILE, asdict(self))


def noise_dir(out_dir: Path, seed: int) -> Path:
    return out_dir / NOISE_DIR / str(seed)


def read_plan(out_dir: Path) -> SweepPlan | None:
    """The plan of the compare that last started in `out_dir`; None where there is none readable."""
    try:
        data = json.loads((out_dir / PLAN_FILE).read_text())
        data["strategies"] = [PlannedStrategy(**entry) for entry in data["strategies"]]
        return SweepPlan(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None
