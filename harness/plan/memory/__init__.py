"""What a GPU holds: model states by backend, activations, buffers, the recipe's changes, the
capacity it must fit, calibrated corrections and the invariants every plan meets."""
