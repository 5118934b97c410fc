"""aws-ofi-nccl's tuner: on AWS's EFA instances the network plugin loads itself as NCCL's tuner plugin
too (aws/aws-ofi-nccl `src/platform-aws.cpp` @ 2daf7d30, `configure_tuner` sets NCCL_TUNER_PLUGIN), and
where its platform has measured regions it, not NCCL's model, picks a collective's algorithm and
protocol (`src/tuner/nccl_ofi_regions.cpp`, `src/tuner/nccl_ofi_tuner.cpp` @ 2daf7d30).

A region is a polygon in (log2 bytes, log2 ranks); the regions of a collective are tried in order and
the first that holds the point (inside or on an edge) wins, skipping one whose algorithm and protocol
NCCL cannot run on these GPUs. Two nodes or fewer, or a point in no region, leave the choice to
NCCL's model (nccl_tuning.py). The time of the way it picks is still NCCL's model's (nccl_tuning.py):
the tuner chooses, it does not time.

Transcribed: P6-B200's and P6-B300's regions (`region_init_internal_p6`, `region_init_internal_p6_b300`),
both of their shapes, a group of 8 GPUs of each node and one GPU of each, for all-reduce, all-gather and
reduce-scatter; P5's and P5e's (`region_init_internal_p5_p5e`): the all-reduce with 8, 2 or 1 GPUs of each
node, all-gather and reduce-scatter with one (with 8 a node the source has none for them); P5en's
(`region_init_internal_p5en`), both shapes, all three collectives. Not modelled: the channel counts it
sets for P6-B200's tree/LL128 all-reduces of 4-32 MiB and PAT below 32 MiB, and its chunk sizes.
"""

from __future__ import annotations

import math

MAX_SIZE = 100.0 * 2**30  # TUNER_MAX_SIZE
MAX_RANKS = 1024.0 * 1024  # TUNER_MAX_RANKS
EPS = 1e-10
FIRST_TUNED_NODES = 3  # "Skip when two nodes or lesser": NCCL's own tuning below


def _log(point: tuple[float, float]) -> tuple[float, float]:
    return (math.log2(point[0] or 1e-6), math.log2(point[1] or 1e-6))


def _extend(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """`extend_region(a, b, {MAX_SIZE, MAX_RANKS})`: the line through a and b carried to the edge of the
    plane, in log2 coordinates."""
    (ax, ay), (bx, by), (zx, zy) = _log(a), _log(b), _log((MAX_SIZE, MAX_RANKS))
    if ax == bx:
        return (ax, zy)
    if ay == by:
        return (zx, ay)
    m = (ay - by) / (ax - bx)
    c = by - m * bx
    projected = m * zx + c
    return (zx, projected) if projected < zy else ((zy - c) / m, zy)


Point = tuple[float, float]
Region = tuple[str, str, tuple[Point, ...]]  # algorithm, protocol, vertices in log2 coordinates


def _region(algorithm: str, protocol: str, *vertices: Point, extended: dict[str, Point]) -> Region:
    """A region as the source writes it: (bytes, ranks) vertices, or the name of an extended vertex."""
    return (algorithm, protocol, tuple(extended[v] if isinstance(v, str) else _log(v) for v in vertices))


def _p6_per_node_8() -> dict[str, tuple[Region, ...]]:
    top = MAX_SIZE
    ar = {
        "tree_ll": _extend((393216, 16), (393216, 1024)),
        "tree_ll128": _extend((96993280, 1024), (106430464, 2048)),
        "nvlstree_simple": _extend((10737418240, 512), (34359738368, 1500)),
    }
    all_reduce = (
        _region("tree", "LL", (0, 16), (393216, 16), "tree_ll", (0, MAX_RANKS), extended=ar),
        _region(
            "tree",
            "LL128",
            "tree_ll",
            (393216, 16),
            (4718592, 16),
            (18350080, 32),
            (40370176, 64),
            (57147392, 128),
            (72876032, 256),
            (96993280, 1024),
            (106430464, 2048),
            "tree_ll128",
            extended=ar,
        ),
        _region(
            "ring",
            "LL128",
            (90701824, 128),
            (50855936, 64),
            (18350080, 32),
            (133693440, 32),
            (120061952, 64),
            extended=ar,
        ),
        _region(
            "nvls-tree",
            "Simple",
            "tree_ll128",
            (106430464, 2048),
            (96993280, 1024),
            (72876032, 256),
            (57147392, 128),
            (40370176, 64),
            (18350080, 32),
            (50855936, 64),
            (90701824, 128),
            (120061952, 64),
            (133693440, 32),
            (18350080, 32),
            (4718592, 16),
            (top, 16),
            (435159040, 32),
            (1072693248, 64),
            (10737418240, 512),
            (34359738368, 1500),
            "nvlstree_simple",
            extended=ar,
        ),
        _region(
            "ring",
            "Simple",
            "nvlstree_simple",
            (10737418240, 512),
            (1072693248, 64),
            (435159040, 32),
            (top, 16),
            extended=ar,
        ),
    )
    ag = {
        "ring_ll": _extend((74973184, 1024), (213385216, 2048)),
        "ring_ll128": _extend((8321499136, 512), (32212254720, 2048)),
    }
    ladder = ((786432, 16), (1572864, 32), (2621440, 64), (4718592, 128), (17301504, 256))
    all_gather = (
        _region(
            "ring", "LL", (0, 16), *ladder, (74973184, 1024), (213385216, 2048), "ring_ll", (0, MAX_RANKS), extended=ag
        ),
        _region(
            "ring",
            "LL128",
            "ring_ll",
            (213385216, 2048),
            (74973184, 1024),
            *reversed(ladder),
            (198705152, 16),
            (456130560, 32),
            (871366656, 64),
            (8321499136, 512),
            (32212254720, 2048),
            "ring_ll128",
            extended=ag,
        ),
        _region(
            "ring",
            "Simple",
            "ring_ll128",
            (32212254720, 2048),
            (8321499136, 512),
            (871366656, 64),
            (456130560, 32),
            (198705152, 16),
            (top, 16),
            extended=ag,
        ),
    )
    rs = {
        "ring_ll": _extend((73924608, 1024), (209190912, 2048)),
        "ring_ll128": _extend((4294967296, 256), (8589934592, 512)),
    }
    rs_ladder = (*ladder, (35127296, 512))
    reduce_scatter = (
        _region(
            "ring",
            "LL",
            (0, 16),
            *rs_ladder,
            (73924608, 1024),
            (209190912, 2048),
            "ring_ll",
            (0, MAX_RANKS),
            extended=rs,
        ),
        _region(
            "ring",
            "LL128",
            "ring_ll",
            (209190912, 2048),
            (73924608, 1024),
            *reversed(rs_ladder),
            (219676672, 16),
            (508559360, 32),
            (592445440, 64),
            (4294967296, 256),
            (8589934592, 512),
            "ring_ll128",
            extended=rs,
        ),
        _region(
            "ring",
            "Simple",
            "ring_ll128",
            (8589934592, 512),
            (4294967296, 256),
            (592445440, 64),
            (508559360, 32),
            (219676672, 16),
            (top, 16),
            extended=rs,
        ),
    )
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


def _p6_per_node_1() -> dict[str, tuple[Region, ...]]:
    big, ranks = 107374182400, 131072
    none: dict[str, Point] = {}
    all_reduce = (
        _region("tree", "LL", (0, 2), (32768, 2), (32768, 128), (32768, ranks), (0, ranks), extended=none),
        _region(
            "tree",
            "LL128",
            (32768, 2),
            (131072, 2),
            (8388608, 128),
            (8589934592, ranks),
            (32768, ranks),
            (32768, 128),
            extended=none,
        ),
        _region(
            "ring",
            "LL128",
            (131072, 2),
            (3145728, 2),
            (297795584, 128),
            (big, 45916),
            (big, 59831),
            (164626432, 128),
            (20971520, 48),
            (3145728, 48),
            extended=none,
        ),
        _region(
            "tree",
            "Simple",
            (3145728, 48),
            (20971520, 48),
            (164626432, 128),
            (big, 59831),
            (big, ranks),
            (8589934592, ranks),
            extended=none,
        ),
        _region("ring", "Simple", (3145728, 2), (big, 2), (big, 45916), (297795584, 128), extended=none),
    )
    all_gather = (
        _region("ring", "LL", (0, 2), (65536, 2), (65536, 4), extended=none),
        _region(
            "pat",
            "Simple",
            (0, 2),
            (65536, 4),
            (1048576, 4),
            (4194305, 16),
            (12582912, 48),
            (88080384, 48),
            (248512512, 128),
            (34359738368, 17137),
            (0, ranks),
            extended=none,
        ),
        _region(
            "ring",
            "LL128",
            (65536, 2),
            (2097152, 2),
            (16777216, 8),
            (291504128, 128),
            (34359738368, 15008),
            (34359738368, 17137),
            (248512512, 128),
            (88080384, 48),
            (12582912, 48),
            (4194305, 16),
            (1048576, 4),
            (65536, 4),
            extended=none,
        ),
        _region(
            "ring",
            "Simple",
            (2097152, 2),
            (34359738368, 2),
            (34359738368, 15008),
            (291504128, 128),
            (16777216, 8),
            extended=none,
        ),
    )
    reduce_scatter = (
        _region("ring", "LL", (0, 2), (65536, 2), (65536, 4), extended=none),
        _region(
            "pat",
            "Simple",
            (0, 2),
            (65536, 4),
            (1048576, 4),
            (3345192, 8),
            (19065019, 16),
            (67108864, 48),
            (106954752, 48),
            (274877906944, 121928),
            (0, ranks),
            extended=none,
        ),
        _region(
            "ring",
            "LL128",
            (65536, 2),
            (2097152, 2),
            (16777216, 8),
            (106954752, 48),
            (67108864, 48),
            (19065019, 16),
            (3345192, 8),
            (1048576, 4),
            (65536, 4),
            extended=none,
        ),
        _region(
            "ring",
            "Simple",
            (2097152, 2),
            (274877906944, 2),
            (274877906944, 121928),
            (106954752, 48),
            (16777216, 8),
            extended=none,
        ),
    )
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


def _p6_b300_per_node_8() -> dict[str, tuple[Region, ...]]:
    top = MAX_SIZE
    ar = {
        "tree_ll": _extend((360448, 1024), (360448, 2048)),
        "tree_ll128": _extend((218103808, 1024), (251658240, 2048)),
        "nvlstree_simple": _extend((9663676416, 256), (19327352832, 512)),
    }
    ll_edge = ((720896, 16), (491520, 32), (425984, 64), (425984, 128), (425984, 256), (360448, 512))
    all_reduce = (
        _region(
            "tree", "LL", (0, 16), *ll_edge, (360448, 1024), (360448, 2048), "tree_ll", (0, MAX_RANKS), extended=ar
        ),
        _region(
            "tree",
            "LL128",
            "tree_ll",
            (360448, 2048),
            (360448, 1024),
            *reversed(ll_edge),
            (31457280, 16),
            (54525952, 32),
            (109051904, 64),
            (125829120, 128),
            (125829120, 256),
            (184549376, 512),
            (218103808, 1024),
            (251658240, 2048),
            "tree_ll128",
            extended=ar,
        ),
        _region(
            "ring",
            "LL128",
            (369098752, 128),
            (109051904, 64),
            (54525952, 32),
            (31457280, 16),
            (62914560, 16),
            (603979776, 32),
            (1006632960, 64),
            (1006632960, 128),
            extended=ar,
        ),
        _region(
            "nvls-tree",
            "Simple",
            "tree_ll128",
            (251658240, 2048),
            (218103808, 1024),
            (184549376, 512),
            (125829120, 256),
            (125829120, 128),
            (109051904, 64),
            (369098752, 128),
            (1006632960, 128),
            (1006632960, 64),
            (603979776, 32),
            (62914560, 16),
            (top, 16),
            (603979776, 32),
            (2013265920, 64),
            (4026531840, 128),
            (9663676416, 256),
            (19327352832, 512),
            "nvlstree_simple",
            extended=ar,
        ),
        _region(
            "ring",
            "Simple",
            "nvlstree_simple",
            (19327352832, 512),
            (9663676416, 256),
            (4026531840, 128),
            (2013265920, 64),
            (603979776, 32),
            (top, 16),
            extended=ar,
        ),
    )
    gathers = {
        "ring_ll": _extend((109051904, 1024), (218103808, 2048)),
        "ring_ll128": _extend((13958643712, 512), (27917287424, 1024)),
    }
    ladder = (
        (1703936, 16),
        (3407872, 32),
        (6815744, 64),
        (13631488, 128),
        (27262976, 256),
        (54525952, 512),
        (109051904, 1024),
        (218103808, 2048),
    )
    top_edge = ((6979321856, 256), (13958643712, 512), (27917287424, 1024))

    def ring_regions(ll128_edge: tuple[Point, ...]) -> tuple[Region, ...]:
        return (
            _region("ring", "LL", (0, 16), *ladder, "ring_ll", (0, MAX_RANKS), extended=gathers),
            _region(
                "ring", "LL128", "ring_ll", *reversed(ladder), *ll128_edge, *top_edge, "ring_ll128", extended=gathers
            ),
            _region(
                "ring", "Simple", "ring_ll128", *reversed(top_edge), *reversed(ll128_edge), (top, 16), extended=gathers
            ),
        )

    # The rings' LL128 edge from 16 to 128 ranks, all-gather's then reduce-scatter's.
    all_gather = ring_regions(((436207616, 16), (872415232, 32), (1744830464, 64), (3489660928, 128)))
    reduce_scatter = ring_regions(((301989888, 16), (738197504, 32), (1207959552, 64), (3489660928, 128)))
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


def _p6_b300_per_node_1() -> dict[str, tuple[Region, ...]]:
    top = MAX_SIZE
    ar = {
        "tree_ll128": _extend((1441792, 16), (1441792, 256)),
        "tree_simple": _extend((503316480, 128), (1476395008, 256)),
    }
    all_reduce = (
        _region("tree", "LL", (0, 2), (65536, 2), (65536, 64), (65536, MAX_RANKS), (0, MAX_RANKS), extended=ar),
        _region(
            "tree",
            "LL128",
            (65536, MAX_RANKS),
            (65536, 64),
            (65536, 2),
            (294912, 2),
            (720896, 4),
            (1179648, 8),
            (1441792, 16),
            (1441792, 128),
            (1441792, 256),
            "tree_ll128",
            extended=ar,
        ),
        _region(
            "tree",
            "Simple",
            "tree_ll128",
            (1441792, 256),
            (1441792, 128),
            (1441792, 16),
            (1179648, 8),
            (2359296, 8),
            (4718592, 16),
            (75497472, 32),
            (218103808, 64),
            (503316480, 128),
            (1476395008, 256),
            "tree_simple",
            extended=ar,
        ),
        _region(
            "ring",
            "LL128",
            (1476395008, 256),
            (503316480, 128),
            (218103808, 64),
            (75497472, 32),
            (4718592, 16),
            (2359296, 8),
            (1179648, 8),
            (720896, 4),
            (294912, 2),
            (3407872, 2),
            (13631488, 4),
            (31457280, 8),
            (75497472, 16),
            (150994944, 32),
            (301989888, 64),
            (603979776, 128),
            extended=ar,
        ),
        _region(
            "ring",
            "Simple",
            "tree_simple",
            (1476395008, 256),
            (603979776, 128),
            (301989888, 64),
            (150994944, 32),
            (75497472, 16),
            (31457280, 8),
            (13631488, 4),
            (3407872, 2),
            (top, 2),
            extended=ar,
        ),
    )
    ag = {
        "pat_simple": _extend((369098752, 128), (738197504, 256)),
        "ring_ll128": _extend((603979776, 128), (1207959552, 256)),
    }
    ag_ll = ((0, 2), (147456, 2), (131072, 12), (106496, 8), (65536, 4), (57344, 8), (36864, 4), (32768, 3), (4608, 4))
    ag_pat = ((294912, 4), (4718592, 8), (9437184, 16), (75497472, 32), (218103808, 64), (369098752, 128))
    ag_ring = (
        (5767168, 2),
        (15728640, 4),
        (37748736, 8),
        (75497472, 16),
        (150994944, 32),
        (301989888, 64),
        (603979776, 128),
        (1207959552, 256),
    )
    all_gather = (
        _region("ring", "LL", *ag_ll, (0, 8), extended=ag),
        _region(
            "pat",
            "Simple",
            (0, MAX_RANKS),
            (0, 8),
            *reversed(ag_ll[1:]),
            *ag_pat,
            (738197504, 256),
            "pat_simple",
            extended=ag,
        ),
        _region(
            "ring",
            "LL128",
            "pat_simple",
            (738197504, 256),
            *reversed(ag_pat),
            (147456, 2),
            *ag_ring,
            "ring_ll128",
            extended=ag,
        ),
        _region("ring", "Simple", "ring_ll128", *reversed(ag_ring), (34359738368, 2), extended=ag),
    )
    rs = {
        "pat_simple": _extend((503316480, 128), (1006632960, 256)),
        "ring_ll128": _extend((603979776, 128), (1207959552, 256)),
    }
    rs_ll = ((0, 2), (45056, 2), (147456, 4), (131072, 8), (36864, 4), (4608, 4), (4096, 6))
    rs_pat = ((2359296, 4), (4718592, 8), (67108864, 16), (92274688, 32), (218103808, 64), (503316480, 128))
    rs_ring = (
        (3932160, 2),
        (11534336, 4),
        (31457280, 8),
        (75497472, 16),
        (150994944, 32),
        (301989888, 64),
        (603979776, 128),
        (1207959552, 256),
    )
    reduce_scatter = (
        _region("ring", "LL", *rs_ll, (0, 8), extended=rs),
        _region(
            "pat",
            "Simple",
            (0, MAX_RANKS),
            (0, 8),
            *reversed(rs_ll[1:]),
            *rs_pat,
            (1006632960, 256),
            "pat_simple",
            extended=rs,
        ),
        _region(
            "ring",
            "LL128",
            "pat_simple",
            (1006632960, 256),
            *reversed(rs_pat),
            (45056, 2),
            *rs_ring,
            "ring_ll128",
            extended=rs,
        ),
        _region("ring", "Simple", "ring_ll128", *reversed(rs_ring), (top, 2), extended=rs),
    )
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


def _p5_per_node_8() -> dict[str, tuple[Region, ...]]:
    ar = {
        "tree_ll128": _extend((402653184, 2048), (402653184, 4096)),
        "nvlstree_simple_1": _extend((8053063680, 160), (9663676416, 192)),
        "nvlstree_simple_2": _extend((402653184, 2048), (402653184, 4096)),
        "ring_simple": _extend((8053063680, 160), (9663676416, 192)),
    }
    all_reduce = (
        _region(
            "tree",
            "LL128",
            (0, 16),
            (31457280, 16),
            (37748736, 32),
            (117440512, 64),
            (301989888, 128),
            (301989888, 256),
            (335544320, 512),
            (536870912, 1024),
            (402653184, 2048),
            (402653184, 4096),
            "tree_ll128",
            (0, 2 ** ar["tree_ll128"][1]),
            extended=ar,
        ),
        _region("nvls-tree", "Simple", (31457281, 16), (MAX_SIZE, 16), (31457281, 16), extended=ar),
        _region(
            "ring",
            "LL128",
            (31457280, 17),
            (1073741824, 17),
            (2147483648, 64),
            (2147483648, 128),
            (1342177280, 160),
            (2147483648, 256),
            (1074790400, 256),
            (444596224, 160),
            (301989888, 128),
            (117440512, 64),
            (37748736, 32),
            extended=ar,
        ),
        _region(
            "nvls-tree",
            "Simple",
            (2147483648, 128),
            (6442450944, 128),
            (8053063680, 160),
            (9663676416, 192),
            "nvlstree_simple_1",
            "nvlstree_simple_2",
            (402653184, 4096),
            (402653184, 2048),
            (536870912, 1024),
            (335544320, 512),
            (301989888, 256),
            (310378496, 160),
            (444596224, 160),
            (1074790400, 256),
            (2684354560, 256),
            (2147483648, 224),
            (1342177280, 160),
            extended=ar,
        ),
        _region(
            "ring",
            "Simple",
            (1073741824, 17),
            (2 ** ar["ring_simple"][0], 17),
            "ring_simple",
            (9663676416, 192),
            (8053063680, 160),
            (2684354560, 64),
            (1610612736, 32),
            extended=ar,
        ),
    )
    return {"all-reduce": all_reduce}


def _p5_per_node_2() -> dict[str, tuple[Region, ...]]:
    ar = {
        "tree_ll128": _extend((88160256, 128), (178163712, 256)),
        "tree_simple_1": _extend((787480576, 128), (1073741824, 256)),
        "tree_simple_2": _extend((257114112, 128), (269484032, 256)),
        "nvlstree_simple": _extend((787480576, 128), (1073741824, 256)),
    }
    all_reduce = (
        _region(
            "tree",
            "LL128",
            (0, 4),
            (1314816, 4),
            (1051648, 8),
            (1051648, 12),
            (2367488, 16),
            (5525504, 32),
            (9473024, 64),
            (88160256, 128),
            (178163712, 256),
            "tree_ll128",
            (0, 2 ** ar["tree_ll128"][1]),
            extended=ar,
        ),
        _region(
            "ring",
            "LL128",
            (1314816, 4),
            (19736576, 4),
            (41842688, 8),
            (296747008, 64),
            (257114112, 128),
            (269484032, 256),
            (178163712, 256),
            (88160256, 128),
            (9473024, 64),
            (5525504, 32),
            (2367488, 16),
            (1051648, 12),
            (1051648, 8),
            (1314816, 4),
            extended=ar,
        ),
        _region(
            "nvls-tree",
            "Simple",
            (19736576, 4),
            (81844224, 4),
            (275775488, 8),
            (275775488, 48),
            (296747008, 64),
            (41842688, 8),
            extended=ar,
        ),
        _region("tree", "LL128", (81844224, 4), (269484032, 4), (81844224, 4), extended=ar),
        _region("tree", "Simple", (269484032, 4), (MAX_SIZE, 4), (269484032, 4), extended=ar),
        _region(
            "ring",
            "Simple",
            (81844224, 5),
            (MAX_SIZE, 5),
            (MAX_SIZE, 32),
            (1073741824, 40),
            (1073741824, 128),
            (787480576, 128),
            (296747008, 64),
            (275775488, 48),
            (275775488, 8),
            (81844224, 5),
            extended=ar,
        ),
        _region(
            "tree",
            "Simple",
            (296747008, 64),
            (787480576, 128),
            (1073741824, 256),
            "tree_simple_1",
            "tree_simple_2",
            (269484032, 256),
            (257114112, 128),
            extended=ar,
        ),
        _region(
            "nvls-tree",
            "Simple",
            "nvlstree_simple",
            (1073741824, 256),
            (787480576, 128),
            (1073741824, 128),
            (1073741824, 40),
            (MAX_SIZE, 32),
            extended=ar,
        ),
    )
    return {"all-reduce": all_reduce}


def _p5_per_node_1() -> dict[str, tuple[Region, ...]]:
    ext = {
        "ar_tree_ll128": _extend((9999360, 64), (119477248, 128)),
        "ar_ring_ll128": _extend((4736000, 2), (269484032, 128)),
        "ag_ring_simple": _extend((4194304, 2), (8589934592, 2048)),
        "rs_ring_simple": _extend((8388608, 2), (4294967296, 1024)),
    }
    all_reduce = (
        _region(
            "tree",
            "LL128",
            (0, 16),
            (2367488, 16),
            (9999360, 64),
            (119477248, 128),
            "ar_tree_ll128",
            (0, MAX_RANKS),
            extended=ext,
        ),
        _region(
            "ring",
            "LL128",
            (0, 2),
            (4736000, 2),
            (269484032, 128),
            "ar_ring_ll128",
            "ar_tree_ll128",
            (119477248, 128),
            (9999360, 64),
            (2367488, 16),
            (0, 16),
            extended=ext,
        ),
        _region("ring", "Simple", (4736000, 2), (MAX_SIZE, 2), "ar_ring_ll128", (269484032, 128), extended=ext),
    )
    all_gather = (
        _region("ring", "Simple", (4194304, 2), (MAX_SIZE, 2), "ag_ring_simple", (8589934592, 2048), extended=ext),
    )
    reduce_scatter = (
        _region("ring", "Simple", (8388608, 2), (MAX_SIZE, 2), "rs_ring_simple", (4294967296, 1024), extended=ext),
    )
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


def _p5en_per_node_8() -> dict[str, tuple[Region, ...]]:
    top, ranks = MAX_SIZE, MAX_RANKS
    ar = {
        "tree_ll": _extend((196608, 192), (196608, 1024)),
        "tree_ll128": _extend((129499136, 127), (218103808, 1024)),
        "nvlstree_simple": _extend((7516192768, 256), (17179869184, 448)),
    }
    all_reduce = (
        _region("tree", "LL", (0, 16), (196608, 16), (196608, 1024), "tree_ll", (0, ranks), extended=ar),
        _region(
            "tree",
            "LL128",
            "tree_ll",
            (196608, 1024),
            (196608, 16),
            (13107200, 16),
            (129499136, 127),
            (218103808, 1024),
            "tree_ll128",
            extended=ar,
        ),
        _region(
            "ring",
            "LL128",
            (129499136, 127),
            (13107200, 16),
            (29884416, 16),
            (293601280, 32),
            (589299712, 64),
            (549453824, 128),
            extended=ar,
        ),
        _region(
            "nvls-tree",
            "Simple",
            "tree_ll128",
            (218103808, 1024),
            (129499136, 127),
            (549453824, 128),
            (589299712, 64),
            (293601280, 32),
            (29884416, 16),
            (top, 16),
            (509607936, 32),
            (7516192768, 256),
            (17179869184, 448),
            "nvlstree_simple",
            extended=ar,
        ),
        _region(
            "ring",
            "Simple",
            "nvlstree_simple",
            (17179869184, 448),
            (7516192768, 256),
            (509607936, 32),
            (top, 16),
            extended=ar,
        ),
    )
    ag = {
        "ring_ll": _extend((28305408, 768), (33554432, 1024)),
        "ring_ll128": _extend((7247754240, 384), (17179865088, 896)),
    }
    all_gather = (
        _region(
            "ring",
            "LL",
            (0, 16),
            (786432, 16),
            (4718592, 128),
            (13630464, 384),
            (19922944, 512),
            (28305408, 768),
            (33554432, 1024),
            "ring_ll",
            (0, ranks),
            extended=ag,
        ),
        _region(
            "ring",
            "LL128",
            "ring_ll",
            (33554432, 1024),
            (28305408, 768),
            (19922944, 512),
            (13630464, 384),
            (4718592, 128),
            (786432, 16),
            (236978176, 16),
            (956301312, 64),
            (7247754240, 384),
            (17179865088, 896),
            "ring_ll128",
            extended=ag,
        ),
        _region(
            "ring",
            "Simple",
            "ring_ll128",
            (17179865088, 896),
            (7247754240, 384),
            (956301312, 64),
            (494927872, 32),
            (236978176, 16),
            (top, 16),
            extended=ag,
        ),
    )
    rs = {
        "ring_ll": _extend((7340032, 256), (18874368, 512)),
        "ring_ll128": _extend((7247757312, 256), (17179869184, 640)),
    }
    reduce_scatter = (
        _region(
            "ring",
            "LL",
            (0, 16),
            (786432, 16),
            (4718592, 128),
            (7340032, 256),
            (18874368, 512),
            "ring_ll",
            (0, ranks),
            extended=rs,
        ),
        _region(
            "ring",
            "LL128",
            "ring_ll",
            (18874368, 512),
            (7340032, 256),
            (4718592, 128),
            (786432, 16),
            (291504128, 16),
            (589299712, 32),
            (2415919104, 128),
            (7247757312, 256),
            (17179869184, 640),
            "ring_ll128",
            extended=rs,
        ),
        _region(
            "ring",
            "Simple",
            "ring_ll128",
            (17179869184, 640),
            (7247757312, 256),
            (2415919104, 128),
            (589299712, 32),
            (291504128, 16),
            (top, 16),
            extended=rs,
        ),
    )
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


def _p5en_per_node_1() -> dict[str, tuple[Region, ...]]:
    top, ranks = MAX_SIZE, MAX_RANKS
    ext = {
        "tree_ll128": _extend((524288, 8), (1048576, 96)),
        "tree_simple": _extend((8388608, 32), (33554432, 128)),
        "ring_ll128": _extend((50331648, 16), (301989888, 128)),
        "pat_simple": _extend((50331648, 64), (117440512, 128)),
    }
    all_reduce = (
        _region("tree", "LL", (0, 2), (65536, 2), (65536, 64), (65536, ranks), extended=ext),
        _region(
            "tree",
            "LL128",
            (65536, ranks),
            (65536, 64),
            (65536, 2),
            (262144, 2),
            (1048576, 4),
            (4194304, 8),
            (16777216, 16),
            (33554432, 32),
            (1048576, 32),
            (1048576, 96),
            "tree_ll128",
            extended=ext,
        ),
        _region(
            "tree",
            "Simple",
            "tree_ll128",
            (1048576, 96),
            (1048577, 32),
            (33554431, 32),
            (33554432, 128),
            "tree_simple",
            extended=ext,
        ),
        _region(
            "ring",
            "LL128",
            "tree_simple",
            (33554432, 128),
            (33554433, 32),
            (16777217, 16),
            (4194305, 8),
            (1048577, 4),
            (262144, 2),
            (6291456, 2),
            (50331648, 16),
            (301989888, 128),
            "ring_ll128",
            extended=ext,
        ),
        _region("ring", "Simple", "ring_ll128", (301989888, 128), (50331648, 16), (6291456, 2), (top, 2), extended=ext),
    )
    all_gather = (
        _region(
            "pat",
            "Simple",
            (0, 2),
            (65536, 2),
            (1048576, 2),
            (8388608, 8),
            (16777216, 16),
            (16777216, 32),
            (50331648, 64),
            (117440512, 128),
            "pat_simple",
            (top, ranks),
            (65536, ranks),
            (0, ranks),
            extended=ext,
        ),
        _region(
            "ring",
            "LL128",
            "pat_simple",
            (117440512, 128),
            (50331648, 64),
            (16777216, 32),
            (16777217, 16),
            (8388609, 8),
            (1048576, 2),
            (4194304, 2),
            (50331648, 16),
            (301989888, 128),
            "ring_ll128",
            extended=ext,
        ),
        _region("ring", "Simple", "ring_ll128", (301989888, 128), (50331648, 16), (4194304, 2), (top, 2), extended=ext),
    )
    reduce_scatter = (
        _region(
            "pat",
            "Simple",
            (0, 2),
            (65536, 2),
            (1048576, 2),
            (16777216, 32),
            (50331648, 64),
            (117440512, 128),
            "pat_simple",
            (top, ranks),
            (65536, ranks),
            (0, ranks),
            extended=ext,
        ),
        _region(
            "ring",
            "LL128",
            "pat_simple",
            (117440512, 128),
            (50331648, 64),
            (16777216, 32),
            (1048576, 2),
            (4194304, 2),
            (50331648, 16),
            (301989888, 128),
            "ring_ll128",
            extended=ext,
        ),
        _region("ring", "Simple", "ring_ll128", (301989888, 128), (50331648, 16), (4194304, 2), (top, 2), extended=ext),
    )
    return {"all-reduce": all_reduce, "all-gather": all_gather, "reduce-scatter": reduce_scatter}


# Per platform (a fabric's name), per GPUs of each node in the group: the regions of each collective.
REGIONS = {
    "p5": {8: _p5_per_node_8(), 2: _p5_per_node_2(), 1: _p5_per_node_1()},
    "p5en": {8: _p5en_per_node_8(), 1: _p5en_per_node_1()},
    "p6-b200": {8: _p6_per_node_8(), 1: _p6_per_node_1()},
    "p6-b300": {8: _p6_b300_per_node_8(), 1: _p6_b300_per_node_1()},
}


def _cross(a: Point, b: Point) -> float:
    return a[0] * b[1] - a[1] * b[0]


def _sub(a: Point, b: Point) -> Point:
    return (a[0] - b[0], a[1] - b[1])


def _intersect(x0: Point, x1: Point, y0: Point, y1: Point) -> tuple[int, Point]:
    """The source's `intersect`: 1 where segment x0-x1 crosses y0-y1, -1 where not, 0 where the
    crossing is at an end of y0-y1 (or the two are parallel); and where the lines cross."""
    dx, dy = _sub(x1, x0), _sub(y1, y0)
    d = _cross(dy, dx)
    if abs(d) < EPS:
        return 0, (0.0, 0.0)
    a = (_cross(x0, dx) - _cross(y0, dx)) / d
    crossing = (y0[0] + a * dy[0], y0[1] + a * dy[1])
    if a < -EPS or a > 1 + EPS:
        return -1, crossing
    if a < EPS or a > 1 - EPS:
        return 0, crossing
    b = (_cross(x0, dy) - _cross(y0, dy)) / d
    return (-1 if b < 0 or b > 1 else 1), crossing


def _on_edge(p: Point, y0: Point, y1: Point) -> bool:
    dy = _sub(y1, y0)
    found, crossing = _intersect(p, (p[0] + dy[1], p[1] - dy[0]), y0, y1)
    if found == -1:
        return False
    gap = _sub(crossing, p)
    return math.hypot(*gap) < EPS


def _holds(p: Point, vertices: tuple[Point, ...]) -> bool:
    """The source's `is_inside_region`, inside or on an edge: an edge first, then a ray to a point
    beyond every region crossing the edges an odd number of times."""
    edges = list(zip(vertices, vertices[1:] + vertices[:1], strict=True))
    if any(_on_edge(p, a, b) for a, b in edges):
        return True
    xs, ys = [v[0] for v in vertices], [v[1] for v in vertices]
    if not (min(xs) <= p[0] <= max(xs) and min(ys) <= p[1] <= max(ys)):
        return False
    far = _log((2 * MAX_SIZE, 2 * MAX_RANKS))
    return sum(_intersect(p, far, a, b)[0] == 1 for a, b in edges) % 2 == 1


def region_choice(
    platform: str, kind: str, payload: float, ranks: int, nodes: int, runnable: set[tuple[str, str]]
) -> tuple[str, str] | None:
    """The (algorithm, protocol) aws-ofi-nccl's tuner sets for one collective on `platform`, among the
    `runnable` ones; None where it leaves the choice to NCCL's model."""
    by_shape = REGIONS.get(platform)
    if by_shape is None or nodes < FIRST_TUNED_NODES or ranks % nodes:
        return None
    regions = by_shape.get(ranks // nodes, {}).get(kind)
    if not regions or payload > MAX_SIZE or ranks > MAX_RANKS:
        return None
    point = _log((payload, ranks))
    for algorithm, protocol, vertices in regions:
        if (algorithm, protocol) in runnable and _holds(point, vertices):
            return algorithm, protocol
    return None
