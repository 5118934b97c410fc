"""NCCL's own cost model of one collective, as it picks how to run it: for every algorithm and
protocol it can use, a latency and a bandwidth, and it runs the one its model says is fastest
(NVIDIA/nccl `src/graph/tuning.cc` @ 5067397c: ncclTopoTuneModel and ncclTopoGetAlgoTime; the
constants below are its tables).

Algorithms: the ring (every collective), the tree (all-reduce: a chain inside each node, a
double binary tree across the nodes, so log2 of the nodes in its latency where the ring has one
step per GPU), NVLink SHARP (NVLS: an all-reduce reduced by the NVSwitch inside one node) and
NVLS-tree (NVLS inside each node, the tree across them) where the node's switch has it, and PAT
(all-gather and reduce-scatter with one GPU per node). Protocols: Simple (large chunks, a
memory fence per step: the highest bandwidth and the highest latency), LL (8-byte stores with a
flag in each: a quarter of the latency, half the bandwidth or less) and LL128 (128-byte lines
with a flag: near Simple's bandwidth at LL's latency, where NVLink carries it).

A collective of B bytes takes `latency + B / algbw`. The Simple ring's bandwidth is what the
links sustain (`network.py` takes it from measured nccl-tests figures); the other algorithms and
protocols scale it by NCCL's factors and cap it by NCCL's per-channel and per-node maxima. The
latency counts each step of the algorithm on its link: NVLink or PCIe hops inside a node,
network hops between nodes (with what the network plugin reports as its own latency: 0 for
InfiniBand, 35-75 us for AWS's EFA in aws-ofi-nccl's `platform-aws.cpp`, added once per network
hop, twice for Simple, as NCCL adds its flush). On EFA that report is a figure that steers NCCL's
choice, not the wire's latency: the way chosen with it is timed with what a hop takes there
(`Links.wire_hop_us`, fabric.py), a ring across nodes no sooner than its steps at the report
(`RING_STEPS_AT_REPORT`), and a tree across more than two nodes at the report, as NCCL's model times it
(`TREE_HOPS_AT_WIRE_NODES`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.plan.network.ofi_tuner import region_choice

PROTOCOLS = ("LL", "LL128", "Simple")
LL, LL128, SIMPLE = range(3)

# Microseconds by protocol (LL, LL128, Simple): a collective's fixed start, and each step's hop.
BASE_LATENCY_US = {
    "ring": (6.6, 14.0, 8.4),
    "tree": (6.8, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls-tree": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0),
}
HOP_LATENCY_US = {
    "nvlink": {
        "ring": (0.6, 1.9, 3.4),
        "tree": (0.6, 1.25, 4.0),
        "nvls": (0.0, 0.0, 25.0),
        "nvls-tree": (0.0, 0.0, 25.0),
        "pat": (0.0, 0.0, 4.0),
    },
    "pcie": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0), "pat": (0.0, 0.0, 4.0)},
    "network": {
        "ring": (2.7, 4.0, 14.0),
        "tree": (5.0, 8.5, 14.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls-tree": (0.0, 0.0, 20.9),
        "pat": (0.0, 0.0, 14.0),
    },
}
NET_POST_US = 1.0  # the proxy's cost to post a network send (x86), three per Simple step
# On EFA a ring's steps take, end to end, what NCCL's latency model charges them with the plugin's
# report (a figure AWS set from its runs of NCCL on p4d and p5: aws/aws-ofi-nccl commit d87d61e0): the p5
# sweep's all-gather at 32 MiB, nearly all latency, takes it within 3-14% on 4 to 32 nodes
# (docs/planner.md), where the wire's hop gives under half. Its bytes overlap those steps, so such
# a ring takes the longer of the two. A tree on two nodes keeps the wire's hop: the p5 sweeps' tree/LL128
# there runs 21-41% faster than the report would give. Across more nodes a tree's network hops take the
# report too, and its bytes add to them as NCCL's model has it: the 4 to 32-node sweep's tree/LL128
# all-reduce at 32 MiB on 8, 16 and 32 nodes takes 71-81 us a network hop past its bytes at the model's rate, where the
# report gives 83.5 and the wire 20 (docs/planner.md).
RING_STEPS_AT_REPORT = ("all-reduce", "all-gather", "reduce-scatter")
TREES = ("tree", "nvls-tree")
TREE_HOPS_AT_WIRE_NODES = 2  # the most nodes a tree's network hops take at the wire's hop
RING_PLATEAU = 1.4  # a multi-node Simple ring all-reduce's latency once every channel has work

# GB/s caps by generation; the three columns: one node, two nodes, more.
LL_MAX_ONE_NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
# Across nodes LL's cap follows the host CPU: DGX A100 runs AMD EPYC, DGX H100/H200/B200 Intel Xeon.
LL_MAX_ACROSS = {"volta": (39.0, 20.4), "ampere": (22.5, 19.0), "hopper": (39.0, 20.4), "blackwell": (39.0, 20.4)}
PER_CHANNEL_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CHANNEL_TREE = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
PER_CHANNEL_TREE_LL128 = {
    "volta": (20.0, 20.0, 20.0),
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
PER_CHANNEL_NVLS_TREE = {"hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
# NCCL opens 16 to 32 channels on an 8-GPU NVSwitch node (24 on HGX A100: nccl-tests #100);
# the per-channel caps are taken at the fewest, 16.
CHANNELS = 16
# The tree's measured shortfall at mid sizes: powers of two from 64 B, by protocol.
TREE_CORRECTION = (
    (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
        1.0,
    ),
    (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
)


@dataclass(frozen=True)
class Links:
    """What NCCL's model needs to know of the GPUs running one collective."""

    ranks: int
    nodes: int
    ring_busbw: float  # bytes/s the Simple ring sustains over these GPUs
    network_busbw: float  # bytes/s of the group's share of its nodes' network (0 inside one node)
    nvls_busbw: float | None  # NVLink SHARP all-reduce inside a node, where the switch has it
    intra: str  # "nvlink" | "pcie"
    generation: str  # "volta" | "ampere" | "hopper" | "blackwell" (NCCL's tables); AMD's in rccl_tuning.py
    net_latency_us: float = 0.0  # what the network plugin reports
    # What a network hop takes, by protocol, where the plugin's report is a figure that steers
    # NCCL's choice rather than the wire's latency (EFA): the chosen way is timed with it.
    wire_hop_us: tuple[float, float, float] | None = None
    platform: str = ""  # the fabric's name, where the network plugin's tuner has regions for it (ofi_tuner.py)
    timing: bool = False  # price network hops at wire_hop_us (the time), not at the report (the choice)

    @property
    def per_node(self) -> int:
        return max(1, self.ranks // self.nodes)

    @property
    def scale(self) -> int:
        """NCCL's column of its caps: one node, two, more."""
        return 0 if self.nodes == 1 else 1 if self.nodes == 2 else 2


@dataclass(frozen=True)
class Choice:
    """One way to run the collective and what NCCL's model says it takes."""

    algorithm: str
    protocol: str
    latency_s: float
    algbw: float  # bytes of the collective's buffer per second, past the latency
    seconds: float

    def describe(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def _log2i(n: int) -> int:
    return max(0, n.bit_length() - 1)


def _steps(kind: str, ranks: int) -> int:
    return 2 * (ranks - 1) if kind == "all-reduce" else ranks - 1 if kind in ("all-gather", "reduce-scatter") else ranks


def _ring(kind: str, p: int, links: Links, payload: float) -> tuple[float, float]:
    """Bandwidth (bytes/s of the buffer) and latency (us) of the ring."""
    ring = links.ring_busbw / 1e9
    bus = (
        min(_ll_max(links), ring * 0.5),
        min(ring * 0.92, CHANNELS * PER_CHANNEL_RING_LL128[links.generation]),
        ring,
    )[p]
    steps = _steps(kind, links.ranks)
    on_net = links.nodes > 1
    link = "network" if on_net else links.intra
    if kind in ("broadcast", "reduce"):  # a pipeline down the ring: one chunk's hop per rank
        hop = HOP_LATENCY_US[link]["tree" if p == SIMPLE else "ring"][p]
        return bus * 1e9, BASE_LATENCY_US["ring"][p] + steps * hop
    intra = HOP_LATENCY_US[links.intra]["ring"][p]
    if on_net:
        intra = max(intra, NET_POST_US * (3 if p == SIMPLE else 1))
    inter_steps = 0 if not on_net else 2 * (links.nodes - 1) if kind == "all-reduce" else links.nodes - 1
    latency = BASE_LATENCY_US["ring"][p] + (steps - inter_steps) * intra + inter_steps * _net_hop(links, "ring", p)
    if p == SIMPLE and on_net and kind == "all-reduce" and payload / (CHANNELS * links.ranks) >= 64:
        latency *= RING_PLATEAU
    return bus * 1e9 * links.ranks / steps, latency


def _net_hop(links: Links, algorithm: str, p: int) -> float:
    if links.timing and links.wire_hop_us is not None:
        return links.wire_hop_us[p]
    # With one GPU per node nothing hides a network hop: NCCL takes the tree's figure.
    base = HOP_LATENCY_US["network"]["tree" if links.per_node == 1 else algorithm][p]
    return base + links.net_latency_us * (2 if p == SIMPLE else 1)


def _ll_max(links: Links) -> float:
    if links.nodes == 1:
        return LL_MAX_ONE_NODE[links.generation]
    return LL_MAX_ACROSS[links.generation][links.scale - 1]


def _tree(p: int, links: Links, payload: float) -> tuple[float, float]:
    """All-reduce up and down a tree: a chain of the node's GPUs, a double binary tree of nodes."""
    bus = min(links.ring_busbw / 1e9 * 0.92, CHANNELS * PER_CHANNEL_TREE[links.generation][links.scale])
    if p == LL:
        bus = min(bus / 3.8, _ll_max(links))
    elif p == LL128:
        keep = 7 / 9 if links.nodes == 1 else 120 / 128
        bus = min(bus * keep, CHANNELS * PER_CHANNEL_TREE_LL128[links.generation][links.scale])
    size_step = int(payload) >> 6
    if size_step > 0 and _log2i(size_step) < len(TREE_CORRECTION[p]) - 1:
        bus *= TREE_CORRECTION[p][_log2i(size_step)]
    intra = HOP_LATENCY_US[links.intra]["tree"][p]
    latency = BASE_LATENCY_US["tree"][p] + 2 * (
        (links.per_node - 1) * intra + _log2i(links.nodes) * _net_hop(links, "tree", p)
    )
    return bus * 1e9 * 0.5, latency


def _nvls(links: Links) -> tuple[float, float]:
    """All-reduce on the NVSwitch inside one node, or with the tree across nodes (NVLS-tree)."""
    steps = _steps("all-reduce", links.ranks)
    nvls = links.nvls_busbw / 1e9
    if links.nodes == 1:
        return nvls * 1e9 * links.ranks / steps, HOP_LATENCY_US["nvlink"]["nvls"][SIMPLE]
    # Each node reduces on its switch, so its network carries one copy; two nodes exchange halves.
    network = links.network_busbw / 1e9 * (2 if links.nodes <= 2 else 1)
    bus = min(nvls, network, CHANNELS * PER_CHANNEL_NVLS_TREE[links.generation][links.scale])
    latency = HOP_LATENCY_US["nvlink"]["nvls-tree"][SIMPLE] + 2 * _log2i(links.nodes) * _net_hop(
        links, "nvls-tree", SIMPLE
    )
    return bus * 1e9 * links.ranks / steps, latency


def _pat(links: Links) -> tuple[float, float]:
    """PAT: all-gather or reduce-scatter over one GPU per node, in log2 steps of the nodes (and a
    part still linear in the ranks)."""
    bus = links.ring_busbw * 0.75
    latency = BASE_LATENCY_US["pat"][SIMPLE] + _log2i(links.nodes) * _net_hop(links, "pat", SIMPLE) / 3.5
    return bus, latency + links.ranks * 2.8


def candidates(kind: str, payload: float, links: Links) -> list[Choice]:
    """Every algorithm and protocol NCCL would consider for `kind` over `links`, with its time."""
    ways: list[tuple[str, int, tuple[float, float]]] = []
    protocols = range(3) if links.intra == "nvlink" else (LL, SIMPLE)  # LL128 needs NVLink inside the node
    ways += [("ring", p, _ring(kind, p, links, payload)) for p in protocols]
    if kind == "all-reduce":
        ways += [("tree", p, _tree(p, links, payload)) for p in protocols]
        if links.nvls_busbw and (links.nodes == 1 or links.generation in PER_CHANNEL_NVLS_TREE):
            ways.append(("nvls" if links.nodes == 1 else "nvls-tree", SIMPLE, _nvls(links)))
    if kind in ("all-gather", "reduce-scatter") and links.per_node == 1 and links.nodes > 1:
        ways.append(("pat", SIMPLE, _pat(links)))
    out = []
    for algorithm, p, (algbw, latency_us) in ways:
        latency = latency_us * 1e-6
        out.append(Choice(algorithm, PROTOCOLS[p], latency, algbw, latency + payload / algbw))
    return out


def choose(kind: str, payload: float, links: Links) -> Choice:
    """What NCCL runs: the way its tuner plugin sets where it sets one (ofi_tuner.py), else the way
    its model says is fastest."""
    if links.ranks <= 1 or payload <= 0:
        raise ValueError("a collective needs two ranks and a payload")
    ways = candidates(kind, payload, links)
    runnable = {(c.algorithm, c.protocol) for c in ways}
    tuned = region_choice(links.platform, kind, payload, links.ranks, links.nodes, runnable)
    if tuned is None:
        best = min(ways, key=lambda c: c.seconds)
        tuned = (best.algorithm, best.protocol)
    chosen = next(c for c in ways if (c.algorithm, c.protocol) == tuned)
    if links.wire_hop_us is None:
        return chosen
    # Chosen with the plugin's report; a tree across more than two nodes timed with it too, as NCCL's
    # model times it (TREE_HOPS_AT_WIRE_NODES); else timed with the wire's hop, a ring across nodes no
    # sooner than its steps take at the report, which its bytes overlap (RING_STEPS_AT_REPORT).
    if chosen.algorithm in TREES and links.nodes > TREE_HOPS_AT_WIRE_NODES:
        return chosen
    timed = next(c for c in candidates(kind, payload, replace(links, timing=True)) if c.describe() == chosen.describe())
    if chosen.algorithm in ("tree", "nvls-tree") and links.nodes > 2:
        return chosen
    if chosen.algorithm == "ring" and kind in RING_STEPS_AT_REPORT and links.nodes > 1:
        latency = max(timed.latency_s, chosen.latency_s)
        return replace(timed, latency_s=latency, seconds=max(timed.seconds, latency))
    return timed


def bus_bandwidth(kind: str, payload: float, seconds: float, ranks: int) -> float:
    """What nccl-tests prints as busbw for a collective of `payload` bytes that took `seconds`
    (its doc/PERFORMANCE.md: the algorithm bandwidth times 2(n-1)/n for all-reduce, (n-1)/n for
    all-gather and reduce-scatter)."""
    factor = 2 * (ranks - 1) / ranks if kind == "all-reduce" else (ranks - 1) / ranks
    return payload * (1.0 if kind in ("broadcast", "reduce") else factor) / seconds
