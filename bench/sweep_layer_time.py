"""The Ultra-Scale Playbook sweep's time per layer and micro-batch, published beside planned, for
bench/plan_vs_published.py's section on the sweep.

Each run gives one step's tokens/s per GPU. A step of a nanotron run is its pipeline's (or its
accumulation's) micro-batches one after another, each through the layers of one stage, with the
pipeline's fill and drain: a layer's time on a micro-batch is the step's over those layer passes.
Where this time holds still while the work per micro-batch doubles, what sets it is not the work:
the tables show where the published runs do that and where the plan does.

Works on the script's outcomes (each with `row`, `published`, `predicted`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from bench.layout_kinds import degrees, gpus_per_node, layer_slots, step_seconds

TENSOR_DEGREES = (1, 2, 4, 8)  # tensor parallelism inside a node, where the pipeline is what crosses nodes
MICRO_BATCHES = (2, 4, 8)  # against the same layout at micro-batch 1


def layer_seconds(row: dict[str, str], tokens_per_s_gpu: float) -> float | None:
    """Seconds one layer of a stage takes on one micro-batch of a run at `tokens_per_s_gpu`: its step over
    the layer passes one GPU runs in it (layout_kinds.layer_slots); None where the stages split the layers
    unevenly."""
    slots = layer_slots(int(row["n_layers"]), degrees(row["sharding"]).pp, int(row["grad_accum"]))
    if slots is None:
        return None
    return step_seconds(row, tokens_per_s_gpu) / slots


def _placement(row: dict[str, str]) -> str:
    pipeline = "pp 1" if degrees(row["sharding"]).pp == 1 else "pp >= 2"
    return f"{pipeline}, {'one node' if int(row['nodes']) == 1 else '2+ nodes'}"


PLACEMENTS = ("pp 1, one node", "pp 1, 2+ nodes", "pp >= 2, one node", "pp >= 2, 2+ nodes")


def _cell(pairs: list[tuple[float, float]]) -> str:
    """Published / planned milliseconds, medians, and how many runs."""
    if not pairs:
        return "-"
    published = statistics.median(p for p, _ in pairs) * 1e3
    planned = statistics.median(q for _, q in pairs) * 1e3
    return f"{published:.1f} / {planned:.1f} ({len(pairs)})"


def layer_time_lines(outcomes: list) -> list[str]:
    """Median ms a layer takes on a micro-batch of 1, published / planned, by tensor degree and by where the
    pipeline runs."""
    cells: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for o in outcomes:
        row = o.row
        tp = degrees(row["sharding"]).tp
        if o.predicted is None or row["micro_batch"] != "1" or tp not in TENSOR_DEGREES or tp > gpus_per_node(row):
            continue
        published, planned = layer_seconds(row, o.published), layer_seconds(row, o.predicted)
        if published is not None:
            cells.setdefault((tp, _placement(row)), []).append((published, planned))
    if not cells:
        return []
    lines = [
        "Milliseconds a layer takes on one micro-batch of 1 sequence, published / planned (runs), median over the "
        "sweep's models and node counts (the step over the layer passes one GPU runs in it, the pipeline's fill "
        "and drain included):",
        "",
        f"| tensor parallel | {' | '.join(PLACEMENTS)} |",
        "|---|" + "---:|" * len(PLACEMENTS),
    ]
    for tp in TENSOR_DEGREES:
        lines.append(f"| tp {tp} | " + " | ".join(_cell(cells.get((tp, p), [])) for p in PLACEMENTS) + " |")
    return lines


def _layout_key(row: dict[str, str]) -> tuple[str, str, str]:
    return row["model"], row["nodes"], row["sharding"]


def _ratios(outcomes: list, rate: Callable) -> dict[int, list[float]]:
    """Per micro-batch size, each layout's time per micro-batch over its time at micro-batch 1."""
    at_one = {_layout_key(o.row): layer_seconds(o.row, rate(o)) for o in outcomes if o.row["micro_batch"] == "1"}
    ratios: dict[int, list[float]] = {}
    for o in outcomes:
        size, base = int(o.row["micro_batch"]), at_one.get(_layout_key(o.row))
        if size in MICRO_BATCHES and base:
            ratios.setdefault(size, []).append(layer_seconds(o.row, rate(o)) / base)
    return ratios


def flat_time_lines(outcomes: list) -> list[str]:
    """For pipelines over 2+ nodes with tensor parallelism inside a node: how a micro-batch's time grows
    with its size, published and planned, against the same layout at micro-batch 1."""
    chosen = [
        o
        for o in outcomes
        if o.predicted is not None
        and int(o.row["nodes"]) > 1
        and degrees(o.row["sharding"]).pp > 1
        and 1 < degrees(o.row["sharding"]).tp <= gpus_per_node(o.row)
    ]
    published, planned = _ratios(chosen, lambda o: o.published), _ratios(chosen, lambda o: o.predicted)
    if not published:
        return []
    lines = [
        "A micro-batch's time at micro-batch m over the same layout's at micro-batch 1 (same model, nodes and "
        "sharding), for pipelines over 2+ nodes with tensor parallelism inside a node; m times the work:",
        "",
        "| micro-batch | layouts | published, median | planned, median |",
        "|---:|---:|---:|---:|",
    ]
    for size in MICRO_BATCHES:
        if size in published:
            lines.append(
                f"| {size} | {len(published[size])} | {statistics.median(published[size]):.2f} | "
                f"{statistics.median(planned[size]):.2f} |"
            )
    return lines
