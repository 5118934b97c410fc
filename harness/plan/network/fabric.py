"""The network as clusters are built, and what a collective costs on it as NCCL (RCCL on AMD's
cards) runs it.

Inside an NVLink domain the GPUs share NVLink through NVSwitch: one host's 8 on HGX, a rack's 72
on GB200/GB300 NVL72 (four to a compute tray, each tray its own host); AMD's 8 share Infinity
Fabric as a full mesh, a link to each peer and no switch; or the host's PCIe. Between domains each
host has `nics` network cards of `gbps` each, wired rail by rail (GPU i of every host on the same
switch). NCCL runs a ring over every GPU with one channel per rail, so a collective over several
domains moves its bytes out of a domain over all of its cards at once: its bus bandwidth is the
domain's whole network rate, not one GPU's share of it (nccl-tests' doc/PERFORMANCE.md defines
busbw; the ring's bound is derived in docs/planner.md). Under multi-node NVLink (MNNVL) NCCL fuses
the topologies of a clique's hosts into one (NVIDIA/nccl src/graph/topo.cc @ 5067397c,
ncclTopoGetSystem's "MNNVL clique support"): a domain is one node to its graph search, its tuning
and NVLS. The Simple ring sustains

    busbw = min(ring efficiency x link, fabric efficiency x nics x gbps / 8 x span(k))   (k > 1 domains)

(span(k): what a ring over k domains keeps of the fabric's rate on a fat tree, below 1 past 4)

and a group of g GPUs of each domain (one of several side by side: HSDP's replicas, FSDP beside
tensor parallelism) has g of its GPUs' cards. Ring efficiencies are measured busbw over the
links' rate: NVLink 4 and 3 rings 0.80 (8 x H100/H200: 361-367 of 450 GB/s; 8 x A100: 235 of
300), NVLink 5 0.756 (NVIDIA's GTC25 slide: an NVL72 all-reduce without NVLS at 680 of 900), an
Infinity Fabric link 0.705 (TransferBench on 8 x MI300X: its slowest link 45.1 of 64 GB/s, and a
ring over the mesh runs at its slowest link: ROCm/rocm-blogs mi300x-rccl-xgmi), an InfiniBand card
0.92 (46-48 GB/s per 400 Gb/s NDR card, an NCCL maintainer in nccl-tests issue 290), EFA v1 0.85
(AWS's "effective 340Gbps" of p4d's 400), as tabulated with their sources in docs/planner.md.
NVLink SHARP (NVLS) is NCCL's own model of it (nvls_busbw). Which algorithm and protocol NCCL
runs, and its latency at each scale, is NCCL's own model (`nccl_tuning.py`), RCCL's on AMD's
cards (`rccl_tuning.py`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import PlanError
from harness.plan.network import rccl_tuning
from harness.plan.network.collective_ramp import NVLS, measured_share, ring_kind
from harness.plan.network.nccl_tuning import Choice, Links, choose

NVLINK_EFFICIENCY = 0.80
NVLINK5_EFFICIENCY = 680 / 900  # NVL72 all-reduce without NVLS (GTC25 S72583, ml-engineering network/README.md)
XGMI_LINK_EFFICIENCY = 45.1 / 64  # MI300X's slowest Infinity Fabric link under TransferBench (ROCm/rocm-blogs)
PCIE_EFFICIENCY = 0.75  # a ring through the host's PCIe switches: ~23 GB/s of PCIe 4's 31
DEFAULT_FABRIC_EFFICIENCY = 0.92  # InfiniBand NDR: 46-48 GB/s per 400 Gb/s card
EFA_V1_EFFICIENCY = 0.85  # AWS p4d: "effective 340Gbps for all_reduce tests" of 4 x 100 Gb/s
# What aws-ofi-nccl reports to NCCL as EFA's latency (platform-aws.cpp): 75 us on p4d and p5/p5e,
# 35 us from p5en on; InfiniBand's plugin reports none.
EFA_LATENCY_US = {"v1": 75.0, "v2": 75.0, "v3": 35.0, "v4": 35.0}
# What an EFA network hop takes by protocol (LL, LL128, Simple), in aws-ofi-nccl's own cost model
# of its network (`src/tuner/nccl_ofi_model.cpp` @ 2daf7d30: `net_lat` 20 us on P5/P5e, 18 on P5en,
# plus `TUNER_NET_COMP_OVERHEAD`'s 3 us for Simple's completions, nccl_ofi_param.h). The plan times
# the chosen way with it; the report above still steers NCCL's choice, as it does on the machine.
# P6-B200 and P6-B300 have no figures of their own there: they take P5en's, the EFA generation
# whose platform entry (and reported 35 us) P6-B200 shares. p4d has none and keeps the report.
EFA_WIRE_HOP_US = {"v2": (20.0, 20.0, 23.0), "v3": (18.0, 18.0, 21.0), "v4": (18.0, 18.0, 21.0)}
# A ring across a fat tree sustains less of its cards' rate the more nodes it spans: its long-lived
# flows share more switch uplinks, where static ECMP hashing collides some of them on one link, and
# the ring runs at its slowest link. nccl-tests' reduce-scatter at 8 GiB on one H100 cluster of 8 x
# 400G NDR per node (NVIDIA/nccl#1229: 360, 345, 320, 300, 280 and 260 GB/s busbw on 4 to 128
# nodes) loses RING_SPAN_LOSS of the fabric's rate per doubling of the nodes past RING_SPAN_NODES: the
# least-squares fit of NCCL's model, with that loss, to those six measurements of the link (no
# training run sets it). Past 128 nodes the line is extrapolated.
RING_SPAN_NODES = 4
RING_SPAN_LOSS = 0.0414
# NCCL's model of NVLS (NVIDIA/nccl @ 5067397c): its graph search gives each of c = min(32, GPUs)
# channels the largest speed of its array that every GPU's NVLinks carry c + 1 times over
# (search.cc ncclTopoSearchTryNvls; links x topo.h's SM90/SM100_NVLINK_BW), and tuning.cc prices the
# all-reduce at 2 x nvlsEfficiency x (c - 1) x speed: nccl-tests' busbw.
NVLS_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY
NVLINK_BW_PER_LINK = {"hopper": 20.6, "blackwell": 40.1}  # GB/s, topo.h
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}  # tuning.cc nvlsEfficiency
NVLS_SPEEDS = {  # GB/s per channel, search.cc sm90SpeedArrayIntra and sm100SpeedArrayIntra
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}


def span_efficiency(nodes: int) -> float:
    """The share of the fabric's measured rate a collective over `nodes` nodes (NVLink domains) keeps
    on a fat tree (RING_SPAN_LOSS)."""
    if nodes <= RING_SPAN_NODES:
        return 1.0
    return 1.0 - RING_SPAN_LOSS * math.log2(nodes / RING_SPAN_NODES)


def nvls_busbw(generation: str, links: int, gpus: int) -> float | None:
    """nccl-tests' busbw of an NVLS all-reduce over `gpus` GPUs of one NVLink domain, bytes/s, as
    NCCL's own model gives it; None where NCCL has no NVLS (before Hopper) or its search finds no
    speed."""
    if generation not in NVLS_EFFICIENCY or gpus < 2:
        return None
    channels = min(NVLS_ARITY, gpus)
    room = links * NVLINK_BW_PER_LINK[generation] / (channels + 1)
    speed = next((s for s in NVLS_SPEEDS[generation] if s <= room), None)
    if speed is None:
        return None
    return 2 * NVLS_EFFICIENCY[generation] * (channels - 1) * speed * 1e9


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
    wire_hop_us: tuple[float, float, float] | None = None  # what a hop takes where the report is a tuning figure
    # A cluster's own all-reduce bus bandwidth (GB/s) by nodes, where it measured one: what a ring keeps
    # past its fewest nodes follows it in place of the fat tree's span (span_efficiency).
    measured_busbw: tuple[tuple[int, float], ...] = ()
    platform: str = ""  # the instance type aws-ofi-nccl's tuner knows the cluster by, where not its name
    per_gpu: bool = False  # a kind of network, one card per GPU (ndr, xdr): a host of n GPUs has n cards

    def span(self, nodes: int) -> float:
        """The share of the fabric's rate a ring over `nodes` nodes keeps: the cluster's measured
        all-reduce over its value at the fewest nodes measured, log-log between the points measured
        (held at the ends), else the fat tree's span."""
        if not self.measured_busbw:
            return span_efficiency(nodes)
        points = sorted(self.measured_busbw)
        first, last = points[0], points[-1]
        if nodes <= first[0]:
            return 1.0
        if nodes >= last[0]:
            return last[1] / first[1]
        (n0, b0), (n1, b1) = next((a, b) for a, b in zip(points, points[1:], strict=False) if a[0] <= nodes <= b[0])
        share = math.log(nodes / n0) / math.log(n1 / n0)
        return math.exp(math.log(b0) + share * math.log(b1 / b0)) / first[1]

    @property
    def node_bytes_per_s(self) -> float:
        return self.nics * self.gbps * 1e9 / 8

    def describe(self) -> str:
        kind = "" if self.kind == "infiniband" else f" {self.kind}"
        return f"{self.name} ({self.nics} x {self.gbps:g} Gb/s{kind} per node)"


# Named clusters: cards per node and rate, and the measured ring efficiency where one is published.
FABRICS = {
    "ndr": Fabric(
        "ndr", 8, 400, source="DGX H100/H200: 8 ConnectX-7 NDR 400G (ml-engineering network/README.md)", per_gpu=True
    ),
    "dgx-a100": Fabric("dgx-a100", 8, 200, source="DGX A100: 8 ConnectX-6 HDR 200G"),
    "grand-teton": Fabric("grand-teton", 8, 400, source="torchtitan's H100 hosts: RDMA 400 Gb/s per GPU"),
    "mosaicml-a100": Fabric(
        "mosaicml-a100", 8, 200, source="llm-foundry's A100 tables: 1600 Gbps node-node RoCE", kind="roce"
    ),
    "oci-a100": Fabric("oci-a100", 16, 100, source="OCI BM.GPU4.8: RoCE v2 cluster network, 16 x 100G", kind="roce"),
    "p5": Fabric(
        "p5",
        32,
        100,
        source="AWS p5/p5e: EFA v2, 32 x 100 Gb/s",
        kind="efa",
        latency_us=EFA_LATENCY_US["v2"],
        wire_hop_us=EFA_WIRE_HOP_US["v2"],
    ),
    # The p5 cluster the Ultra-Scale Playbook's runs shared with other jobs, as the Playbook measured
    # its all-reduce of 256 MB (medians, `pp_comm_bandwidth.html` of vinjn/nanotron-ultrascale-playbook
    # @ e3bcfc5c): on 2 nodes the p5 rate above, on more a falling share of it.
    "p5-playbook": Fabric(
        "p5-playbook",
        32,
        100,
        source="the Ultra-Scale Playbook's p5 cluster: EFA v2, 32 x 100 Gb/s, its all-reduce as measured",
        kind="efa",
        latency_us=EFA_LATENCY_US["v2"],
        wire_hop_us=EFA_WIRE_HOP_US["v2"],
        measured_busbw=((2, 361.7), (4, 160.1), (8, 99.6), (16, 84.7), (32, 64.9), (64, 32.9)),
        platform="p5",
    ),
    "p5en": Fabric(
        "p5en",
        16,
        200,
        source="AWS p5en: EFA v3, 16 x 200 Gb/s",
        kind="efa",
        latency_us=EFA_LATENCY_US["v3"],
        wire_hop_us=EFA_WIRE_HOP_US["v3"],
    ),
    "p6-b200": Fabric(
        "p6-b200",
        8,
        400,
        source="AWS P6-B200: EFA v4, 8 x 400 Gb/s",
        kind="efa",
        latency_us=EFA_LATENCY_US["v4"],
        wire_hop_us=EFA_WIRE_HOP_US["v4"],
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
    "xdr": Fabric(
        "xdr", 8, 800, source="DGX B300: 8 ConnectX-8 XDR 800G (ml-engineering network/README.md)", per_gpu=True
    ),
    "p6-b300": Fabric(
        "p6-b300",
        16,
        400,
        source="AWS P6-B300: EFA v4, 16 x 400 Gb/s",
        kind="efa",
        latency_us=EFA_LATENCY_US["v4"],
        wire_hop_us=EFA_WIRE_HOP_US["v4"],
    ),
    "spectrum-x": Fabric(
        "spectrum-x",
        8,
        400,
        source="NVIDIA Spectrum-X: a 400G SuperNIC per GPU, RoCE (none measured)",
        kind="roce",
        per_gpu=True,
    ),
    "pollara": Fabric(
        "pollara",
        8,
        400,
        source="AMD Pensando Pollara 400 per GPU, RoCE (no collective measured)",
        kind="roce",
        per_gpu=True,
    ),
}
# What a card's own platform pairs it with where the question names no fabric: one card per GPU
# at the card's platform rate (HDR 200G beside Ampere, NDR 400G beside Hopper, B200, GB200 and AMD's
# Instinct platforms, XDR 800G beside B300 and GB300), the named cluster where one has that shape.
PLATFORM_FABRICS = {(8, 200.0): "dgx-a100", (8, 400.0): "ndr", (8, 800.0): "xdr"}


def default_fabric(gpu: GPUSpec, gpus_per_node: int) -> Fabric:
    """As many cards as the host has GPUs, each at the rate of the card's platform."""
    named = PLATFORM_FABRICS.get((gpus_per_node, float(gpu.nic_gbps)))
    if named:
        return FABRICS[named]
    return Fabric(
        f"{gpus_per_node}x{gpu.nic_gbps:g}gbps", gpus_per_node, gpu.nic_gbps, source=f"{gpu.name}'s platform default"
    )


_RATE = re.compile(r"^(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*(g|gb|gbps|gbit)?$")


def parse_fabric(value: str, gpus_per_node: int | None = None) -> Fabric:
    """`inter_node=`: a named cluster (ndr, p5, ...) or NICS x RATE (8x400gbps; 1600gbps is one card).
    A named kind of network with a card per GPU (ndr, xdr, spectrum-x, pollara) takes as many cards
    as the host of `gpus_per_node` has GPUs: a GB200 tray's four, not a DGX's eight."""
    key = str(value).strip().lower()
    if key == "infiniband":  # the name older plans took: today's InfiniBand node
        key = "ndr"
    if key in FABRICS:
        named = FABRICS[key]
        if named.per_gpu and gpus_per_node is not None and gpus_per_node != named.nics:
            return replace(named, nics=gpus_per_node)
        return named
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


# Racks by name for `nvlink_domain=`: GPUs on one NVLink domain.
NAMED_DOMAINS = {"nvl72": 72, "nvl36": 36, "nvl8": 8}


def parse_domain(value: object, gpu: GPUSpec, gpus_per_node: int, intra: str = "nvlink") -> int:
    """`nvlink_domain=`: GPUs on one NVLink domain, a whole number of hosts (nvl72, nvl36 or a
    count; default the card's platform: 72 for GB200 and GB300, else the host's GPUs). A card
    without an NVLink switch keeps its links inside its host, and so does a host planned on PCIe
    (interconnect=pcie: no NVLink to reach another tray by)."""
    if value in (None, "", "auto"):
        rack = gpu.scale_up == "nvswitch" and gpu.nvlink_domain > gpu.gpus_per_host and intra != "pcie"
        return gpu.nvlink_domain if rack and gpu.nvlink_domain % gpus_per_node == 0 else gpus_per_node
    key = str(value).strip().lower()
    domain = NAMED_DOMAINS.get(key)
    if domain is None:
        try:
            domain = int(key)
        except ValueError:
            raise PlanError(
                f"unknown nvlink_domain {value!r}: give a GPU count such as 72 or one of {', '.join(NAMED_DOMAINS)}"
            ) from None
    if domain < 1 or domain % gpus_per_node:
        raise PlanError(
            f"nvlink_domain={value}: a domain is one or more whole hosts of {gpus_per_node} GPUs: give "
            f"{gpus_per_node}, {2 * gpus_per_node} or another positive multiple of {gpus_per_node}"
        )
    if domain > gpus_per_node and intra == "pcie":
        raise PlanError(
            f"nvlink_domain={value} with interconnect=pcie: PCIe links stay inside a host of {gpus_per_node} GPUs: "
            "leave one of them out"
        )
    if domain > gpus_per_node and gpu.scale_up != "nvswitch":
        raise PlanError(
            f"nvlink_domain={value}: the {gpu.name}'s links stay inside its host of {gpus_per_node} GPUs (no NVLink "
            "switch): leave nvlink_domain out"
        )
    rack = gpu.nvlink_domain > gpu.gpus_per_host  # NVLink switch trays between hosts (NVL72)
    if domain > gpus_per_node and not rack:
        raise PlanError(
            f"nvlink_domain={value}: the {gpu.name}'s NVSwitch joins the GPUs of one host ({gpus_per_node}); NVLink "
            "between hosts comes with rack-scale systems (GB200, GB300 NVL72): leave nvlink_domain out"
        )
    if rack and domain > gpu.nvlink_domain:
        raise PlanError(
            f"nvlink_domain={value}: the {gpu.name}'s largest NVLink domain is {gpu.nvlink_domain} GPUs (one rack): "
            f"give {gpu.nvlink_domain} or fewer"
        )
    return domain


@dataclass(frozen=True)
class IntraNode:
    """The links between a domain's GPUs: NVLink (per GPU and direction, through a switch), AMD's
    Infinity Fabric (`links` links to as many peers, no switch) or PCIe."""

    name: str  # "nvlink" | "xgmi" | "pcie"
    bytes_per_s: float
    efficiency: float = NVLINK_EFFICIENCY  # what a ring's busbw reaches of the links
    links: int = 0  # a full mesh's links per GPU (xgmi): a group of g GPUs has g - 1 of them

    @property
    def ring_busbw(self) -> float:
        return self.bytes_per_s * self.efficiency

    def ring_busbw_over(self, gpus: int) -> float:
        """A ring over `gpus` of the domain's GPUs: on a mesh, only the links between them carry it."""
        if self.name == "xgmi" and self.links:
            return self.ring_busbw * min(max(gpus - 1, 1), self.links) / self.links
        return self.ring_busbw


def parse_intra(value: str | None, gpu: GPUSpec) -> IntraNode:
    """`interconnect=`: nvlink (xgmi: AMD's Infinity Fabric), pcie, or a per-GPU bandwidth in GB/s;
    default the card's own (NVLink or Infinity Fabric where it has it)."""
    key = "" if value is None else str(value).strip().lower()
    if key in ("", "auto", "xgmi") and gpu.scale_up == "xgmi-mesh":
        key = "nvlink"  # AMD's Infinity Fabric answers to either name
    if key in ("", "auto"):
        key = "nvlink" if gpu.nvlink_bytes_per_s else "pcie"
    if key == "nvlink":
        if not gpu.nvlink_bytes_per_s:
            raise PlanError(f"interconnect=nvlink: the {gpu.name} has no NVLink between a node's GPUs: use pcie")
        if gpu.scale_up == "xgmi-mesh":
            return IntraNode("xgmi", gpu.nvlink_bytes_per_s, XGMI_LINK_EFFICIENCY, gpu.nvlink_links)
        efficiency = NVLINK5_EFFICIENCY if gpu.generation == "blackwell" else NVLINK_EFFICIENCY
        return IntraNode("nvlink", gpu.nvlink_bytes_per_s, efficiency)
    if key == "pcie":
        return IntraNode("pcie", gpu.pcie_bytes_per_s, PCIE_EFFICIENCY)
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
    """GPUs that run one collective together: how many, over how many NVLink domains (a node where
    the domain is the node), as many of them in each. Groups of the same shape run side by side
    (one per tensor-parallel rank): a group with g of a domain's GPUs has those GPUs' cards."""

    size: int
    nodes: int

    @property
    def per_node(self) -> int:
        return max(1, self.size // self.nodes)


def span_words(group: Group, topology: Topology | None = None) -> str:
    """The NVLink domains `group` spans, in the header's words: nodes where a node is its own domain, else
    NVLink domains (a GB200 NVL72's 72 GPUs are 18 hosts of 4, which the header counts as nodes)."""
    one_host = topology is None or topology.per_domain == topology.per_node
    unit = "node" if one_host else "NVLink domain"
    return f"{group.nodes} {unit}{'s' if group.nodes != 1 else ''}"


@dataclass(frozen=True)
class Topology:
    gpus: int
    nodes: int  # hosts (a GB200 compute tray is one)
    intra: IntraNode
    fabric: Fabric  # each host's cards
    hopper_nvswitch: bool = False  # NVLink SHARP for all-reduce inside the domain (NVSwitch from Hopper on)
    domain: int = 0  # GPUs on one NVLink domain (0: one host's)
    generation: str = ""  # NCCL's tuning tables (hardware.py's GPUSpec.generation); "" : from the links
    nvlink_links: int = 18  # NVLinks per GPU, for NCCL's NVLS search

    @property
    def per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def per_domain(self) -> int:
        """GPUs sharing one NVLink domain (at most the job's)."""
        return min(max(self.domain, self.per_node), self.gpus)

    @property
    def domains(self) -> int:
        return max(1, -(-self.gpus // self.per_domain))

    def world(self) -> Group:
        return Group(self.gpus, self.domains)

    def in_node(self, size: int) -> Group:
        """A group of `size` GPUs inside one host (hybrid shards, hpZ)."""
        return Group(size, 1)

    def consecutive(self, size: int) -> Group:
        """A group of `size` neighbouring GPUs (tensor parallelism): inside one NVLink domain where
        they fit, else whole domains, whose collectives then cross the network."""
        return Group(size, max(1, -(-size // self.per_domain)))

    def block(self, size: int, stride: int = 1) -> Group:
        """A group of `size` GPUs `stride` apart, the groups laid side by side in blocks of size x stride
        consecutive GPUs (an expert-parallel all-to-all, a hybrid shard): the most NVLink domains one
        group reaches. Blocks that do not tile the domain straddle two: 32 GPUs of an NVL72 rack's 72 fill
        ranks 0-31 and 32-63, and the third reaches 64-95, over both racks, every step waiting on that one."""
        if size <= 1:
            return Group(1, 1)
        return Group(size, _most_domains(self.gpus, self.per_domain, size, stride))

    @property
    def library(self) -> str:
        return "rccl" if self.generation.startswith("cdna") else "nccl"

    @property
    def tuning_generation(self) -> str:
        """The GPUs' generation, as NCCL's tables index it (RCCL's AMD cards: their own)."""
        if self.generation:
            return self.generation
        if self.intra.name == "nvlink" and self.intra.bytes_per_s >= 900e9:
            return "blackwell"
        return "hopper" if self.hopper_nvswitch else "ampere"

    def network_busbw(self, group: Group) -> float:
        """The group's share of its domains' cards, at the fabric's efficiency (0 inside one domain)."""
        if group.nodes <= 1:
            return 0.0
        per_gpu = self.fabric.node_bytes_per_s / self.per_node
        return per_gpu * self.fabric.efficiency * min(group.per_node, self.per_domain) * self.fabric.span(group.nodes)

    def busbw(self, group: Group, kind: str) -> float:
        """Bus bandwidth a Simple ring of `kind` sustains over `group`, bytes/s (NVLink SHARP's
        for an all-reduce inside a domain where NCCL's model prefers it)."""
        nvls = self._nvls_busbw(group)
        ring = self._ring_busbw(group)
        if kind == "all-reduce" and nvls and group.nodes <= 1:
            return max(nvls, ring)
        return ring

    def _ring_busbw(self, group: Group) -> float:
        fabric = self.network_busbw(group)
        if group.per_node == 1 and group.nodes > 1:
            return fabric
        intra = self.intra.ring_busbw_over(group.per_node)
        return intra if group.nodes <= 1 else min(intra, fabric)

    def _nvls_busbw(self, group: Group) -> float | None:
        if not (self.hopper_nvswitch and self.intra.name == "nvlink"):
            return None
        return nvls_busbw(self.tuning_generation, self.nvlink_links, min(group.per_node, self.per_domain))

    def links(self, group: Group) -> Links:
        return Links(
            ranks=group.size,
            nodes=group.nodes,
            ring_busbw=self._ring_busbw(group),
            network_busbw=self.network_busbw(group),
            nvls_busbw=self._nvls_busbw(group),
            intra="pcie" if self.intra.name == "pcie" else "nvlink",
            generation=self.tuning_generation,
            net_latency_us=self.fabric.latency_us,
            wire_hop_us=self.fabric.wire_hop_us,
            platform=self.fabric.platform or self.fabric.name,
        )

    def choice(self, group: Group, kind: str, payload: float) -> Choice:
        """The algorithm and protocol NCCL (RCCL) runs for one collective of `payload` bytes, and its time:
        across nodes, and as NVLS or an NVLink ring inside one, no less than its bytes at the share of its
        large-size rate measured there (collective_ramp.py; None where no sweep measured it)."""
        links = self.links(group)
        if self.library == "rccl":
            return rccl_tuning.choose(kind, payload, links)
        chosen = choose(kind, payload, links)
        if group.nodes > 1:
            measured = self.fabric.kind
        elif chosen.algorithm == NVLS:
            measured = NVLS
        else:
            measured = ring_kind(links.generation) if links.intra == "nvlink" else None
        if measured is None:
            return chosen
        at_rate = payload / _large_size_algbw(kind, links)
        share = measured_share(measured, at_rate * 1e6)
        if share is None or at_rate / share <= chosen.seconds:
            return chosen
        return replace(chosen, seconds=at_rate / share)

    def describe(self) -> str:
        inside = f"{self.intra.name} {self.intra.bytes_per_s / 1e9:g} GB/s per GPU"
        if self.per_domain > self.per_node:
            inside += f", {self.per_domain} GPUs on one NVLink domain"
        if self.nodes == 1:
            return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} on {inside}"
        hosts = f"{self.nodes} hosts x {self.per_node} GPUs" if self.per_domain > self.per_node else None
        between = f"{self.fabric.describe()} between"
        return f"{hosts or f'{self.nodes} nodes x {self.per_node} GPUs'}, {inside} inside, {between}"


def topology_of(
    gpu: GPUSpec,
    gpus: int,
    nodes: int,
    fabric: Fabric,
    interconnect: str | None = None,
    nvlink_domain: object = None,
) -> Topology:
    """The cluster of `gpus` cards over `nodes` hosts: the card's own links (or `interconnect=`),
    its NVLink domain (or `nvlink_domain=`), `fabric` between hosts."""
    per_node = gpus // nodes
    intra = parse_intra(interconnect, gpu)
    sharp = gpu.scale_up == "nvswitch" and gpu.generation in NVLS_EFFICIENCY and intra.name == "nvlink"
    return Topology(
        gpus,
        nodes,
        intra,
        fabric,
        sharp,
        domain=parse_domain(nvlink_domain, gpu, per_node, intra.name),
        generation=gpu.generation,
        nvlink_links=gpu.nvlink_links,
    )


@functools.cache
def _most_domains(gpus: int, domain: int, size: int, stride: int) -> int:
    """The most domains of `domain` consecutive GPUs that one group of `size` GPUs `stride` apart reaches,
    the groups filling blocks of size x stride GPUs side by side (every offset inside a block alike)."""
    span = size * stride
    blocks = range(max(1, gpus // span))
    return max(
        len({(k * span + j * stride + offset) // domain for j in range(size)})
        for k in blocks
        for offset in (0, stride - 1)
    )


# The size at which a collective's rate is its large-size one: the largest the published sweeps ran.
LARGE_SIZE = 16 * 2**30


@functools.cache
def _large_size_algbw(kind: str, links: Links) -> float:
    return choose(kind, LARGE_SIZE, links).algbw


def collective_seconds(topology: Topology, group: Group, kind: str, payload: float, calls: int = 1) -> float:
    """Seconds of `calls` collectives of `kind` moving `payload` bytes in all over `group`, each call
    an equal share of it, run as NCCL's model would run each (an all-to-all: all_to_all.py)."""
    if group.size <= 1 or payload <= 0:
        return 0.0
    if kind == "all-to-all":
        from harness.plan.network.all_to_all import all_to_all_seconds

        return all_to_all_seconds(topology, group, payload, calls)
    return calls * topology.choice(group, kind, payload / calls).seconds
