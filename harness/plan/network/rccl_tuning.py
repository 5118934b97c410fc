"""RCCL's cost model of one collective on AMD Instinct cards, where it departs from NCCL's
(`nccl_tuning.py`): ROCm/rccl `src/graph/tuning.cc` @ 0cbce2a7, the table `tuning_model_5` that
`src/graph/rome_models.cc` gives an 8-GPU node whose GPUs have 7 Infinity Fabric links each, a
full mesh (its models 79, 81 and 84: `tuning=5`), and the same function as it now stands in
ROCm/rocm-systems `projects/rccl/src/graph/tuning.cc` @ a4cd4445 (NCCL's count of network steps,
2 x (nodes - 1) for a ring all-reduce; the tree's Simple protocol off inside one gfx942 or gfx950
node). MI350X and MI355X (gfx950) are planned with the same table.

What differs from NCCL's model:
  * no NVLS, no PAT, no LL128 (RCCL enables it only where a topology's tuning table says
    `ll128Enabled`, which tuning_model_5's machines do not);
  * latencies inside a node: a base of 12 us (LL) and 17 us (Simple) for the ring and the tree,
    each Infinity Fabric hop 0.8 us (LL) and 2.1 us (Simple) on the ring, 0.9 and 2.3 on the tree;
  * bandwidth: the ring's Simple as the links sustain it, its LL at 0.08 of it; the tree's LL at
    0.06, its Simple at 0.11 over two nodes and 0.59 over more (`bwRatio`), then halved as NCCL's.
A network hop costs what NCCL's model says (its NET latencies): tuning_model_5's own figures for
it (320 us a ring's Simple step) and RCCL's per-size correction tables steer its choice of
algorithm on the machines it was tuned on, not the time a message takes on the wire; they are not
applied.
"""

from __future__ import annotations

from harness.plan.network.nccl_tuning import HOP_LATENCY_US as NCCL_HOPS
from harness.plan.network.nccl_tuning import LL, PROTOCOLS, SIMPLE, Choice, Links, _log2i, _steps

BASE_LATENCY_US = {"ring": (12.0, 12.0, 17.0), "tree": (12.0, 12.0, 17.0)}
HOP_LATENCY_US = {
    "xgmi": {"ring": (0.8, 0.0, 2.1), "tree": (0.9, 0.0, 2.3)},
    "network": {key: NCCL_HOPS["network"][key] for key in ("ring", "tree")},
}
# bwRatio by (two nodes or fewer, more), algorithm and protocol (LL, LL128, Simple).
BW_RATIO = {
    "ring": ((0.08, 0.0, 1.0), (0.08, 0.0, 1.0)),
    "tree": ((0.06, 0.0, 0.11), (0.06, 0.0, 0.59)),
}
NET_POST_US = 2.0  # getNetOverhead: an AMD EPYC host, three per Simple step


def _ratio(algorithm: str, p: int, links: Links) -> float:
    return BW_RATIO[algorithm][0 if links.nodes <= 2 else 1][p]


def _ring(kind: str, p: int, links: Links) -> tuple[float, float]:
    bus = links.ring_busbw * _ratio("ring", p, links)
    steps = _steps(kind, links.ranks)
    if kind in ("broadcast", "reduce"):
        link = "network" if links.nodes > 1 else "xgmi"
        hop = HOP_LATENCY_US[link]["tree" if p == SIMPLE else "ring"][p]
        return bus, BASE_LATENCY_US["ring"][p] + steps * hop
    intra = HOP_LATENCY_US["xgmi"]["ring"][p]
    inter_steps = 0
    if links.nodes > 1:
        intra = max(intra, NET_POST_US * (3 if p == SIMPLE else 1))
        inter_steps = 2 * (links.nodes - 1) if kind == "all-reduce" else links.nodes - 1
    inter = HOP_LATENCY_US["network"]["ring"][p] + links.net_latency_us * (2 if p == SIMPLE else 1)
    latency = BASE_LATENCY_US["ring"][p] + (steps - inter_steps) * intra + inter_steps * inter
    return bus * links.ranks / steps, latency


def _tree(p: int, links: Links) -> tuple[float, float]:
    bus = links.ring_busbw * _ratio("tree", p, links) * 0.5
    intra = HOP_LATENCY_US["xgmi"]["tree"][p]
    inter = HOP_LATENCY_US["network"]["tree"][p] + links.net_latency_us * (2 if p == SIMPLE else 1)
    latency = BASE_LATENCY_US["tree"][p] + 2 * ((links.per_node - 1) * intra + _log2i(links.nodes) * inter)
    return bus, latency


def candidates(kind: str, payload: float, links: Links) -> list[Choice]:
    """Every algorithm and protocol RCCL would consider for `kind` over `links`, with its time."""
    ways = [("ring", p, _ring(kind, p, links)) for p in (LL, SIMPLE)]
    if kind == "all-reduce":
        protocols = (LL,) if links.nodes == 1 else (LL, SIMPLE)
        ways += [("tree", p, _tree(p, links)) for p in protocols]
    out = []
    for algorithm, p, (algbw, latency_us) in ways:
        if algbw <= 0:
            continue
        latency = latency_us * 1e-6
        out.append(Choice(algorithm, PROTOCOLS[p], latency, algbw, latency + payload / algbw))
    return out


def choose(kind: str, payload: float, links: Links) -> Choice:
    """What RCCL runs: the way its model says is fastest."""
    if links.ranks <= 1 or payload <= 0:
        raise ValueError("a collective needs two ranks and a payload")
    return min(candidates(kind, payload, links), key=lambda c: c.seconds)
