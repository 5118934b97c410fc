"""The planner: predicts, per strategy and per GPU, memory, communication and step time
for a model size and GPU count not yet run, and recommends a strategy. By concern:

    model/       what the model is (sizes, every parameter tensor) from any spec, the catalogue
    parallel/    how each strategy lays it over the GPUs: backends, tp, pp, cp, the batch split
    memory/      what a GPU holds: model states, activations, buffers, recipes, capacity
    network/     the cluster's fabric, NCCL's cost model, the collectives of each layout
    speed/       compute by kernel, step time, tokens/s, calibration on a measured machine
    search/      every layout for a model, a cluster and a global batch, ranked
    predict      all of it for one question, and the peak
    recommendation, what_if   the plain-words answer
    for_run      the prediction for a run, beside what it measured (the compare records it)
    plan_cli, plan_options, plots   the command, its options and its charts

The names below are what the other jobs use; the rest is this package's own.
"""

from harness.common.lazy_exports import lazy_exports

_EXPORTS = {
    "PlanError": "model.model_shape",
    "SEARCH_FRACTION": "memory.batch_limit",
    "largest_micro_batch": "memory.batch_limit",
    "question_for_run": "for_run",
    "prediction_for_run": "for_run",
    "peak_for_run": "for_run",
    "calibration_for_report": "speed.calibration",
    "catalogue_listing": "model.model_catalogue",
    "CHECKPOINTING": "speed.compute",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
