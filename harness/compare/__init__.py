"""The sweep: every strategy on the same model, data and global batch as its own supervised
job, the noise runs, the loss verdicts, results.json, the batch search and its probes, SLURM,
plus `runner.py compare`.

The names below are what the other jobs use (the report reads results through them); the
rest is this package's own.
"""

from harness.common.lazy_exports import lazy_exports

_EXPORTS = {
    "StrategyResult": "results",
    "ResultsError": "results",
    "load_metrics": "results",
    "read_results": "results",
    "RESULTS_FILE": "results",
    "run_summary": "results",
    "results_for_report": "collect",
    "NoiseBand": "verdict",
    "bound_at": "verdict",
    "floor_of": "verdict",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
