"""The planner's charts: predicted scaling efficiency against GPU count for each strategy on
each interconnect, and predicted peak memory per GPU against model size with the card's
capacity drawn across."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from harness.common.colours import strategy_colours  # noqa: E402
from harness.common.units import GB
from harness.plan.comm import INTERCONNECTS, Topology  # noqa: E402
from harness.plan.model_shape import shape_of_description  # noqa: E402
from harness.plan.predict import USABLE_FRACTION, Question, plan_strategy  # noqa: E402

GPU_COUNTS = [2**i for i in range(11)]  # 1 .. 1024
MODEL_SIZES = [1.25e8, 3.5e8, 1.3e9, 2.7e9, 6.7e9, 13e9, 30e9, 70e9, 175e9]


def _style(name: str) -> dict:
    """The strategy's own colour (as in the compare report); driven through Accelerate, dashed."""
    return {
        "color": strategy_colours([name])[name],
        "linestyle": "--" if name.startswith("accelerate-") else "-",
        "marker": "o",
        "markersize": 3,
    }


def scaling_chart(q: Question, names: list[str], path: Path) -> Path:
    """Efficiency vs GPUs (weak scaling: the per-GPU micro-batch and accumulation stay),
    as many GPUs per node as asked, a point left out where the strategy does not fit."""
    per_node = max(1, q.gpus // q.nodes) if q.gpus > 1 else 8
    fig, axes = plt.subplots(1, len(INTERCONNECTS), figsize=(6 * len(INTERCONNECTS), 5), sharey=True)
    for ax, (link_name, link) in zip(axes, INTERCONNECTS.items(), strict=True):
        for name in (n for n in names if n != "single"):
            xs, ys = [], []
            for gpus in GPU_COUNTS:
                nodes = max(1, -(-gpus // per_node))
                topology = Topology(gpus, nodes, link, q.topology.inter)
                p = plan_strategy(name, replace(q, gpus=gpus, nodes=nodes, topology=topology))
                if p.fits is not False and p.time:
                    xs.append(gpus)
                    ys.append(p.time.efficiency)
            ax.plot(xs, ys, label=name, **_style(name))
        ax.set_xscale("log", base=2)
        ax.set_xticks(GPU_COUNTS, [str(g) for g in GPU_COUNTS])
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{link_name} inside a node, {q.topology.inter.name} between ({per_node} GPUs/node)", fontsize=9)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("predicted scaling efficiency vs 1 GPU")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(
        f"{q.shape.name}: {q.micro_batch} x {q.seq_len} tokens per GPU per micro-step, {q.grad_accum} "
        f"accumulation, {q.precision}, speed {'measured' if q.factors.measured else 'assumed'} "
        "(missing points: does not fit)",
        fontsize=10,
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
    for name in names:
        peaks = [plan_strategy(name, replace(q, shape=s)).peak_bytes for s in shapes]
        ax.plot(MODEL_SIZES, [p / GB for p in peaks], label=name, **_style(name))
    capacity = q.gpu_mem_bytes / GB
    ax.axhline(capacity, color="black", linewidth=1.5, label=f"GPU memory ({capacity:.0f} GB)")
    ax.axhline(USABLE_FRACTION * capacity, color="black", linewidth=0.8, linestyle="--", label="usable (90%)")
    ax.axvline(
        q.shape.params, color="grey", linewidth=0.8, linestyle=":", label=f"this model ({q.shape.params / 1e9:.3g}B)"
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model parameters")
    ax.set_ylabel("predicted peak allocated per GPU (GB)")
    ax.set_title(
        f"{q.gpus} GPUs, {q.micro_batch} x {q.seq_len} tokens per micro-step, {q.precision}, checkpointing "
        f"{'on' if q.checkpointing else 'off'}",
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
