"""Files a compare rewrites while it runs (results.json, each run's run.json): a reader, or a
compare killed mid-write, sees the old content or the new, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, doc: Any) -> None:
    """Write `doc` as indented JSON to a file beside `path`, flush it to the disk, then rename it over `path`."""
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
