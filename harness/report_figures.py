"""The report's figures, drawn with matplotlib's Agg backend (no display needed).

Every function takes what was measured and a PNG path, draws one figure, and
returns the path, or None when there is nothing to draw (for example no strategy
finished). A strategy keeps its colour in every figure.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from harness.results import StrategyResult  # noqa: E402

DPI = 110
MEMORY_PARTS = (("params", "mem_params_bytes", "#4C72B0"), ("grads", "mem_grads_bytes", "#DD8452"),
                ("optimizer", "mem_optimizer_bytes", "#55A868"))
REST_COLOUR = "#C8C8C8"
Curves = dict[str, list[dict]]  # strategy -> metrics rows
# Strategies that match the reference draw the same curve: dashes and markers keep each visible.
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "v", "D", "x", "+", "*")
THOUSANDS = FuncFormatter(lambda value, _: f"{value:,.0f}")


def colours(names: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _line_style(index: int) -> dict:
    return {"linestyle": LINE_STYLES[index % len(LINE_STYLES)], "marker": MARKERS[index % len(MARKERS)],
            "markersize": 3.5, "linewidth": 1.4}


def byte_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if largest >= scale:
            return scale, unit
    return 1, "B"


def loss_curves(curves: Curves, colour: dict, loss_floor: float | None, reference: str | None, path: Path) -> Path | None:
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for i, (name, rows) in enumerate(curves.items()):
        style = {"linewidth": 4, "alpha": 0.35} if name == reference else _line_style(i)
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], color=colour[name],
                label=f"{name} (reference)" if name == reference else name, **style)
    if loss_floor is not None:
        ax.axhline(loss_floor, color="black", linestyle="--", linewidth=1, label=f"data loss floor {loss_floor:.3f}")
    ax.set(xlabel="step", ylabel="training loss (mean over the global batch)", title="Loss curves")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2 if len(curves) > 6 else 1)
    return _save(fig, path)


def loss_vs_reference(curves: Curves, colour: dict, reference: str | None, tolerance: float, path: Path) -> Path | None:
    """Left: loss minus the reference's, step by step. Right: its relative size on a log
    scale against the tolerance, where the fp32 differences of 1e-7 remain visible."""
    if reference not in curves or len(curves) < 2:
        return None
    ref = {r["step"]: r["loss"] for r in curves[reference]}
    fig, (signed, relative) = plt.subplots(1, 2, figsize=(11, 4.4))
    floor = tolerance * 1e-6  # where an exact match is drawn on the log scale
    for i, (name, rows) in enumerate(curves.items()):
        if name == reference:
            continue
        common = [r for r in rows if r["step"] in ref]
        steps = [r["step"] for r in common]
        diffs = [r["loss"] - ref[r["step"]] for r in common]
        signed.plot(steps, diffs, color=colour[name], label=name, **_line_style(i))
        rel = [max(abs(d) / max(abs(ref[s]), 1e-12), floor) for d, s in zip(diffs, steps)]
        relative.plot(steps, rel, color=colour[name], label=name, **_line_style(i))
    signed.axhline(0, color="black", linewidth=0.8)
    signed.set(xlabel="step", ylabel=f"loss - loss of {reference}", title=f"Loss minus the reference ({reference})")
    signed.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    relative.axhline(tolerance, color="crimson", linestyle="--", linewidth=1.2, label=f"tolerance {tolerance:.0e}")
    relative.set_yscale("log")
    relative.set(xlabel="step", ylabel="|relative difference|",
                 title=f"Relative difference (exact match drawn at {floor:.0e})")
    for ax in (signed, relative):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    relative.legend(fontsize=8, ncol=2 if len(curves) > 7 else 1)
    return _save(fig, path)


def memory_per_rank(results: list[StrategyResult], device_type: str, path: Path) -> Path | None:
    """Stacked bars: what each rank holds (params, grads, optimizer) and, on GPU, the rest of the peak."""
    ran = [r for r in results if r.ran and r.model_state_bytes is not None]
    if not ran:
        return None
    on_gpu = device_type == "cuda" and any(r.peak_mem_allocated_bytes for r in ran)
    totals = [max(r.peak_mem_allocated_bytes or 0, r.model_state_bytes or 0) if on_gpu else r.model_state_bytes for r in ran]
    scale, unit = byte_unit(max(totals))
    fig, ax = plt.subplots(figsize=(min(13, max(8, 0.5 * len(ran) + 5)), 4.8))
    names = [r.name for r in ran]
    bottom = [0.0] * len(ran)
    for label, key, colour in MEMORY_PARTS:
        values = [(getattr(r, key) or 0) / scale for r in ran]
        ax.bar(names, values, bottom=bottom, color=colour, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    if on_gpu:
        # Peak allocated minus the model states: activations, communication buffers, temporaries.
        rest = [max(0, (r.peak_mem_allocated_bytes or 0) - (r.model_state_bytes or 0)) / scale for r in ran]
        ax.bar(names, rest, bottom=bottom, color=REST_COLOUR, label="the rest of the peak (activations, buffers)")
        title = "Peak memory per rank (maximum over ranks)"
    else:
        title = "Model states per rank on CPU (peak memory is not measured on CPU)"
    for i, total in enumerate(totals):
        ax.text(i, total / scale, f"{total / scale:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set(ylabel=unit, title=title)
    ax.tick_params(axis="x", rotation=30)
    plt.setp(ax.get_xticklabels(), ha="right")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: bars reach the top
    return _save(fig, path)


def throughput(results: list[StrategyResult], colour: dict, path: Path) -> Path | None:
    ran = sorted((r for r in results if r.ran and r.tokens_per_s), key=lambda r: r.tokens_per_s)
    if not ran:
        return None
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.45 * len(ran) + 1.2)))
    values = [r.tokens_per_s for r in ran]
    bars = ax.barh([r.name for r in ran], values, color=[colour[r.name] for r in ran])
    for bar, r in zip(bars, ran):
        if r.matches_reference is False:
            bar.set_hatch("//")
        note = "" if r.matches_reference is not False else "  (loss drifts)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r.tokens_per_s:,.0f}{note}", va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.25)
    ax.xaxis.set_major_formatter(THOUSANDS)
    ax.set(xlabel="tokens/s (after warm-up)", title="Throughput")
    ax.grid(axis="x", alpha=0.3)
    if any(r.matches_reference is False for r in ran):
        ax.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch="//", label="loss drifts from the reference")],
                  fontsize=8, loc="lower right")
    return _save(fig, path)


def memory_vs_throughput(results: list[StrategyResult], colour: dict, device_type: str, path: Path) -> Path | None:
    ran = [r for r in results if r.ran and r.tokens_per_s and _memory_figure(r, device_type)]
    if not ran:
        return None
    memory = [_memory_figure(r, device_type) for r in ran]
    scale, unit = byte_unit(max(memory))
    fig, ax = plt.subplots(figsize=(8, 5))
    points = [(mem / scale, r.tokens_per_s, r) for r, mem in zip(ran, memory)]
    size_pt = (fig.get_figwidth() * 72 * 0.8, fig.get_figheight() * 72 * 0.75)
    offsets = _label_offsets([(x, y) for x, y, _ in points], [r.name for _, _, r in points], size_pt)
    for (x, y, r), dy in zip(points, offsets):
        ax.scatter(x, y, s=60, color=colour[r.name], edgecolor="black", linewidth=0.5, zorder=3)
        ax.annotate(r.name, (x, y), textcoords="offset points", xytext=(6, 4 - dy), fontsize=8)
    what = "peak memory allocated" if device_type == "cuda" else "model states (params + grads + optimizer)"
    ax.set(xlabel=f"{what} per rank ({unit})", ylabel="tokens/s",
           title="Memory against throughput (up and left is better)")
    ax.margins(0.15)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(THOUSANDS)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _label_offsets(points: list[tuple[float, float]], names: list[str], size_pt: tuple[float, float]) -> list[float]:
    """Downward offsets (in points) so that no two labels overlap: labels are placed top to
    bottom, each moved down a line at a time while it would cover one placed before it."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_span, y_span = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    # Approximate positions in points (the axes keep a margin around the data).
    where = [((x - min(xs)) / x_span * size_pt[0] * 0.75, (y - min(ys)) / y_span * size_pt[1] * 0.75) for x, y in points]
    line, char = 11.0, 5.0  # label height and mean character width at fontsize 8
    placed: list[tuple[float, float, float]] = []  # x, y, width of labels already placed
    offsets = [0.0] * len(points)
    for i in sorted(range(len(points)), key=lambda k: -where[k][1]):
        x, y = where[i]
        width = char * len(names[i])
        while any(abs(y - offsets[i] - py) < line and x < px + pw and px < x + width for px, py, pw in placed):
            offsets[i] += line
        placed.append((x, y - offsets[i], width))
    return offsets


def _memory_figure(r: StrategyResult, device_type: str) -> float | None:
    if device_type == "cuda" and r.peak_mem_allocated_bytes:
        return float(r.peak_mem_allocated_bytes)
    return float(r.model_state_bytes) if r.model_state_bytes else None


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
