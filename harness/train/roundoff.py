"""Each precision's unit roundoff: half the spacing of numbers near 1 in its significand, one
rounding step (the size of a noise run's nudge, the verdict's floor). Kept apart from noise.py so
that the compare's own process reads it without importing torch."""

UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
