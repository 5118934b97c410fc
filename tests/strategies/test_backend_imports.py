"""A strategy's backend libraries imported before its setup: DeepSpeed without MLflow, which its
autotuner alone would import, and MLflow still importable for the trackers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PROBE = """
import sys
from strategies.backend_imports import import_backends
import_backends(["deepspeed", "deepspeed"])
print("deepspeed" in sys.modules, "mlflow" in sys.modules)
import mlflow
print(mlflow.__name__)
"""


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("deepspeed", "mlflow")), reason="needs deepspeed and mlflow"
)
def test_deepspeed_is_imported_without_mlflow_which_stays_importable():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "False", "mlflow"]
