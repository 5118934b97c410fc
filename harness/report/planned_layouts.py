"""The report's section for `compare plan=`: each layout the search planned beside what it
measured here. The plan's figures are for the cluster it was asked about and the measured ones
for this machine, so the two orders are what carry over; on a CPU, where nothing measures a peak,
the measured memory is the model states a rank holds."""

from __future__ import annotations

from typing import Any

from harness.common.units import human_bytes
from harness.compare import StrategyResult
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


def planned_layouts(sweep: dict[str, Any], results: list[StrategyResult]) -> list[Element]:
    """The section, or nothing for a compare not made from a plan."""
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
    rows = [_row(layout, by_label.get(layout["label"]), measured_order, on_cpu) for layout in layouts]
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


def _per_process(result: StrategyResult | None) -> float | None:
    if result is None or not result.ran or not result.tokens_per_s or not result.nproc:
        return None
    return result.tokens_per_s / result.nproc


def _row(
    layout: dict[str, Any], result: StrategyResult | None, measured_order: dict[str, int], on_cpu: bool
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
        f"{layout['nproc']} proc, tp {planned['tp']}, {layout['micro_batch']} x {layout['grad_accum']}, "
        f"ckpt {layout['checkpointing']}",
        f"{planned['tokens_per_s_per_gpu']:,.0f}",
        "n/a" if speed is None else f"{speed:,.0f}",
        human_bytes(planned["peak_allocated_bytes"]),
        "n/a" if memory is None else human_bytes(memory) + (" states" if on_cpu else ""),
        verdict,
    ]
