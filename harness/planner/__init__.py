"""The planner: predicts, per strategy and per GPU, memory, communication and step time
for a model size and GPU count not yet run, and recommends a strategy.

    model_shape  what the model is (sizes, every parameter tensor) from any spec
    backends     what each strategy name does, in the planner's terms
    memory       model states, activations, backend buffers, peak
    comm         bytes on the wire per step and their time
    speed        step time, tokens/s, scaling efficiency
    recommend    the plain-words answer
    plan         all of it for one question (used by `runner.py plan` and `train`)
    plots        the charts
"""
