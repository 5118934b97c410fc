#!/usr/bin/env python3
"""How fast a collective across nodes, or NVLS or an NVLink ring inside one, reaches its large-size bus
bandwidth, as published nccl-tests sweeps measured it: for each network kind, the share of a sweep's
highest busbw that each size ran at, by the time the size takes at that highest rate, the median over
the sweeps in each doubling.
The planner reads the table (harness/plan/network/collective_ramp.json) to time mid-sized
collectives (collective_ramp.py says how).

    python bench/collective_ramp.py              # writes harness/plan/network/collective_ramp.json
    python bench/collective_ramp.py --out -      # prints it only

From bench/data/nccl_tests_sweeps.csv (sources in bench/data/README.md); the goal's rows,
bench/data/nccl_tests_published.csv, are not read.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.nccl_vs_published import SWEEPS, Row, read_rows  # noqa: E402
from harness.common.hardware import gpu_spec  # noqa: E402
from harness.plan.network.collective_ramp import NVLS, TABLE, ring_kind  # noqa: E402
from harness.plan.network.fabric import NVLS_EFFICIENCY, parse_fabric  # noqa: E402


def _read(row: Row) -> bool:
    """An all-reduce's bus bandwidth across nodes, or inside one NVSwitch node (NVLS from Hopper on,
    NCCL's ring on an A100's); one node of RCCL's Infinity Fabric mesh is RCCL's own model's."""
    if row.collective != "all-reduce" or not row.busbw_gbs:
        return False
    spec = gpu_spec(row.gpu)
    return row.nodes > 1 or (spec is not None and spec.scale_up == "nvswitch")


def _sweeps(rows: list[Row]) -> dict[tuple[str, int], list[Row]]:
    sweeps: dict[tuple[str, int], list[Row]] = {}
    for row in filter(_read, rows):
        sweeps.setdefault((row.source, row.nodes), []).append(row)
    return sweeps


def _kind(row: Row) -> str:
    """A sweep's network kind; one NVSwitch node's is NVLS where the card has it (NCCL runs NVLS there
    from 2 MiB), else the ring of the card's generation."""
    if row.nodes > 1:
        return parse_fabric(row.inter_node).kind
    generation = gpu_spec(row.gpu).generation
    return NVLS if generation in NVLS_EFFICIENCY else ring_kind(generation)


def ramp_table(rows: list[Row]) -> dict[str, list[list[float]]]:
    """By network kind: [microseconds at the sweep's highest rate, share of that rate] a doubling,
    the median over every sweep's points in it, in order of time."""
    bins: dict[str, dict[int, list[float]]] = {}
    for points in _sweeps(rows).values():
        kind = _kind(points[0])
        peak = max(p.busbw_gbs for p in points)
        n = points[0].gpus
        for p in points:
            at_peak_us = p.size * 2 * (n - 1) / n / (peak * 1e9) * 1e6  # busbw's bytes at the highest rate
            bins.setdefault(kind, {}).setdefault(round(math.log2(at_peak_us)), []).append(p.busbw_gbs / peak)
    return {
        kind: [[2.0**power, round(statistics.median(shares), 3)] for power, shares in sorted(by_power.items())]
        for kind, by_power in sorted(bins.items())
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(TABLE), help="'-': print only")
    args = p.parse_args(argv)
    rows = read_rows(SWEEPS)
    table = {
        "command": "python bench/collective_ramp.py",
        "from": "bench/data/nccl_tests_sweeps.csv: "
        + "; ".join(f"{source} ({nodes} nodes)" for source, nodes in _sweeps(rows)),
        "kinds": ramp_table(rows),
    }
    kinds = ",\n".join(f'  "{kind}": {json.dumps(points)}' for kind, points in table.pop("kinds").items())
    text = json.dumps(table, indent=1)[:-2] + ',\n "kinds": {\n' + kinds + "\n }\n}\n"
    print(text, end="")
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
