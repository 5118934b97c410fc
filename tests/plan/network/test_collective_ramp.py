"""Mid-sized collectives across nodes at the share of their large-size rate that published
nccl-tests sweeps measured (harness/plan/network/collective_ramp.py): the table is what
bench/collective_ramp.py reads from those sweeps, a collective across nodes takes no less than its
bytes at that share, as do NVLS inside a node and an A100 node's ring; a ring of a generation no sweep
measured, large sizes and sizes below the table keep NCCL's model."""

from __future__ import annotations

import json

import pytest

from bench import collective_ramp, nccl_vs_published
from harness.common.hardware import GPUS
from harness.plan.network.collective_ramp import TABLE, measured_share, ring_kind
from harness.plan.network.fabric import LARGE_SIZE, parse_fabric, topology_of
from harness.plan.network.nccl_tuning import choose

MIB = 2**20


def _ndr(gpus: int, nodes: int):
    return topology_of(GPUS["H100"], gpus, nodes, parse_fabric("ndr"))


def test_the_table_is_what_the_sweeps_measured():
    shipped = json.loads(TABLE.read_text())["kinds"]
    assert shipped == collective_ramp.ramp_table(nccl_vs_published.read_rows(nccl_vs_published.SWEEPS))
    assert set(shipped) == {"infiniband", "efa", "roce", "tcpx", "nvls", ring_kind("ampere")}
    for points in shipped.values():  # a share of the rate that rises with the time toward all of it
        shares = [share for _, share in points]
        assert all(0 < s <= 1 for s in shares) and shares[-1] >= 0.99


def test_a_mid_sized_all_reduce_across_nodes_takes_its_bytes_at_the_measured_share_of_its_rate():
    t = _ndr(16, 2)
    group, links = t.world(), t.links(t.world())
    rate = choose("all-reduce", LARGE_SIZE, links).algbw
    model = choose("all-reduce", 64 * MIB, links).seconds
    at_rate = 64 * MIB / rate
    planned = t.choice(group, "all-reduce", 64 * MIB).seconds
    assert planned == pytest.approx(at_rate / measured_share("infiniband", at_rate * 1e6))
    assert planned > 1.2 * model


def test_nvls_inside_a_node_takes_the_measured_share():
    node = _ndr(8, 1)
    assert choose("all-reduce", 64 * MIB, node.links(node.world())).algorithm == "nvls"
    links = node.links(node.world())
    at_rate = 64 * MIB / choose("all-reduce", LARGE_SIZE, links).algbw
    planned = node.choice(node.world(), "all-reduce", 64 * MIB).seconds
    assert planned == pytest.approx(at_rate / measured_share("nvls", at_rate * 1e6))


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather"])
def test_an_a100_nodes_ring_takes_its_sweeps_share_and_a_ring_no_sweep_measured_the_model(kind):
    """The A100 node's sweeps measured NCCL's ring over its NVSwitch: a 2 MiB all-reduce over its 8 GPUs
    took 93 us there, where the model alone gives 57 us and the sweeps' share 63. A B200 node's ring (an
    all-gather, which NCCL runs on rings beside NVLS) was never swept, and GB200's ring rows run at the
    model's rate: it keeps the model."""
    a100 = topology_of(GPUS["A100"], 8, 1, parse_fabric("dgx-a100"))
    links = a100.links(a100.world())
    chosen = a100.choice(a100.world(), kind, 2 * MIB)
    assert chosen.algorithm == "ring"
    at_rate = 2 * MIB / choose(kind, LARGE_SIZE, links).algbw
    assert chosen.seconds == pytest.approx(at_rate / measured_share(ring_kind("ampere"), at_rate * 1e6))
    assert chosen.seconds > choose(kind, 2 * MIB, links).seconds
    b200 = topology_of(GPUS["B200"], 8, 1, parse_fabric("8x400gbps"))
    ring = b200.choice(b200.world(), "all-gather", 2 * MIB)
    assert ring.algorithm == "ring" and ring == choose("all-gather", 2 * MIB, b200.links(b200.world()))


def test_at_large_sizes_and_below_the_table_nccls_model_holds():
    two = _ndr(16, 2)
    links = two.links(two.world())
    for size in (8 * 2**30, 4096):
        assert two.choice(two.world(), "all-reduce", size).seconds == pytest.approx(
            choose("all-reduce", size, links).seconds
        )


def test_the_share_is_none_below_the_measured_times_and_for_a_kind_no_sweep_measured():
    first = json.loads(TABLE.read_text())["kinds"]["infiniband"][0][0]
    assert measured_share("infiniband", first / 2) is None
    assert measured_share("ethernet", 500.0) is None
    assert measured_share("infiniband", 1e9) == 1.0
    assert measured_share("efa", 256.0) < measured_share("infiniband", 256.0) < 1.0
