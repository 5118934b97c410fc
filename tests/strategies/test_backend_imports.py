"""A strategy's backend libraries imported before its setup: DeepSpeed without MLflow, which its
autotuner alone would import, and MLflow still importable for the trackers; with them what the
backends import on their first use, so that a launcher forking its workers imports it once for
all of them, not again in every rank."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import NANO, ROOT, env_for_tests

# What an Accelerate ZeRO run would import on its first use, were it not imported before: DeepSpeed
# (and MLflow with it, unhidden) and transformers' HfDeepSpeedConfig, which Accelerate imports, and
# DeepSpeed's Muon optimizer, inductor with it: each a second or more of CPU in every rank.
IMPORTED_ON_FIRST_USE = (
    "deepspeed",
    "mlflow",
    "transformers.integrations.deepspeed",
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "torch._inductor",
)

PROBE = """
import json, sys
from strategies.backend_imports import import_backends
from strategies.registry import default_registry
import_backends(default_registry().get("accelerate-ddp").cls.backend_modules)
print("deepspeed" in sys.modules, "mlflow" in sys.modules)
import_backends(default_registry().get("accelerate-zero2").cls.backend_modules)
before = set(sys.modules)
import runner
assert runner.main(["train", "strategy=accelerate-zero2", "nproc=1", *sys.argv[1:]]) == 0
print(json.dumps(sorted(set(sys.modules) - before)))
import mlflow
print(mlflow.__name__)
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> list[str]:
    """The probe's stdout: Accelerate's backends imported as a launcher forking its workers imports
    them, then a one-step accelerate-zero2 run in the same process."""
    out_dir = tmp_path_factory.mktemp("probe")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, f"out_dir={out_dir}", *NANO, "steps=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for_tests(DS_ACCELERATOR="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


needs_backends = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("deepspeed", "mlflow", "accelerate", "transformers")),
    reason="needs deepspeed, mlflow, accelerate and transformers",
)


@needs_backends
def test_deepspeed_comes_with_accelerate_without_mlflow_which_stays_importable(probed):
    assert probed[0].split() == ["True", "False"]
    assert probed[-1] == "mlflow"


@needs_backends
def test_a_run_imports_nothing_its_backends_import_on_first_use(probed):
    imported = json.loads(next(line for line in probed if line.startswith("[")))
    assert sorted(set(IMPORTED_ON_FIRST_USE) & set(imported)) == []
