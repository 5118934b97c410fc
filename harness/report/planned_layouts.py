"""The report's section for `compare plan=`: each layout the search planned beside what it
measured here. The plan's figures are for the cluster it was asked about and the measured ones
for this machine, so the two orders are what carry over; on a CPU, where nothing measures a peak,
the measured memory is the model states a rank holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from configs.schema import checkpointing_mode
from harness.common.units import human_bytes
from harness.compare import StrategyResult, run_summary
from harness.report.document import Element, Heading, Paragraph, Table

HEADERS = [
    "layout",
    "planned #",
    "measured #",
    "runs here as",
    "planned tok/s per GPU",
    "measured tok/s per process",
    "planned peak per GPU",
    "measured per rank",
    "vs reference",
]


# The mesh dimensions a run records (strategies/parallel_dims.py, its summary's mesh) that a plan's layout fixes.
SPLIT_DIMS = ("tp", "pp", "cp", "ep")
# Group sizes a layout gives as strategy options, by the mesh dimension a run records them as.
GROUP_OPTIONS = {"shard": "shard_size", "hpz": "zero_hpz_partition_size"}


def planned_layouts(
    sweep: dict[str, Any], results: list[StrategyResult], compare_dir: Path | None = None
) -> list[Element]:
    """The section, or nothing for a compare not made from a plan. With `compare_dir`, each run's recorded
    layout (its summary.json) is held to the one it was sent to run: a difference is said in its row."""
    plan = sweep.get("from_plan")
    if not plan:
        return []
    by_label = {r.name: r for r in results}
    layouts = plan["layouts"]
    speeds = {
        layout["label"]: _per_process(by_label.get(layout["label"]))
        for layout in layouts
        if _per_process(by_label.get(layout["label"])) is not None
    }
    measured_order = {label: place for place, label in enumerate(sorted(speeds, key=lambda k: -speeds[k]), start=1)}
    on_cpu = sweep.get("device_type") != "cuda"
    rows = [
        _row(layout, by_label.get(layout["label"]), measured_order, on_cpu, _recorded(compare_dir, by_label, layout))
        for layout in layouts
    ]
    scaled = [f"`{layout['label']}` {layout['scaled']}." for layout in layouts if layout.get("scaled")]
    if plan.get("reference_fitted"):
        scaled.append(f"{plan['reference_fitted']}.")
    return [
        Heading("The plan's layouts, planned against measured"),
        Paragraph(
            f"The {len(layouts)} best layouts of `{plan['file']}`: {plan['model']} on {plan['gpus']} x "
            f"{plan.get('gpu') or 'GPU'} ({plan.get('topology') or 'its cluster'}), global batch "
            f"{plan['global_batch']} x {plan['seq_len']}, measured here beside `single`. Planned figures are for "
            "that cluster, measured ones for this machine: the order (planned # against measured #) is what "
            "carries over. "
            + (
                "On a CPU no peak is measured: the measured memory is the weights, gradients and optimizer state "
                "a rank holds."
                if on_cpu
                else "Measured memory is the peak allocated per rank."
            )
            + (" " + " ".join(scaled) if scaled else "")
        ),
        Table(HEADERS, rows, right_aligned={1, 2, 4, 5, 6, 7}),
    ]


def _recorded(
    compare_dir: Path | None, by_label: dict[str, StrategyResult], layout: dict[str, Any]
) -> dict[str, Any] | None:
    """The summary.json of the layout's finished run; None where there is none."""
    result = by_label.get(layout["label"])
    if compare_dir is None or result is None or not result.ran or not result.run_dir:
        return None
    try:
        return run_summary(compare_dir, result) or None
    except (OSError, ValueError):
        return None


def _sizes(layout: dict[str, Any]) -> dict[str, int]:
    """The layout's tp, pp, cp and ep as planned (a compare of before they were recorded: as its
    strategy options pin them)."""
    planned, options = layout["planned"], layout.get("strategy_options") or {}
    return {dim: planned[dim] if dim in planned else options.get(f"{dim}_size") or 1 for dim in SPLIT_DIMS}


def layout_words(layout: dict[str, Any]) -> str:
    """How a layout is sent to run: its processes, mesh sizes (a pipeline's with its schedule), micro-batch
    x accumulation and checkpointing."""
    options = layout.get("strategy_options") or {}
    parts = [f"{dim} {size}" for dim, size in _sizes(layout).items() if size > 1 or dim == "tp"]
    parts = [part + _schedule(options) if part.startswith("pp ") else part for part in parts]
    parts += [f"{dim} {options[key]}" for dim, key in GROUP_OPTIONS.items() if options.get(key)]
    return (
        f"{layout['nproc']} proc, {' x '.join(parts)}, {layout['micro_batch']} x {layout['grad_accum']}, "
        f"ckpt {layout['checkpointing']}"
    )


def _schedule(options: dict[str, Any]) -> str:
    count = options.get("microbatches")
    return f" ({options.get('schedule') or '1f1b'}" + (f", {count} micro-batches)" if count else ")")


def ran_otherwise(layout: dict[str, Any], summary: dict[str, Any]) -> str | None:
    """How the run recorded in `summary` differs from the layout it was sent to run, in words; None: it
    ran as sent (its tp, pp, cp, ep, shard and hpZ groups, data-parallel ranks, micro-batch, accumulation,
    checkpointing)."""
    mesh, config = summary.get("mesh") or {}, summary.get("config") or {}
    checkpointing = checkpointing_mode(config.get("activation_checkpointing"), config.get("selective_checkpointing"))
    dims = dict(zip(mesh.get("dims", []), mesh.get("shape", []), strict=False))
    options = layout.get("strategy_options") or {}
    groups = {dim: options[key] for dim, key in GROUP_OPTIONS.items() if options.get(key)}
    sizes = _sizes(layout)
    sharing = sizes["tp"] * sizes["pp"] * sizes["cp"]  # the ranks of one micro-batch (ep borrows data-parallel ones)
    sent = {
        **sizes,
        **groups,
        "data-parallel ranks": layout["nproc"] // sharing,
        "micro-batch": layout["micro_batch"],
        "accumulation": layout["grad_accum"],
        "checkpointing": layout["checkpointing"],
    }
    ran = {dim: dims.get(dim, 1) for dim in (*sizes, *groups)} | {
        "data-parallel ranks": summary.get("data_parallel_size", summary.get("world_size")),
        "micro-batch": summary.get("micro_batch"),
        "accumulation": summary.get("grad_accum"),
        "checkpointing": checkpointing,
    }
    differs = [f"{key} {ran[key]} (sent {sent[key]})" for key in sent if ran[key] != sent[key]]
    return "ran with " + ", ".join(differs) if differs else None


def _per_process(result: StrategyResult | None) -> float | None:
    if result is None or not result.ran or not result.tokens_per_s or not result.nproc:
        return None
    return result.tokens_per_s / result.nproc


def _row(
    layout: dict[str, Any],
    result: StrategyResult | None,
    measured_order: dict[str, int],
    on_cpu: bool,
    summary: dict[str, Any] | None = None,
) -> list[str]:
    label, planned = layout["label"], layout["planned"]
    speed = _per_process(result)
    memory = None if result is None else (result.model_state_bytes if on_cpu else result.peak_mem_allocated_bytes)
    if result is None or not result.ran:
        verdict = f"{result.status if result else 'not run'}: {result.error if result else ''}".rstrip(": ")
    else:
        verdict = result.verdict
    return [
        f"`{label}`",
        str(planned["rank"]),
        str(measured_order.get(label, "-")),
        layout_words(layout) + (f"; {otherwise}" if summary and (otherwise := ran_otherwise(layout, summary)) else ""),
        f"{planned['tokens_per_s_per_gpu']:,.0f}",
        "n/a" if speed is None else f"{speed:,.0f}",
        human_bytes(planned["peak_allocated_bytes"]),
        "n/a" if memory is None else human_bytes(memory) + (" states" if on_cpu else ""),
        verdict,
    ]
