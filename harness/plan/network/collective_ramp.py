"""A collective across nodes below the sizes where it reaches its bus bandwidth, as measured.

NCCL's model (nccl_tuning.py) times a collective as a latency plus its bytes at the algorithm's
rate, so it reaches that rate within a few latencies: a few hundred microseconds. Whole nccl-tests
sweeps on ten clusters of 2 to 8 nodes (bench/data/nccl_tests_sweeps.csv: H100 on InfiniBand NDR and
on EFA, A3 Mega's TCPXO, A100 on RoCE) reach it over milliseconds: on InfiniBand half of it where the
bytes take about 250 us at that rate, 90% at 2 ms; on EFA 43% at 250 us. The sweeps' large sizes agree
with the model within a few percent; from 1 to 256 MiB it was 1.3-1.5x fast. Which of NCCL's
mechanisms holds the rate back there (fewer channels or threads below some sizes, smaller chunks,
the protocols' and proxies' per-chunk costs) is not measured apart in any source, so the share is
taken as measured, by network kind and by the time the bytes take at the large-size rate
(collective_ramp.json, written by bench/collective_ramp.py from those sweeps): a collective takes
the longer of NCCL's model and its bytes at the measured share of its large-size rate. The sweeps
are all-reduces; all-gathers, reduce-scatters and a pipeline's sends take the same shares (the p5
all-gather rows of bench/data/nccl_tests_published.csv, another source, ramp alike: 2 nodes at 256
MiB planned 42% fast with the model alone, 7% with the shares).

Inside a node two kinds were measured. A DGX H100's sweep runs NVLS from 2 MiB: NVLS takes that
sweep's shares (`nvls`; the B200 node's NVLS rows of bench/data/nccl_tests_published.csv, from another
source, run slower than the model as it does: 64 MiB planned 76% fast, 1 GiB 13%). An A100 node's
sweeps over 2, 4 and 8 of its GPUs (the node vTrain's runs trained on) measure NCCL's ring over
NVSwitch, which an A100 runs without NVLS: a ring inside one node of that generation takes their shares
(`ring_kind("ampere")`), which rise with the time as NVLS's do (half the rate where the bytes take
about 64 us at it). A ring of another generation keeps the model: none was swept, and GB200's
four-GPU ring rows (nccl_tests_published.csv, NCCL 2.25) run at the model's rate, faster than the A100
node's shares would give them. RCCL and network kinds no sweep measured keep the model too.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

TABLE = Path(__file__).with_name("collective_ramp.json")
NVLS = "nvls"  # the table's kind for NVLink SHARP inside one node, and NCCL's name of the algorithm


def ring_kind(generation: str) -> str:
    """The table's kind for NCCL's ring inside one NVSwitch node of cards of `generation` (NCCL's
    tuning generation: ampere, hopper, ...)."""
    return f"ring-{generation}"


@functools.cache
def _kinds() -> dict[str, tuple[tuple[float, float], ...]]:
    data = json.loads(TABLE.read_text())
    return {kind: tuple((float(us), float(share)) for us, share in points) for kind, points in data["kinds"].items()}


def measured_share(kind: str, at_rate_us: float) -> float | None:
    """The share of its large-size bus bandwidth a collective of `kind` (a network's, or NVLS) ran at
    in the sweeps, where its bytes take `at_rate_us` at that rate: log-log between the measured
    doublings, 1 past the last; None below the first (latency's side, the model's) or for a kind no
    sweep measured."""
    points = _kinds().get(kind)
    if not points or at_rate_us < points[0][0]:
        return None
    for (t0, s0), (t1, s1) in zip(points, points[1:], strict=False):
        if at_rate_us <= t1:
            share = math.log(at_rate_us / t0) / math.log(t1 / t0)
            return math.exp(math.log(s0) + share * math.log(s1 / s0))
    return 1.0
