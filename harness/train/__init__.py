"""One training run: the loop every strategy shares, its optimizer and schedule, metrics,
profiling, checkpoints, random state, determinism, the process group and local launching,
plus `runner.py train`, `list` and `export`.

The names below are what the other jobs use; the rest is this package's own.
"""

from harness.common.lazy_exports import lazy_exports

_EXPORTS = {
    "RUNNER": "launch",
    "worker_env": "launch",
    "DistEnv": "distributed",
    "init_distributed": "distributed",
    "shutdown_distributed": "distributed",
    "preflight": "run_checks",
    "RUN_FILES": "run_checks",
    "RUN_FOLDERS": "run_checks",
    "refuse_a_train_run": "run_checks",
    "adopt_file_settings": "file_settings",
    "built": "loop",
    "library_versions": "loop",
    "UNIT_ROUNDOFF": "roundoff",
    "MLFLOW_DB": "trackers",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
