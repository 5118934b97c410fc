"""vTrain's one-node runs (bench/data/small_model_tp.csv) planned twice: as the plan runs them, the
host issuing ahead while the GPU works (host_issue.py: a micro-step takes the longer of the two), and
with every launch blocking, as under CUDA_LAUNCH_BLOCKING=1 (the `launch_blocking` token: the host's
issue and the GPU's work one after the other). Which of the two the published times follow says how
much of the host's issue the runs overlapped: the question the small-work regime's miss turns on
(docs/planner.md, "Where each GPU's work is small").

Beside it, each width and TP's published time per layer pass (the iteration over the layer passes one
GPU runs, layers x micro-batches) fitted as a line in the micro-batch, a + m x g: a fixed cost a
layer pass that no work shrinks, and a cost a sequence; with the plan's GPU time and host issue per
layer pass at micro-batch 1 beside them. Only runs without a pipeline enter the fit (a pipeline's
fill and drain add layer passes of their own).

    python bench/host_overlap.py > bench/results/host_overlap.md
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plan_vs_published import DATA, line_fit, question, read_rows  # noqa: E402
from harness.plan.predict import StrategyPlan  # noqa: E402
from harness.plan.speed.host_issue import LAUNCH_BLOCKING  # noqa: E402

CSV = DATA / "small_model_tp.csv"
SOURCE = "VIA-Research/vTrain"
ONE_NODE = 8
LAYOUT = re.compile(r"tp=(\d+) pp=(\d+)")


def one_node_rows() -> list[dict[str, str]]:
    return [r for r in read_rows(CSV) if r["source"].startswith(SOURCE) and int(r["gpus"]) <= ONE_NODE]


def _plan(row: dict[str, str], blocking: bool) -> StrategyPlan:
    asked = {**row, "sharding": f"{row['sharding']} {LAUNCH_BLOCKING}"} if blocking else row
    return question(asked)[1]


def planned_over_published(row: dict[str, str], blocking: bool, plan: StrategyPlan | None = None) -> float:
    """Planned over published tokens/s per GPU; `plan`: the row's plan where already made."""
    plan = plan or _plan(row, blocking)
    return plan.time.tokens_per_s / int(row["gpus"]) / float(row["published_tok_s_gpu"])


def layer_pass_ms(row: dict[str, str], plan: StrategyPlan | None = None) -> tuple[float, float, float]:
    """(published, planned GPU, planned host issue) milliseconds a layer pass at the row's micro-batch."""
    plan = plan or _plan(row, blocking=False)
    sequences = int(row["global_batch"]) * int(row["seq_len"])
    step = sequences / (float(row["published_tok_s_gpu"]) * int(row["gpus"]))
    passes = int(row["n_layers"]) * int(row["grad_accum"])
    return step / passes * 1e3, plan.time.compute_s / passes * 1e3, plan.time.host.seconds / int(row["n_layers"]) * 1e3


def _error(ratios: list[float]) -> str:
    return f"{100 * statistics.median(abs(r - 1) for r in ratios):.1f}%"


def main() -> None:
    rows = one_node_rows()
    by_layout: dict[tuple[int, int], dict[bool, list[float]]] = defaultdict(lambda: {False: [], True: []})
    passes: dict[tuple[int, int], list[tuple[int, float, float, float]]] = defaultdict(list)
    for row in rows:
        tp, pp = map(int, LAYOUT.search(row["sharding"]).groups())
        micro_batch = int(row["micro_batch"])
        plan = _plan(row, blocking=False)
        by_layout[(tp, micro_batch)][False].append(planned_over_published(row, False, plan))
        by_layout[(tp, micro_batch)][True].append(planned_over_published(row, True))
        if pp == 1:
            passes[(int(row["d_model"]), tp)].append((micro_batch, *layer_pass_ms(row, plan)))
    overlapped = [r for v in by_layout.values() for r in v[False]]
    blocked = [r for v in by_layout.values() for r in v[True]]
    print("# Host and GPU on vTrain's one-node runs: overlapped or one after the other\n")
    print(f"Written by `python bench/host_overlap.py` (its docstring says what it plans). {len(rows)} runs of")
    print("2-8 A100s in one node (bench/data/small_model_tp.csv). Planned over published tokens/s per GPU, the")
    print("median of each group; overlapped: as the plan runs them; blocking: every launch waiting for its kernel.\n")
    print(
        f"Every run: overlapped {statistics.median(overlapped):.2f} ({_error(overlapped)} median |error|), "
        f"blocking {statistics.median(blocked):.2f} ({_error(blocked)}).\n"
    )
    print("| TP | micro-batch | runs | overlapped | blocking |")
    print("|---:|---:|---:|---:|---:|")
    for (tp, micro_batch), ratios in sorted(by_layout.items()):
        print(
            f"| {tp} | {micro_batch} | {len(ratios[False])} | {statistics.median(ratios[False]):.2f} "
            f"| {statistics.median(ratios[True]):.2f} |"
        )
    print("\nMilliseconds a layer pass (forward, recomputed forward and backward) without a pipeline: the")
    print("published time fitted as a + micro-batch x g over micro-batches 1-8, and the plan's GPU time and")
    print("host issue at micro-batch 1 (medians over the runs):\n")
    print("| width | TP | runs | published a | published g | planned GPU, mb 1 | planned host, mb 1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for (width, tp), points in sorted(passes.items()):
        fixed, per_sequence, _ = line_fit([(m, published) for m, published, _, _ in points])
        first = [p for p in points if p[0] == 1]
        gpu = statistics.median(p[2] for p in first)
        host = statistics.median(p[3] for p in first)
        print(f"| {width} | {tp} | {len(points)} | {fixed:.2f} | {per_sequence:.2f} | {gpu:.2f} | {host:.2f} |")


if __name__ == "__main__":
    main()
