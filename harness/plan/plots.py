"""The planner's charts: predicted tokens/s per GPU against GPU count for each strategy (a sweep
over models and GPU counts, or the question's own GPUs per node and network), and predicted peak
memory per GPU against model size with the card's usable memory drawn across."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from harness.common.colours import strategy_colours  # noqa: E402
from harness.common.units import GIB  # noqa: E402
from harness.plan.model.model_shape import shape_of_description  # noqa: E402
from harness.plan.model.moe_shape import total_params
from harness.plan.parallel.backends import planner_models  # noqa: E402
from harness.plan.predict import Question, StrategyPlan, plan_strategy  # noqa: E402

if TYPE_CHECKING:
    from harness.plan.recommendation import Recommendation

GPU_COUNTS = [2**i for i in range(11)]  # 1 .. 1024
MODEL_SIZES = [1.25e8, 3.5e8, 1.3e9, 2.7e9, 6.7e9, 13e9, 30e9, 70e9, 175e9]


def _style(name: str) -> dict:
    """The strategy's own colour (as in the compare report); driven through Accelerate, dashed."""
    model = planner_models().get(name)
    return {
        "color": strategy_colours([name])[name],
        "linestyle": "--" if model is not None and model.via_accelerate else "-",
        "marker": "o",
        "markersize": 3,
    }


def _per_gpu(p: StrategyPlan, q: Question) -> float | None:
    return p.time.tokens_per_s / q.gpus if p.time and p.fits is not False else None


def sweep_chart(points: list[tuple[Question, list[StrategyPlan], "Recommendation"]], path: Path) -> Path:
    """Tokens/s per GPU against GPUs, one panel per model, a point left out where it does not fit."""
    models = list(dict.fromkeys(q.shape.name for q, _, _ in points))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [(q, plans) for q, plans, _ in points if q.shape.name == model]
        names = list(dict.fromkeys(p.name for _, plans in mine for p in plans))
        for name in names:
            xs, ys = [], []
            for q, plans in mine:
                p = next((p for p in plans if p.name == name), None)
                value = _per_gpu(p, q) if p else None
                if value is not None:
                    xs.append(q.gpus)
                    ys.append(value)
            ax.plot(xs, ys, label=name, **_style(name))
        counts = sorted({q.gpus for q, _ in mine})
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(g) for g in counts])
        ax.set_title(model, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("predicted tokens/s per GPU (missing: does not fit)")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    q = points[0][0]
    fig.suptitle(
        f"{q.micro_batch} x {q.seq_len} tokens per rank per micro-step, {q.precision}, checkpointing "
        f"{q.checkpointing}, {q.gpu.name if q.gpu else 'unknown card'}, {q.topology.per_node} GPUs per node, "
        f"{q.topology.fabric.describe()} between nodes",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def scaling_chart(q: Question, names: list[str], path: Path) -> Path:
    """Tokens/s per GPU vs GPUs (weak scaling: the per-GPU micro-batch and accumulation stay), as
    many GPUs per node as asked, on the question's network."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        xs, ys = [], []
        for gpus in GPU_COUNTS:
            bigger = q.with_gpus(gpus)
            try:
                p = plan_strategy(name, bigger)
            except ValueError:  # a layout that does not divide this GPU count
                continue
            if gpus > 1 and p.backend.one_process:
                continue
            value = _per_gpu(p, bigger)
            if value is not None:
                xs.append(gpus)
                ys.append(value)
        ax.plot(xs, ys, label=name, **_style(name))
    ax.set_xscale("log", base=2)
    ax.set_xticks(GPU_COUNTS, [str(g) for g in GPU_COUNTS])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(
        f"{q.shape.name}: {q.micro_batch} x {q.seq_len} tokens per rank per micro-step, {q.precision}, "
        f"{q.topology.per_node} GPUs per node, {q.topology.fabric.describe()} (missing points: does not fit)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def memory_chart(q: Question, names: list[str], path: Path) -> Path:
    """Peak memory per GPU vs model size (GPT-3-proportioned shapes) at the question's GPU count."""
    fig, ax = plt.subplots(figsize=(9, 6))
    shapes = [
        shape_of_description(params=n, layers=None, width=None, heads=None, vocab=None, seq_len=q.seq_len)
        for n in MODEL_SIZES
    ]
    usable = None
    for name in names:
        xs, ys = [], []
        for size, shape in zip(MODEL_SIZES, shapes, strict=True):
            try:
                p = plan_strategy(name, replace(q, shape=shape))
            except ValueError:  # a layout that does not divide this size (a pipeline's stages, its micro-batches)
                continue
            usable = p.headroom.usable if usable is None else usable
            xs.append(size)
            ys.append(p.peak_bytes / GIB)
        if xs:
            ax.plot(xs, ys, label=name, **_style(name))
    ax.axhline(q.capacity_bytes / GIB, color="black", linewidth=1.5, label=f"card ({q.capacity_bytes / GIB:.1f} GiB)")
    if usable is not None:
        ax.axhline(usable / GIB, color="black", linewidth=0.8, linestyle="--", label="usable by the allocator")
    params = total_params(q.shape)
    ax.axvline(params, color="grey", linewidth=0.8, linestyle=":", label=f"this model ({params / 1e9:.3g}B)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model parameters")
    ax.set_ylabel("predicted peak allocated per GPU (GiB)")
    ax.set_title(
        f"{q.gpus} GPUs, {q.micro_batch} x {q.seq_len} tokens per micro-step, {q.precision}, "
        f"checkpointing {q.checkpointing}",
        fontsize=10,
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_plots(q: Question, names: list[str], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [scaling_chart(q, names, out_dir / "plan_scaling.png"), memory_chart(q, names, out_dir / "plan_memory.png")]
