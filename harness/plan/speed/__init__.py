"""How long a step takes: each matmul and attention kernel, the step's compute, overlap with
communication, and the factors calibrated on a measured machine."""
