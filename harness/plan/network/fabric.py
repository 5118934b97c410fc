"""The network as clusters are built, and what a collective costs on it as NCCL runs it.

Inside a node the GPUs share NVLink (through NVSwitch) or PCIe; between nodes each node has
`nics` network cards of `gbps` each, wired rail by rail (GPU i of every node on the same
switch). NCCL runs a ring over every GPU with one channel per rail, so a collective over
several nodes moves its bytes out of a node over all of its cards at once: its bus bandwidth
is the node's whole network rate, not one GPU's share of it (nccl-tests' doc/PERFORMANCE.md
defines busbw; the ring's bound is derived in docs/planner.md). The Simple ring sustains

    busbw = min(NVLINK_EFFICIENCY x NVLink, fabric efficiency x nics x gbps / 8)   (k > 1 nodes)

and a group of g GPUs of each node (one of several side by side: HSDP's replicas, FSDP beside
tensor parallelism) has g/gpus-per-node of the node's cards. Efficiencies are the measured
busbw over the links' rate: NVLink rings 0.80 (8 x H100/H200: 361-367 of 450 GB/s; 8 x A100: 235
of 300), NVLink SHARP all-reduce 1.07 (476-482 of 450, Hopper, 5 GPUs or more), an InfiniBand
card 0.92 (46-48 GB/s per 400 Gb/s NDR card, an NCCL maintainer in nccl-tests issue 290), EFA v1
0.85 (AWS's "effective 340Gbps" of p4d's 400), as tabulated with their sources in
docs/planner.md. Which algorithm and protocol NCCL runs on that, and its latency at each scale,
is NCCL's own model (`nccl_tuning.py`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import PlanError
from harness.plan.network.nccl_tuning import Choice, Links, choose

NVLINK_EFFICIENCY = 0.80
NVLS_EFFICIENCY = 1.07  # NVLink SHARP all-reduce on Hopper NVSwitch, from 5 GPUs of a node up
NVLS_MIN_GPUS = 5
PCIE_EFFICIENCY = 0.75  # a ring through the host's PCIe switches: ~23 GB/s of PCIe 4's 31
DEFAULT_FABRIC_EFFICIENCY = 0.92  # InfiniBand NDR: 46-48 GB/s per 400 Gb/s card
EFA_V1_EFFICIENCY = 0.85  # AWS p4d: "effective 340Gbps for all_reduce tests" of 4 x 100 Gb/s
# What aws-ofi-nccl reports to NCCL as EFA's latency (platform-aws.cpp): 75 us on p4d and p5/p5e,
# 35 us from p5en on; InfiniBand's plugin reports none.
EFA_LATENCY_US = {"v1": 75.0, "v2": 75.0, "v3": 35.0, "v4": 35.0}


@dataclass(frozen=True)
class Fabric:
    """A node's network: `nics` cards of `gbps` each, and the share of it NCCL's rings reach."""

    name: str
    nics: int
    gbps: float
    efficiency: float = DEFAULT_FABRIC_EFFICIENCY
    source: str = ""
    kind: str = "infiniband"  # infiniband | roce | efa | tcpx | ethernet
    latency_us: float = 0.0  # what the network plugin reports to NCCL's model per network hop

    @property
    def node_bytes_per_s(self) -> float:
        return self.nics * self.gbps * 1e9 / 8

    def describe(self) -> str:
        kind = "" if self.kind == "infiniband" else f" {self.kind}"
        return f"{self.name} ({self.nics} x {self.gbps:g} Gb/s{kind} per node)"


# Named clusters: cards per node and rate, and the measured ring efficiency where one is published.
FABRICS = {
    "ndr": Fabric("ndr", 8, 400, source="DGX H100/H200: 8 ConnectX-7 NDR 400G (ml-engineering network/README.md)"),
    "dgx-a100": Fabric("dgx-a100", 8, 200, source="DGX A100: 8 ConnectX-6 HDR 200G"),
    "grand-teton": Fabric("grand-teton", 8, 400, source="torchtitan's H100 hosts: RDMA 400 Gb/s per GPU"),
    "mosaicml-a100": Fabric(
        "mosaicml-a100", 8, 200, source="llm-foundry's A100 tables: 1600 Gbps node-node RoCE", kind="roce"
    ),
    "p5": Fabric(
        "p5", 32, 100, source="AWS p5/p5e: EFA v2, 32 x 100 Gb/s", kind="efa", latency_us=EFA_LATENCY_US["v2"]
    ),
    "p5en": Fabric(
        "p5en", 16, 200, source="AWS p5en: EFA v3, 16 x 200 Gb/s", kind="efa", latency_us=EFA_LATENCY_US["v3"]
    ),
    "p6-b200": Fabric(
        "p6-b200", 8, 400, source="AWS P6-B200: EFA v4, 8 x 400 Gb/s", kind="efa", latency_us=EFA_LATENCY_US["v4"]
    ),
    "p4d": Fabric(
        "p4d",
        4,
        100,
        EFA_V1_EFFICIENCY,
        "AWS p4d/p4dn: EFA v1, 4 x 100 Gb/s, 'effective 340Gbps for all_reduce tests'",
        kind="efa",
        latency_us=EFA_LATENCY_US["v1"],
    ),
    "a3-mega": Fabric("a3-mega", 8, 200, source="GCP A3 Mega: TCPXO 8 x 200 Gb/s", kind="tcpx"),
    "a3-high": Fabric("a3-high", 4, 200, source="GCP A3 High: TCPX 4 x 200 Gb/s", kind="tcpx"),
    "ethernet": Fabric("ethernet", 1, 100, source="one 100 GbE card per node", kind="ethernet"),
}
# The default for a card's own platform, where the question names no fabric: one card per GPU.
DEFAULT_FABRIC = {"ampere": "dgx-a100", "hopper": "ndr"}


def default_fabric(family: str, gpus_per_node: int) -> Fabric:
    """As many cards as the node has GPUs, each at the rate of the card's platform (HDR 200G
    beside Ampere, NDR 400G beside Hopper and later): the named DGX fabric for 8 GPUs."""
    platform = FABRICS[DEFAULT_FABRIC[family]]
    if gpus_per_node == platform.nics:
        return platform
    return Fabric(f"{gpus_per_node}x{platform.gbps:g}gbps", gpus_per_node, platform.gbps, source=platform.source)


_RATE = re.compile(r"^(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*(g|gb|gbps|gbit)?$")


def parse_fabric(value: str) -> Fabric:
    """`inter_node=`: a named cluster (ndr, p5, ...) or NICS x RATE (8x400gbps; 1600gbps is one card)."""
    key = str(value).strip().lower()
    if key in FABRICS:
        return FABRICS[key]
    if key == "infiniband":  # the name older plans took: today's InfiniBand node
        return FABRICS["ndr"]
    match = _RATE.match(key.replace("gb/s", "gbps"))
    if not match:
        raise PlanError(
            f"unknown inter_node fabric {value!r}: give cards x rate per node such as 8x400gbps, or one of "
            f"{', '.join(FABRICS)}"
        )
    nics, gbps = int(match.group(1) or 1), float(match.group(2))
    if nics <= 0 or gbps <= 0 or not math.isfinite(gbps):
        raise PlanError(f"inter_node={value}: the cards and their rate must be positive, e.g. 8x400gbps")
    return Fabric(f"{nics}x{gbps:g}gbps", nics, gbps)


@dataclass(frozen=True)
class IntraNode:
    """The links between a node's GPUs: NVLink (per GPU and direction) or PCIe."""

    name: str  # "nvlink" | "pcie"
    bytes_per_s: float

    @property
    def ring_busbw(self) -> float:
        return self.bytes_per_s * (NVLINK_EFFICIENCY if self.name == "nvlink" else PCIE_EFFICIENCY)


def parse_intra(value: str | None, gpu: GPUSpec) -> IntraNode:
    """`interconnect=`: nvlink, pcie, or a per-GPU bandwidth in GB/s; default the card's own (NVLink
    where it has it)."""
    key = "" if value is None else str(value).strip().lower()
    if key in ("", "auto"):
        key = "nvlink" if gpu.nvlink_bytes_per_s else "pcie"
    if key == "nvlink":
        if not gpu.nvlink_bytes_per_s:
            raise PlanError(f"interconnect=nvlink: the {gpu.name} has no NVLink between a node's GPUs: use pcie")
        return IntraNode("nvlink", gpu.nvlink_bytes_per_s)
    if key == "pcie":
        return IntraNode("pcie", gpu.pcie_bytes_per_s)
    try:
        gb_per_s = float(key)
    except ValueError:
        raise PlanError(
            f"unknown interconnect {value!r}: use nvlink, pcie or a per-GPU bandwidth in GB/s such as 300"
        ) from None
    if not math.isfinite(gb_per_s) or gb_per_s <= 0:
        raise PlanError(f"interconnect={value} must be a positive bandwidth in GB/s")
    return IntraNode("nvlink", gb_per_s * 1e9)


@dataclass(frozen=True)
class Group:
    """GPUs that run one collective together: how many, over how many nodes (as many of them in
    each). Groups of the same shape run side by side (one per tensor-parallel rank): a group with
    g of a node's GPUs has g of every node's GPUs' share of its cards."""

    size: int
    nodes: int

    @property
    def per_node(self) -> int:
        return max(1, self.size // self.nodes)


@dataclass(frozen=True)
class Topology:
    gpus: int
    nodes: int
    intra: IntraNode
    fabric: Fabric
    hopper_nvswitch: bool = False  # NVLink SHARP available for all-reduce inside a node

    @property
    def per_node(self) -> int:
        return self.gpus // self.nodes

    def world(self) -> Group:
        return Group(self.gpus, self.nodes)

    def in_node(self, size: int) -> Group:
        """A group of `size` GPUs inside one node (hybrid shards, hpZ)."""
        return Group(size, 1)

    def consecutive(self, size: int) -> Group:
        """A group of `size` neighbouring GPUs (tensor parallelism): inside one node where they fit,
        else whole nodes, whose collectives then cross the network."""
        return Group(size, max(1, -(-size // self.per_node)))

    @property
    def generation(self) -> str:
        """The GPUs' generation, as NCCL's tables index it: NVLink 5 is Blackwell's, NVSwitch
        with SHARP Hopper's."""
        if self.intra.name == "nvlink" and self.intra.bytes_per_s >= 900e9:
            return "blackwell"
        return "hopper" if self.hopper_nvswitch else "ampere"

    def network_busbw(self, group: Group) -> float:
        """The group's share of its nodes' cards, at the fabric's efficiency (0 inside one node)."""
        if group.nodes <= 1:
            return 0.0
        return self.fabric.node_bytes_per_s * self.fabric.efficiency * min(1.0, group.per_node / self.per_node)

    def busbw(self, group: Group, kind: str) -> float:
        """Bus bandwidth a Simple ring of `kind` sustains over `group`, bytes/s (NVLink SHARP's
        for an all-reduce inside a node that has it)."""
        nvls = self._nvls_busbw(group)
        if kind == "all-reduce" and nvls and group.nodes <= 1:
            return nvls
        return self._ring_busbw(group)

    def _ring_busbw(self, group: Group) -> float:
        fabric = self.network_busbw(group)
        if group.per_node == 1 and group.nodes > 1:
            return fabric
        return self.intra.ring_busbw if group.nodes <= 1 else min(self.intra.ring_busbw, fabric)

    def _nvls_busbw(self, group: Group) -> float | None:
        if self.hopper_nvswitch and self.intra.name == "nvlink" and min(group.per_node, self.per_node) >= NVLS_MIN_GPUS:
            return self.intra.bytes_per_s * NVLS_EFFICIENCY
        return None

    def links(self, group: Group) -> Links:
        return Links(
            ranks=group.size,
            nodes=group.nodes,
            ring_busbw=self._ring_busbw(group),
            network_busbw=self.network_busbw(group),
            nvls_busbw=self._nvls_busbw(group),
            intra="nvlink" if self.intra.name == "nvlink" else "pcie",
            generation=self.generation,
            net_latency_us=self.fabric.latency_us,
        )

    def choice(self, group: Group, kind: str, payload: float) -> Choice:
        """The algorithm and protocol NCCL runs for one collective of `payload` bytes, and its time."""
        return choose(kind, payload, self.links(group))

    def describe(self) -> str:
        inside = f"{self.intra.name} {self.intra.bytes_per_s / 1e9:g} GB/s per GPU"
        if self.nodes == 1:
            return f"{self.gpus} GPUs on {inside}"
        return f"{self.nodes} nodes x {self.per_node} GPUs, {inside} inside, {self.fabric.describe()} between"


def collective_seconds(topology: Topology, group: Group, kind: str, payload: float, calls: int = 1) -> float:
    """Seconds of `calls` collectives of `kind` moving `payload` bytes in all over `group`, each call
    an equal share of it, run as NCCL's model would run each."""
    if group.size <= 1 or payload <= 0:
        return 0.0
    return calls * topology.choice(group, kind, payload / calls).seconds
