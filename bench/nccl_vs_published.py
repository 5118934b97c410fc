#!/usr/bin/env python3
"""The planner's collectives against published nccl-tests figures: every row of
bench/data/nccl_tests_published.csv (a collective, a cluster and a size, with the bus bandwidth
or, for the smallest sizes, the time nccl-tests printed) planned as NCCL's model would run it,
planned beside published, and the algorithm and protocol the model picks. A row timed as one call
after a barrier (ml-engineering's all_reduce_bench.py records its start event, then torch.distributed
issues the collective) holds that call's issue on the host as well: it is planned with it
(host_issue.HOST_S_PER_COLLECTIVE), where nccl-tests' loop of queued calls hides it.

    python bench/nccl_vs_published.py              # written to bench/results/nccl_vs_published.md
    python bench/nccl_vs_published.py --out -      # printed only

Then, apart from those rows, whole size sweeps (1 MiB up) published on other clusters
(bench/data/nccl_tests_sweeps.csv): the plan's bandwidth against each sweep by size band. The
planner's measured share of the large-size rate across nodes, and inside one node for NVLS and an
A100's ring, is read from them (bench/collective_ramp.py).

No torch, on the CPU, in well under a second. One constant of the network model is fitted to
rows of it, the fat tree's span loss (fabric.RING_SPAN_LOSS) to the NDR cluster's reduce-scatter
from 4 to 128 nodes: those rows check its shape, not its size; no other constant was set from
them (docs/planner.md says where each comes from).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import shlex
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.common.hardware import gpu_spec, known_gpus  # noqa: E402
from harness.plan.model.model_shape import PlanError  # noqa: E402
from harness.plan.network.fabric import Topology, default_fabric, parse_fabric, topology_of  # noqa: E402
from harness.plan.network.nccl_tuning import Choice, bus_bandwidth  # noqa: E402
from harness.plan.speed.host_issue import HOST_S_PER_COLLECTIVE  # noqa: E402

CSV = ROOT / "bench" / "data" / "nccl_tests_published.csv"
SWEEPS = ROOT / "bench" / "data" / "nccl_tests_sweeps.csv"
# The size bands a sweep is summarised in: up to 16 MiB, 32-256 MiB, 512 MiB and up.
BANDS = ((2**20, 2**24, "1-16 MiB"), (2**25, 2**28, "32-256 MiB"), (2**29, 2**35, "512 MiB-16 GiB"))
COLUMNS = ("source", "collective", "gpu", "gpus", "nodes", "inter_node", "size_bytes", "published_busbw_gbs")
# How a row's time was taken: nccl-tests' loop of queued calls (the default where the column is absent), or
# one call timed from an event recorded before the host issued it.
LOOP, ONE_CALL = "a loop of calls", "one call after a barrier"


@dataclass(frozen=True)
class Row:
    source: str
    collective: str
    gpu: str
    gpus: int
    nodes: int
    inter_node: str
    size: int
    busbw_gbs: float | None  # what nccl-tests printed as busbw, or
    time_us: float | None  # its time, where the size is too small for a bandwidth
    nvls_off: bool = False  # run with NCCL_NVLS_ENABLE=0 (its notes say so)
    one_call: bool = False  # timed as ONE_CALL: the host's issue of the call is in its time


@dataclass(frozen=True)
class Planned:
    row: Row
    choice: Choice

    @property
    def seconds(self) -> float:
        """The collective's time as the row's benchmark timed it."""
        return self.choice.seconds + (HOST_S_PER_COLLECTIVE if self.row.one_call else 0.0)

    @property
    def busbw_gbs(self) -> float:
        return bus_bandwidth(self.row.collective, self.row.size, self.seconds, self.row.gpus) / 1e9

    @property
    def error(self) -> float:
        """Planned over published, less one: in bandwidth, or in time where the row gives a time."""
        if self.row.busbw_gbs is not None:
            return self.busbw_gbs / self.row.busbw_gbs - 1
        return self.seconds * 1e6 / self.row.time_us - 1


def read_rows(path: Path = CSV) -> list[Row]:
    """The published rows; a missing column or a bad number is a one-line PlanError."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise PlanError(f"{path}: missing columns {', '.join(missing)}: see bench/data/README.md")
        rows = []
        for n, r in enumerate(reader, start=2):
            timing = (r.get("timing") or LOOP).strip()
            if timing not in (LOOP, ONE_CALL):
                raise PlanError(f"{path}:{n}: timing {timing!r}: give {LOOP!r} or {ONE_CALL!r}")
            try:
                busbw, time = r["published_busbw_gbs"].strip(), r.get("published_time_us", "").strip()
                rows.append(
                    Row(
                        r["source"],
                        r["collective"],
                        r["gpu"],
                        int(r["gpus"]),
                        int(r["nodes"]),
                        r["inter_node"],
                        int(r["size_bytes"]),
                        float(busbw) if busbw else None,
                        float(time) if time else None,
                        "NCCL_NVLS_ENABLE=0" in r.get("notes", ""),
                        timing == ONE_CALL,
                    )
                )
            except ValueError as exc:
                raise PlanError(f"{path}:{n}: {exc}: give whole numbers of GPUs, nodes and bytes") from None
            if (rows[-1].busbw_gbs is None) == (rows[-1].time_us is None):
                raise PlanError(f"{path}:{n}: give one of published_busbw_gbs and published_time_us")
    return rows


def topology(row: Row) -> Topology:
    spec = gpu_spec(row.gpu)
    if spec is None:
        raise PlanError(f"{row.source}: gpu {row.gpu!r} is not a card the planner knows: use one of {known_gpus()}")
    inter = row.inter_node
    fabric = parse_fabric(inter) if inter != "unstated" else default_fabric(spec, row.gpus // row.nodes)
    topology = topology_of(spec, row.gpus, row.nodes, fabric)
    if row.nvls_off:
        return replace(topology, hopper_nvswitch=False)
    return topology


def plan(row: Row) -> Planned:
    t = topology(row)
    return Planned(row, t.choice(t.world(), row.collective, row.size))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def report(planned: list[Planned]) -> list[str]:
    lines = [
        "| source | collective | GPUs (nodes) | fabric | size | published | planned | error | NCCL's choice |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for p in planned:
        r = p.row
        if r.busbw_gbs is not None:
            published, ours = f"{r.busbw_gbs:g} GB/s", f"{p.busbw_gbs:.1f} GB/s"
        else:
            published, ours = f"{r.time_us:g} us", f"{p.seconds * 1e6:.1f} us"
        issue = " + the call's issue" if r.one_call else ""
        lines.append(
            f"| {r.source} | {r.collective} | {r.gpus} ({r.nodes}) | {r.inter_node} | {_size(r.size)} | "
            f"{published} | {ours} | {p.error:+.1%} | {p.choice.describe()}{issue} |"
        )
    errors = [abs(p.error) for p in planned if p.row.busbw_gbs is not None]
    return lines + [
        "",
        f"Bus bandwidth rows: {len(errors)}, median |error| {statistics.median(errors):.1%}, "
        f"largest {max(errors):.1%}.",
    ]


def _band(planned: list[Planned], low: int, high: int) -> str:
    ratios = [p.busbw_gbs / p.row.busbw_gbs for p in planned if low <= p.row.size <= high]
    return f"{statistics.median(ratios):.2f}" if ratios else "-"


def sweep_lines(planned: list[Planned]) -> list[str]:
    """Each sweep (a source and its node count): planned over published bus bandwidth, the median of
    each size band, and every point's |error| together."""
    sweeps: dict[tuple[str, int], list[Planned]] = {}
    for p in planned:
        sweeps.setdefault((p.row.source, p.row.nodes), []).append(p)
    lines = [
        "## Whole sweeps from other clusters, apart from the rows above",
        "",
        "Every size from 1 MiB of all-reduce sweeps published on other clusters "
        "(`bench/data/nccl_tests_sweeps.csv`, sources and systems in bench/data/README.md), planned as above. "
        "The share of its large-size rate a collective runs at below it across nodes, and as NVLS or an A100 "
        "node's ring inside one (harness/plan/network/collective_ramp.json), is read from these sweeps "
        "(`python bench/collective_ramp.py`), so here they check that reading; the rows above are from other "
        "sources. Columns: the median of planned over published bus bandwidth in each size band "
        "(above 1: planned fast).",
        "",
        "| source | GPU | GPUs (nodes) | fabric | " + " | ".join(b[2] for b in BANDS) + " | NCCL's choice at 64 MiB |",
        "|---|---|---:|---|" + "---:|" * len(BANDS) + "---|",
    ]
    for (source, nodes), points in sweeps.items():
        r = points[0].row
        at_64 = next((p.choice.describe() for p in points if p.row.size == 2**26), "-")
        bands = " | ".join(_band(points, low, high) for low, high, _ in BANDS)
        lines.append(f"| {source} | {r.gpu} | {r.gpus} ({nodes}) | {r.inter_node} | {bands} | {at_64} |")
    errors = [abs(p.error) for p in planned]
    within = sum(e <= 0.15 for e in errors) / len(errors)
    return lines + [
        "",
        f"{len(errors)} points of {len(sweeps)} sweeps: median |error| {statistics.median(errors):.1%}, "
        f"{within:.0%} within 15%; by band, median planned / published "
        + ", ".join(f"{name} {_band(planned, low, high)}" for low, high, name in BANDS)
        + ".",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "nccl_vs_published.md"), help="'-': print only")
    args = p.parse_args(argv)
    try:
        lines = report([plan(row) for row in read_rows()])
        lines += ["", *sweep_lines([plan(row) for row in read_rows(SWEEPS)])]
    except PlanError as exc:
        print(f"nccl_vs_published: error: {exc}", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = shlex.join(["python", "bench/nccl_vs_published.py", *argv])
    text = "\n".join([f"## {now}", "", f"Command: `{command}`", "", *lines])
    print(text)
    if args.out != "-":
        Path(args.out).write_text(
            "# The planner's collectives against published nccl-tests figures\n\n"
            "Written by `bench/nccl_vs_published.py` from `bench/data/nccl_tests_published.csv` (sources in "
            "bench/data/README.md). Error: planned over published, less one, in bus bandwidth, or in time for the "
            "8-byte rows. A row timed as one call after a barrier (its `timing`) is planned with the host's issue "
            f"of that call, {HOST_S_PER_COLLECTIVE * 1e6:.0f} us (harness/plan/speed/host_issue.py).\n\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
