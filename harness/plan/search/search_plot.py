"""The search's chart: predicted tokens/s per GPU against peak memory per GPU for every layout
planned, one colour per strategy, those that do not fit faded beyond the card's line, the
frontier (no layout both faster and leaner) drawn through, the winner marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from harness.common.colours import strategy_colours  # noqa: E402
from harness.common.units import GIB  # noqa: E402
from harness.plan.memory.capacity import ALLOCATOR_ALLOWANCE  # noqa: E402
from harness.plan.search.layout_search import SearchResult  # noqa: E402


def frontier_chart(result: SearchResult, path: Path) -> Path:
    q = result.question
    everything = result.ranked + result.too_large
    names = list(dict.fromkeys(s.strategy for s in everything))
    colours = strategy_colours(names)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name in names:
        fits = [s for s in result.ranked if s.strategy == name]
        over = [s for s in result.too_large if s.strategy == name]
        style = {"color": colours[name], "s": 12}
        ax.scatter([s.peak_bytes / GIB for s in fits], [s.tokens_per_s_per_gpu for s in fits], label=name, **style)
        ax.scatter([s.peak_bytes / GIB for s in over], [s.tokens_per_s_per_gpu for s in over], alpha=0.2, **style)
    frontier = result.frontier()
    if frontier:
        ax.plot(
            [s.peak_bytes / GIB for s in frontier],
            [s.tokens_per_s_per_gpu for s in frontier],
            color="black",
            linewidth=1,
            drawstyle="steps-post",
            label="frontier",
        )
        best = result.ranked[0]
        ax.scatter([best.peak_bytes / GIB], [best.tokens_per_s_per_gpu], marker="*", s=200, color="black", zorder=5)
        ax.annotate(f"  {best.arguments()}", (best.peak_bytes / GIB, best.tokens_per_s_per_gpu), fontsize=7)
    if everything:
        # The winner's headroom: a layout with more NCCL communicators has a little less.
        usable = (result.ranked or everything)[0].plan.headroom.usable / (1 + ALLOCATOR_ALLOWANCE)
        ax.axvline(usable / GIB, color="grey", linestyle="--", linewidth=1, label="largest peak that fits")
        ax.set_xlim(0, 2 * usable / GIB)  # the frontier's side of the card; far larger layouts off the chart
    ax.set_xlabel("predicted peak allocated per GPU (GiB)")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    tokens = result.global_batch * q.seq_len
    ax.set_title(
        f"{q.shape.name} on {q.topology.describe()}, {q.gpu.name if q.gpu else 'unknown card'}: "
        f"{result.planned} layouts, global batch {tokens:,} tokens (faded: does not fit; cut at twice the card)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
