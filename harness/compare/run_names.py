"""What a compare calls each strategy and where its run writes.

A registered name (`fsdp`) is both its label and its folder. A config file given as a strategy
(`accelerate:configs/mine.yaml`) is labelled by the file's name (`mine.yaml`), with as many of its
folders as tell two files of one name apart (`a/mine.yaml`, `b/mine.yaml`), and by its kind too
where the label would still be ambiguous (the same file as two kinds, a file named like a
strategy). Its folder is the kind and the label in characters safe on any file system
(`accelerate-mine.yaml`), made unique by a hash of the file's path where two would meet.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from configs.schema import ConfigError
from harness.compare.sweep_plan import NOISE_DIR
from strategies.registry import StrategyRegistry

# Folders of a compare that are not runs: the noise runs, the batch search, SLURM scripts, figures.
RESERVED = frozenset({NOISE_DIR, "batch_search", "slurm", "figures"})
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RunName:
    label: str  # how the progress view, results.json and the report name it
    folder: str  # its run folder under the compare's out_dir


def safe_name(text: str) -> str:
    """`text` as a file name: runs of other characters than letters, digits, '.', '_', '-' as one '-'."""
    return _UNSAFE.sub("-", text).strip("-") or "run"


def run_names(names: list[str], registry: StrategyRegistry) -> dict[str, RunName]:
    """Each strategy name of a compare with its label and folder (all distinct)."""
    files = {name: registry.get(name).config_file for name in names}
    files = {name: file for name, file in files.items() if file is not None}
    found = {name: RunName(name, name) for name in names if name not in files}
    where = {name: (file.kind, file.path.resolve()) for name, file in files.items()}
    for name, place in where.items():
        twice = [other for other, seen in where.items() if seen == place and other != name]
        if twice:
            raise ConfigError(f"strategies= names {place[0]}:{place[1]} twice ({name}, {twice[0]}): list it once")
    labels = _labels({name: path for name, (_, path) in where.items()})
    for name, label in labels.items():
        if label in names or list(labels.values()).count(label) > 1:
            labels[name] = f"{files[name].kind}:{label}"
    used = set(RESERVED) | set(found)
    for name, label in labels.items():
        folder = safe_name(f"{files[name].kind}-{label.replace('/', '-')}")
        if folder in used:
            folder = f"{folder}-{hashlib.sha256(str(where[name]).encode()).hexdigest()[:8]}"
        used.add(folder)
        found[name] = RunName(label, folder)
    return {name: found[name] for name in names}


def _labels(paths: dict[str, Path]) -> dict[str, str]:
    """Each file's shortest tail of its path (file name first, then with parent folders) that no
    other file of the compare shares."""
    labels = {}
    for name, path in paths.items():
        others = [other for other_name, other in paths.items() if other_name != name and other != path]
        for depth in range(1, len(path.parts) + 1):
            tail = "/".join(path.parts[-depth:])
            if not any("/".join(other.parts[-depth:]) == tail for other in others):
                break
        labels[name] = tail
    return labels
