"""The slowest GPU of a synchronous job: every step waits at its collectives for the last GPU to finish
its compute, and GPUs of one model run at different speeds.

Sinha et al., "Not All GPUs Are Created Equal" (arXiv 2208.11035v3; its SC22 abstract's earlier 32%, at most
72%, is revised there), ran the same benchmarks (SGEMM among
them) on over 90% of the GPUs of five clusters (Oak Ridge's Summit, Sandia's Vortex, TACC's Frontera and
Longhorn, Livermore's Corona; NVIDIA's and AMD's, air and water cooled): 8% (at most 22%) performance
variation on average between GPUs of one SKU, from each chip's power management and manufacturing
(outliers up to 1.5x slower beyond it). Their variation is (Q3 + 1.5 IQR) - (Q1 - 1.5 IQR) over the median,
four interquartile ranges (hal-uw/gpu_variability_sc22_artifact plot_script/plot_aggregated.py @ bc84e72e);
a normal's interquartile range is 1.349 standard deviations, so a GPU's speed is taken as a normal draw of
SPREAD = 8% / 5.40 = 1.5% about the median's.
Each GPU keeps its chip, so the same GPU is the slowest every step: a step of N GPUs computes as long as
the slowest of N draws, the median's time over 1 - SPREAD x E[max of N standard normals] (1.42 at 8
GPUs, 3.04 at 512, 3.63 at 4,096). The card's measured rate (MAMF) is one card's, taken as the median's.
"""

from __future__ import annotations

import math
from functools import lru_cache

VARIATION = 0.08  # Sinha et al.'s mean (Q3 + 1.5 IQR) - (Q1 - 1.5 IQR) over the median GPU
WHISKER_SPAN_SIGMAS = 4 * 1.349  # that span for a normal: four interquartile ranges of 1.349 sigma
SPREAD = VARIATION / WHISKER_SPAN_SIGMAS


@lru_cache(maxsize=None)
def expected_max_of_normals(n: int) -> float:
    """E[max of n independent standard normals]: the integral of x n phi(x) Phi(x)^(n-1), by the
    midpoint rule over [-9, 9] (0 for one)."""
    if n <= 1:
        return 0.0
    step, total = 0.005, 0.0
    for i in range(int(18 / step)):
        x = -9 + (i + 0.5) * step
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * cdf ** (n - 1) * step
    return total


def straggler_share(gpus: int) -> float:
    """The compute a step of `gpus` GPUs waits beyond the median GPU's, as a share of it."""
    return 1 / (1 - SPREAD * expected_max_of_normals(gpus)) - 1
