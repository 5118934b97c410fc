"""The planner: predicts, per strategy and per GPU, memory, communication and step time
for a model size and GPU count not yet run, and recommends a strategy.

    model_shape  what the model is (sizes, every parameter tensor) from any spec
    backends     what each strategy name does, in the planner's terms
    model_states model states per GPU, as each backend's memory_breakdown counts them
    activations  what a micro-batch keeps for backward, from the layer shapes
    buffers      the temporary memory each backend allocates
    comm         collectives, bytes on the wire per step and their time
    speed        step time, tokens/s, scaling efficiency
    predict      all of it for one question, and the peak
    recommendation the plain-words answer
    for_run      the prediction for a run, beside what it measured (the compare records it)
    plots        the charts

The names below are what the other jobs use; the rest is this package's own.
"""

from harness.common.lazy_exports import lazy_exports

_EXPORTS = {
    "PlanError": "model_shape",
    "SEARCH_FRACTION": "batch_limit",
    "largest_micro_batch": "batch_limit",
    "question_for_run": "for_run",
    "prediction_for_run": "for_run",
    "calibration_for_report": "calibration",
    "catalogue_listing": "model_catalogue",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
