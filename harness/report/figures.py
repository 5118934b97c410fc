"""The report's figures, drawn with matplotlib's Agg backend (no display needed).

Every function takes what was measured and a PNG path, draws one figure, and
returns the path, or None when there is nothing to draw (for example no strategy
finished); its draw_* twin returns the figure itself. A strategy keeps its colour in
every figure. Figures are as wide as the HTML report shows them (document.FIGURE_WIDTH_PX),
and a legend with an entry per strategy sits below the axes, in as many columns as fit:
inside the picture however many strategies there are and however long their names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from harness.common.units import byte_unit  # noqa: E402
from harness.compare import StrategyResult  # noqa: E402
from harness.report.document import FIGURE_WIDTH_PX  # noqa: E402

DPI = 110
WIDTH_IN = FIGURE_WIDTH_PX / DPI
LEGEND_FONT = 8  # points
MEMORY_PARTS = (
    ("params", "mem_params_bytes", "#4C72B0"),
    ("grads", "mem_grads_bytes", "#DD8452"),
    ("optimizer", "mem_optimizer_bytes", "#55A868"),
)
REST_COLOUR = "#C8C8C8"
Curves = dict[str, list[dict]]  # strategy -> metrics rows
# Strategies that match the reference draw the same curve: dashes and markers keep each visible.
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "v", "D", "x", "+", "*")
THOUSANDS = FuncFormatter(lambda value, _: f"{value:,.0f}")


def _line_style(index: int) -> dict:
    return {
        "linestyle": LINE_STYLES[index % len(LINE_STYLES)],
        "marker": MARKERS[index % len(MARKERS)],
        "markersize": 3.5,
        "linewidth": 1.4,
    }


def loss_curves(
    curves: Curves, colour: dict, loss_floor: float | None, reference: str | None, path: Path
) -> Path | None:
    drawn = draw_loss_curves(curves, colour, loss_floor, reference)
    return None if drawn is None else _save(drawn, path)


def draw_loss_curves(
    curves: Curves, colour: dict, loss_floor: float | None, reference: str | None
) -> plt.Figure | None:
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.4), layout="constrained")
    for i, (name, rows) in enumerate(curves.items()):
        style = {"linewidth": 4, "alpha": 0.35} if name == reference else _line_style(i)
        ax.plot(
            [r["step"] for r in rows],
            [r["loss"] for r in rows],
            color=colour[name],
            label=f"{name} (reference)" if name == reference else name,
            **style,
        )
    if loss_floor is not None:
        ax.axhline(loss_floor, color="black", linestyle="--", linewidth=1, label=f"data loss floor {loss_floor:.3f}")
    ax.set(xlabel="step", ylabel="training loss (mean over the global batch)", title="Loss curves")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    legend_below(fig, *ax.get_legend_handles_labels())
    return fig


@dataclass(frozen=True)
class LossBound:
    """What a strategy's loss may differ from the reference's by, step by step (harness/compare/verdict.py)."""

    steps: list[int]
    allowed: list[float]  # relative
    label: str
    spread: list[float] | None = None  # the noise runs' own relative distance from the reference
    noise_curves: list[list[dict]] = field(default_factory=list)  # the noise runs' metrics rows


def loss_vs_reference(curves: Curves, colour: dict, reference: str | None, bound: LossBound, path: Path) -> Path | None:
    drawn = draw_loss_vs_reference(curves, colour, reference, bound)
    return None if drawn is None else _save(drawn, path)


def draw_loss_vs_reference(curves: Curves, colour: dict, reference: str | None, bound: LossBound) -> plt.Figure | None:
    """Left: loss minus the reference's, step by step, with the noise runs in grey. Right: its
    relative size on a log scale against the bound (shaded), where fp32's 1e-7 stays visible.
    One legend below both."""
    if reference not in curves or len(curves) < 2:
        return None
    ref = {r["step"]: r["loss"] for r in curves[reference]}
    fig, (signed, relative) = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.4), layout="constrained")
    floor = min(bound.allowed) * 1e-4  # where an exact match is drawn on the log scale
    for i, rows in enumerate(bound.noise_curves):
        common = [r for r in rows if r["step"] in ref]
        signed.plot(
            [r["step"] for r in common],
            [r["loss"] - ref[r["step"]] for r in common],
            color="grey",
            linewidth=0.9,
            alpha=0.8,
            label="noise runs of the reference" if i == 0 else None,
        )
    for i, (name, rows) in enumerate(curves.items()):
        if name == reference:
            continue
        common = [r for r in rows if r["step"] in ref]
        steps = [r["step"] for r in common]
        diffs = [r["loss"] - ref[r["step"]] for r in common]
        signed.plot(steps, diffs, color=colour[name], label=name, **_line_style(i))
        rel = [max(abs(d) / max(abs(ref[s]), 1e-12), floor) for d, s in zip(diffs, steps, strict=True)]
        relative.plot(steps, rel, color=colour[name], label=name, **_line_style(i))
    relative.fill_between(bound.steps, floor, bound.allowed, color="#9ecae1", alpha=0.35, step="mid", label=bound.label)
    if bound.spread is not None:
        relative.plot(
            bound.steps,
            [max(v, floor) for v in bound.spread],
            color="black",
            linewidth=1.0,
            linestyle=":",
            label="noise runs' spread",
        )
    signed.axhline(0, color="black", linewidth=0.8)
    signed.set(xlabel="step", ylabel=f"loss - loss of {reference}", title=f"Loss minus the reference ({reference})")
    signed.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    relative.set_yscale("log")
    relative.set(
        xlabel="step", ylabel="|relative difference|", title=f"Relative difference (exact match at {floor:.0e})"
    )
    for ax in (signed, relative):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # The strategies' lines and the bound from the right, the noise runs' grey from the left.
    handles, labels = relative.get_legend_handles_labels()
    noise_handles, noise_labels = signed.get_legend_handles_labels()
    if bound.noise_curves:
        handles, labels = handles + noise_handles[:1], labels + noise_labels[:1]
    legend_below(fig, handles, labels)
    return fig


def memory_per_rank(results: list[StrategyResult], device_type: str, path: Path) -> Path | None:
    """Stacked bars: what each rank holds (params, grads, optimizer) and, on GPU, the rest of the peak."""
    drawn = draw_memory_per_rank(results, device_type)
    return None if drawn is None else _save(drawn, path)


def draw_memory_per_rank(results: list[StrategyResult], device_type: str) -> plt.Figure | None:
    ran = [r for r in results if r.ran and r.model_state_bytes is not None]
    if not ran:
        return None
    on_gpu = device_type == "cuda" and any(r.peak_mem_allocated_bytes for r in ran)
    totals = [
        max(r.peak_mem_allocated_bytes or 0, r.model_state_bytes or 0) if on_gpu else r.model_state_bytes for r in ran
    ]
    scale, unit = byte_unit(max(totals))
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.8), layout="constrained")
    names = [r.name for r in ran]
    bottom = [0.0] * len(ran)
    for label, key, colour in MEMORY_PARTS:
        values = [(getattr(r, key) or 0) / scale for r in ran]
        ax.bar(names, values, bottom=bottom, color=colour, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if on_gpu:
        # Peak allocated minus the model states: activations, communication buffers, temporaries.
        rest = [max(0, (r.peak_mem_allocated_bytes or 0) - (r.model_state_bytes or 0)) / scale for r in ran]
        ax.bar(names, rest, bottom=bottom, color=REST_COLOUR, label="the rest of the peak (activations, buffers)")
        title = "Peak memory per rank (maximum over ranks)"
    else:
        title = "Model states per rank on CPU (peak memory is not measured on CPU)"
    for i, total in enumerate(totals):
        ax.text(i, total / scale, f"{total / scale:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(top=max(totals) / scale * 1.08)  # room for the tallest bar's figure
    ax.set(ylabel=unit, title=title)
    ax.tick_params(axis="x", rotation=30)
    plt.setp(ax.get_xticklabels(), ha="right")
    ax.grid(axis="y", alpha=0.3)
    legend_below(fig, *ax.get_legend_handles_labels())  # not over the bars, which reach the top
    return fig


def throughput(results: list[StrategyResult], colour: dict, path: Path) -> Path | None:
    drawn = draw_throughput(results, colour)
    return None if drawn is None else _save(drawn, path)


def draw_throughput(results: list[StrategyResult], colour: dict) -> plt.Figure | None:
    ran = sorted((r for r in results if r.ran and r.tokens_per_s), key=lambda r: r.tokens_per_s)
    if not ran:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH_IN, max(2.5, 0.45 * len(ran) + 1.2)), layout="constrained")
    values = [r.tokens_per_s for r in ran]
    bars = ax.barh([r.name for r in ran], values, color=[colour[r.name] for r in ran])
    for bar, r in zip(bars, ran, strict=True):
        if r.matches_reference is False:
            bar.set_hatch("//")
        note = "" if r.matches_reference is not False else "  (loss differs)"
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {r.tokens_per_s:,.0f}{note}",
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, max(values) * 1.25)
    ax.xaxis.set_major_formatter(THOUSANDS)
    ax.set(xlabel="tokens/s (after warm-up)", title="Throughput")
    ax.grid(axis="x", alpha=0.3)
    if any(r.matches_reference is False for r in ran):
        ax.legend(
            handles=[Patch(facecolor="white", edgecolor="black", hatch="//", label="loss differs from the reference")],
            fontsize=LEGEND_FONT,
            loc="lower right",
        )
    return fig


def memory_vs_throughput(results: list[StrategyResult], colour: dict, device_type: str, path: Path) -> Path | None:
    drawn = draw_memory_vs_throughput(results, colour, device_type)
    return None if drawn is None else _save(drawn[0], path)


def draw_memory_vs_throughput(
    results: list[StrategyResult], colour: dict, device_type: str
) -> tuple[plt.Figure, list] | None:
    """The scatter with one label per point, none over another label or another point."""
    ran = [r for r in results if r.ran and r.tokens_per_s and _memory_figure(r, device_type)]
    if not ran:
        return None
    memory = [_memory_figure(r, device_type) for r in ran]
    scale, unit = byte_unit(max(memory))
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 5.5))
    points = [(mem / scale, r.tokens_per_s) for r, mem in zip(ran, memory, strict=True)]
    for (x, y), r in zip(points, ran, strict=True):
        ax.scatter(x, y, s=60, color=colour[r.name], edgecolor="black", linewidth=0.5, zorder=3)
    what = "peak memory allocated" if device_type == "cuda" else "model states (params + grads + optimizer)"
    ax.set(
        xlabel=f"{what} per rank ({unit})", ylabel="tokens/s", title="Memory against throughput (up and left is better)"
    )
    ax.margins(0.15)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(THOUSANDS)
    ax.grid(alpha=0.3)
    fig.tight_layout()  # fixed before the labels are placed: they are placed in display space
    return fig, place_labels(fig, ax, points, [r.name for r in ran])


def label_box(label, renderer) -> Bbox:
    """Where an annotation's text is drawn (without its leader line, which Annotation's own extent includes)."""
    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)


# Where a label may go, in points from its point: close first, then further out with a leader line.
LABEL_ANGLES = (0, 35, -35, 180, 145, -145, 90, -90, 60, -60, 120, -120)
LABEL_RADII = (7, 16, 26, 38, 52, 68, 86, 108, 134, 164)
MARKER_HALF_WIDTH_PT = 5.0


def place_labels(fig: plt.Figure, ax: plt.Axes, points: list[tuple[float, float]], names: list[str]) -> list:
    """Annotate each point with its name at the first candidate spot, measured in display space,
    that covers no label already placed, no point and nothing outside the axes; the top points
    are labelled first. A label away from its point gets a thin leader line."""
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    px_per_pt = fig.dpi / 72
    marker = MARKER_HALF_WIDTH_PT * px_per_pt
    occupied = []
    for x, y in points:
        cx, cy = ax.transData.transform((x, y))
        occupied.append(Bbox.from_extents(cx - marker, cy - marker, cx + marker, cy + marker))
    labels = []
    for i in sorted(range(len(points)), key=lambda k: -points[k][1]):
        label = None
        for radius in LABEL_RADII:
            for angle in LABEL_ANGLES:
                dx, dy = radius * math.cos(math.radians(angle)), radius * math.sin(math.radians(angle))
                candidate = ax.annotate(
                    names[i],
                    points[i],
                    xytext=(dx, dy),
                    textcoords="offset points",
                    fontsize=8,
                    ha="left" if dx > 1e-9 else "right" if dx < -1e-9 else "center",
                    va="bottom" if dy > 1e-9 else "top" if dy < -1e-9 else "center",
                    arrowprops=dict(arrowstyle="-", color="grey", linewidth=0.6) if radius > LABEL_RADII[0] else None,
                )
                box = label_box(candidate, renderer).padded(1.5)
                if (
                    inside.contains(box.x0, box.y0)
                    and inside.contains(box.x1, box.y1)
                    and not any(box.overlaps(other) for other in occupied)
                ):
                    label = candidate
                    occupied.append(box)
                    break
                candidate.remove()
            if label is not None:
                break
        if label is None:  # nowhere free: the last resort is beside the point, said in the test
            label = ax.annotate(names[i], points[i], xytext=(6, 4), textcoords="offset points", fontsize=8)
        labels.append(label)
    return labels


def _memory_figure(r: StrategyResult, device_type: str) -> float | None:
    if device_type == "cuda" and r.peak_mem_allocated_bytes:
        return float(r.peak_mem_allocated_bytes)
    return float(r.model_state_bytes) if r.model_state_bytes else None


def legend_below(fig: plt.Figure, handles: list, labels: list[str]) -> None:
    """One legend under the axes (the figure's constrained layout makes room), in as many columns
    as fit its width; the figure grows by the legend's height, so the axes keep theirs."""
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    for ncol in range(len(handles), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=LEGEND_FONT)
        box = legend.get_window_extent(renderer)
        if box.width <= fig.bbox.width * 0.98 or ncol == 1:
            break
        legend.remove()
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + box.height / fig.dpi)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
