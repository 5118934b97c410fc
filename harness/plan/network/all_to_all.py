"""An all-to-all's time: each of a group's g GPUs sends a g-th of its buffer to every other GPU
(an expert-parallel dispatch or combine: NCCL's all_to_all_single, DeepEP's kernels). No ring: every
pair exchanges at once, so a GPU's bytes leave it over its own links, the share bound for GPUs of its
NVLink domain over NVLink, the rest over its network card, both at once:

    t = latency + max((d - 1) / g x B / nvlink,  (g - d) / g x B / card)

with B the bytes a GPU holds to exchange, d the group's GPUs in one domain. The rates are DeepEP's
measured all-to-all on H800 nodes (deepseek-ai/DeepEP docs/legacy.md @ 0297fc80, normal kernels,
4096 tokens of hidden 7168, top-8): inside a node 153 GB/s dispatch and 158 GB/s combine of the
H800's 200 GB/s NVLink a direction (0.765), across nodes 43 GB/s of a 400 Gb/s CX7 card's 50 GB/s
at EP 16 (0.86); a card of another fabric takes the same share of its ring efficiency as InfiniBand's
0.86 is of its 0.92 (fabric.py). An Infinity Fabric mesh carries each peer's share on its own link
(ring_busbw_over). The latency is one step of NCCL's Simple protocol: its base and one hop of the
slowest link the group crosses (nccl_tuning.py's tables). The EP 32 and 64 figures (57-58 and 50-51
GB/s) count bytes DeepEP forwards once per node and fans out over NVLink (DeepSeek-V3's
node-limited routing); no dispatcher here is assumed to do so.
"""

from __future__ import annotations

from harness.plan.network.fabric import DEFAULT_FABRIC_EFFICIENCY, Group, Topology
from harness.plan.network.nccl_tuning import BASE_LATENCY_US, HOP_LATENCY_US, SIMPLE

NVLINK_ALL_TO_ALL_EFFICIENCY = 153 / 200  # DeepEP's EP 8 dispatch on H800 NVLink
NETWORK_ALL_TO_ALL_EFFICIENCY = 43 / 50  # DeepEP's EP 16 dispatch over a 400 Gb/s CX7 card


def _nvlink_rate(topology: Topology, in_domain: int) -> float:
    intra = topology.intra
    if intra.name == "xgmi":  # a mesh: each peer its own link, at that link's measured share
        return intra.ring_busbw_over(in_domain)
    efficiency = NVLINK_ALL_TO_ALL_EFFICIENCY if intra.name == "nvlink" else intra.efficiency
    return intra.bytes_per_s * efficiency


def _card_rate(topology: Topology) -> float:
    fabric = topology.fabric
    share = NETWORK_ALL_TO_ALL_EFFICIENCY / DEFAULT_FABRIC_EFFICIENCY
    return fabric.node_bytes_per_s / topology.per_node * fabric.efficiency * share


def all_to_all_seconds(topology: Topology, group: Group, payload: float, calls: int = 1) -> float:
    """Seconds of `calls` all-to-alls over `group`, each GPU exchanging `payload` bytes in all (an
    equal share a call)."""
    g = group.size
    if g <= 1 or payload <= 0:
        return 0.0
    in_domain = min(group.per_node, topology.per_domain, g)
    per_call = payload / calls
    inside = (in_domain - 1) / g * per_call / _nvlink_rate(topology, in_domain) if in_domain > 1 else 0.0
    across = (g - in_domain) / g * per_call / _card_rate(topology) if group.nodes > 1 else 0.0
    link = "network" if group.nodes > 1 else ("pcie" if topology.intra.name == "pcie" else "nvlink")
    plugin = topology.fabric.latency_us if group.nodes > 1 else 0.0
    latency = (BASE_LATENCY_US["ring"][SIMPLE] + HOP_LATENCY_US[link]["ring"][SIMPLE] + plugin) * 1e-6
    return calls * (latency + max(inside, across))
