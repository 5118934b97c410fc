"""aws-ofi-nccl's tuner regions (harness/plan/network/ofi_tuner.py) against points its source names."""

from __future__ import annotations

import pytest

from harness.common.hardware import GPUS
from harness.plan.network.fabric import FABRICS, topology_of
from harness.plan.network.ofi_tuner import region_choice

EVERY = {(a, p) for a in ("ring", "tree", "nvls-tree", "pat") for p in ("LL", "LL128", "Simple")}


@pytest.mark.parametrize(
    ("kind", "size", "ranks", "nodes", "expected"),
    [
        ("all-reduce", 8, 32, 4, ("tree", "LL")),
        ("all-reduce", 2**20, 32, 4, ("tree", "LL128")),
        ("all-reduce", 64 * 2**20, 32, 4, ("ring", "LL128")),  # on the region's edge at 32 ranks
        ("all-reduce", 128 * 2**20, 32, 4, ("nvls-tree", "Simple")),
        ("all-reduce", 8 * 2**30, 32, 4, ("ring", "Simple")),  # past (435159040, 32)
        ("all-reduce", 8 * 2**30, 1024, 128, ("nvls-tree", "Simple")),  # below (10737418240, 512)'s line
        ("all-gather", 2**20, 32, 4, ("ring", "LL")),
        ("reduce-scatter", 300 * 2**20, 32, 4, ("ring", "LL128")),
        ("all-reduce", 8 * 2**20, 16, 16, ("ring", "LL128")),  # one GPU a node
        ("all-gather", 2**20, 16, 16, ("pat", "Simple")),
    ],
)
def test_p6_regions_pick_as_the_source_draws_them(kind, size, ranks, nodes, expected):
    assert region_choice("p6-b200", kind, size, ranks, nodes, EVERY) == expected


@pytest.mark.parametrize(
    ("kind", "size", "ranks", "nodes", "expected"),
    [
        ("all-reduce", 400_000, 32, 4, ("tree", "LL")),  # below (491520, 32)
        ("all-reduce", 2**20, 32, 4, ("tree", "LL128")),
        ("all-reduce", 64 * 2**20, 32, 4, ("ring", "LL128")),  # past (54525952, 32)
        ("all-reduce", 8 * 2**30, 32, 4, ("ring", "Simple")),  # past (603979776, 32)
        ("all-gather", 2**20, 32, 4, ("ring", "LL")),
        ("reduce-scatter", 512 * 2**20, 32, 4, ("ring", "LL128")),  # below (738197504, 32)
        ("all-reduce", 2**20, 16, 16, ("tree", "LL128")),  # one GPU a node
        ("reduce-scatter", 2**20, 16, 16, ("pat", "Simple")),
    ],
)
def test_p6_b300_regions_pick_as_the_source_draws_them(kind, size, ranks, nodes, expected):
    assert region_choice("p6-b300", kind, size, ranks, nodes, EVERY) == expected


@pytest.mark.parametrize(
    ("kind", "size", "ranks", "nodes", "expected"),
    [
        ("all-reduce", 16 * 2**20, 32, 4, ("tree", "LL128")),  # below (37748736, 32)
        ("all-reduce", 256 * 2**20, 32, 4, ("ring", "LL128")),
        ("all-reduce", 256 * 2**20, 64, 8, ("ring", "LL128")),  # past (117440512, 64)
        ("all-reduce", 200 * 2**20, 128, 16, ("tree", "LL128")),  # below (301989888, 128)
        ("all-reduce", 8 * 2**30, 32, 4, ("ring", "Simple")),  # past ring/LL128's (1073741824, 17)-(2147483648, 64)
        ("all-reduce", 4 * 2**30, 128, 16, ("nvls-tree", "Simple")),  # on (2147483648, 128)-(6442450944, 128)
        ("all-reduce", 2**20, 16, 16, ("tree", "LL128")),  # one GPU a node
        ("all-gather", 2**30, 16, 16, ("ring", "Simple")),
    ],
)
def test_p5_regions_pick_as_the_source_draws_them(kind, size, ranks, nodes, expected):
    assert region_choice("p5", kind, size, ranks, nodes, EVERY) == expected


@pytest.mark.parametrize(
    ("kind", "size", "ranks", "nodes", "expected"),
    [
        ("all-reduce", 64 * 2**10, 32, 4, ("tree", "LL")),  # below (196608, 16)-(196608, 1024)
        ("all-reduce", 8 * 2**20, 32, 4, ("tree", "LL128")),  # below (13107200, 16)-(129499136, 127)
        ("all-reduce", 128 * 2**20, 32, 4, ("ring", "LL128")),  # below (293601280, 32)
        ("all-reduce", 400 * 2**20, 32, 4, ("nvls-tree", "Simple")),  # below (509607936, 32)
        ("all-reduce", 8 * 2**30, 32, 4, ("ring", "Simple")),
        ("all-gather", 2**20, 32, 4, ("ring", "LL")),
        ("reduce-scatter", 100 * 2**20, 32, 4, ("ring", "LL128")),
        ("all-gather", 2**20, 16, 16, ("pat", "Simple")),  # one GPU a node
        ("all-reduce", 2**30, 16, 16, ("ring", "Simple")),  # past (50331648, 16)
    ],
)
def test_p5en_regions_pick_as_the_source_draws_them(kind, size, ranks, nodes, expected):
    assert region_choice("p5en", kind, size, ranks, nodes, EVERY) == expected


def test_the_tuner_leaves_two_nodes_other_platforms_and_what_cannot_run_to_nccl():
    assert region_choice("p6-b200", "all-reduce", 8, 16, 2, EVERY) is None  # two nodes or fewer
    assert region_choice("ndr", "all-reduce", 8, 32, 4, EVERY) is None
    assert region_choice("p4d", "all-reduce", 8, 32, 4, EVERY) is None  # the tuner has no regions for it
    assert region_choice("p5", "all-gather", 2**20, 32, 4, EVERY) is None  # P5 has all-reduce regions alone at 8 a node
    # A region NCCL cannot run (no NVLS here) is skipped for the next one that holds the point.
    without_nvls = EVERY - {("nvls-tree", "Simple")}
    assert region_choice("p6-b200", "all-reduce", 128 * 2**20, 32, 4, without_nvls) is None


def test_a_p6_b200_plan_runs_what_the_tuner_sets():
    topology = topology_of(GPUS["B200"], 32, 4, FABRICS["p6-b200"])
    assert topology.choice(topology.world(), "all-reduce", 64 * 2**20).describe() == "ring/LL128"
    two_nodes = topology_of(GPUS["B200"], 16, 2, FABRICS["p6-b200"])  # NCCL's model: the tree's LL at 8 bytes
    assert two_nodes.choice(two_nodes.world(), "all-reduce", 8).describe() == "tree/LL"
