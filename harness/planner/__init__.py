"""The planner: predicts, per strategy and per GPU, memory, communication and step time
for a model size and GPU count not yet run, and recommends a strategy.

    model_shape  what the model is (sizes, every parameter tensor) from any spec
    backends     what each strategy name does, in the planner's terms
    memory       model states per GPU, as each backend's memory_breakdown counts them
    activations  what a micro-batch keeps for backward, from the layer shapes
    buffers      the temporary memory each backend allocates
    comm         collectives, bytes on the wire per step and their time
    speed        step time, tokens/s, scaling efficiency
    predict      all of it for one question, and the peak
    recommend    the plain-words answer
    for_run      the prediction `train` records beside its measurements
    plots        the charts
"""
