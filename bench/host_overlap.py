"""vTrain's one-node runs (bench/data/small_model_tp.csv) planned twice: as the plan runs them, the
host issuing ahead while the GPU works (host_issue.py: a micro-step takes the longer of the two, but
for each layer's forward, which waits on its copies: the rows' `layer_syncs`), and
with every launch blocking, as under CUDA_LAUNCH_BLOCKING=1 (the `launch_blocking` token: the host's
issue and the GPU's work one after the other). Which of the two the published times follow says how
much of the host's issue the runs overlapped: the question the small-work regime's miss turns on
(docs/planner.md, "Where each GPU's work is small").

Beside it, each width and TP's published time per layer pass (the iteration over the layer passes one
GPU runs, layers x micro-batches) fitted as a line in the micro-batch, a + m x g: a fixed cost a
layer pass that no work shrinks, and a cost a sequence; with the plan's GPU time and host issue per
layer pass at micro-batch 1 beside them. Only runs without a pipeline enter the fit (a pipeline's
fill and drain add layer passes of their own).

Last, the step split the other way: runs of one model, layout and micro-batch that differ only in
their global batch (their accumulation) fitted as a line in the accumulation, step = c + accumulation
x layers x p, published and planned alike: c the step's own work that no micro-batch repeats (the
optimizer, the gradients' reduction), p a layer pass with its share of the embedding, head and loss.
And the step of the same run on more data-parallel ranks (the same model, TP, micro-batch and
accumulation on 8 GPUs against 2 or 4), which the gradients' all-reduce after the backward lengthens.

And every published run the plan scores (bench/plan_vs_published.py's CSVs), planned both ways too, by
source: whether the runs that are not vTrain's follow the same form.

    python bench/host_overlap.py > bench/results/host_overlap.md
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.layout_kinds import step_seconds  # noqa: E402
from bench.plan_vs_published import DATA, line_fit, plan_rows, question, read_rows, runs_csvs  # noqa: E402
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
    step = step_seconds(row, float(row["published_tok_s_gpu"]))
    passes = int(row["n_layers"]) * int(row["grad_accum"])
    return step / passes * 1e3, plan.time.compute_s / passes * 1e3, plan.time.host.seconds / int(row["n_layers"]) * 1e3


def accumulation_fit(rows: list[dict[str, str]]) -> dict[tuple[int, int, int], list[tuple[float, ...]]]:
    """For each (width, TP, micro-batch), one (published c, planned c, published p, planned p, planned host
    per layer pass) in milliseconds per group of runs without a pipeline that share a model, layout and
    micro-batch and differ in their accumulation (the module's docstring)."""
    groups: dict[tuple, list[tuple[int, float, float, float]]] = defaultdict(list)
    for row in rows:
        tp, pp = map(int, LAYOUT.search(row["sharding"]).groups())
        if pp != 1:
            continue
        plan = _plan(row, blocking=False)
        published = step_seconds(row, float(row["published_tok_s_gpu"])) * 1e3
        host = plan.time.host.seconds / int(row["n_layers"]) * 1e3
        key = (int(row["d_model"]), int(row["n_layers"]), tp, row["gpus"], int(row["micro_batch"]))
        groups[key].append((int(row["grad_accum"]), published, plan.time.step_s * 1e3, host))
    fits: dict[tuple[int, int, int], list[tuple[float, ...]]] = defaultdict(list)
    for (width, layers, tp, _, micro_batch), points in groups.items():
        if len({accumulation for accumulation, *_ in points}) < 2:
            continue
        published_c, published_p, _ = line_fit([(a * layers, t) for a, t, _, _ in points])
        planned_c, planned_p, _ = line_fit([(a * layers, t) for a, _, t, _ in points])
        host = statistics.median(h for *_, h in points)
        fits[(width, tp, micro_batch)].append((published_c, planned_c, published_p, planned_p, host))
    return fits


def data_parallel_growth(rows: list[dict[str, str]]) -> tuple[list[float], list[float]]:
    """Published and planned step of each run without a pipeline on 8 GPUs over the same model, TP,
    micro-batch and accumulation on the fewest GPUs it was run on (2 or 4)."""
    steps: dict[tuple, dict[int, tuple[float, float]]] = defaultdict(dict)
    for row in rows:
        tp, pp = map(int, LAYOUT.search(row["sharding"]).groups())
        if pp != 1:
            continue
        published = step_seconds(row, float(row["published_tok_s_gpu"]))
        key = (row["d_model"], row["n_layers"], tp, row["micro_batch"], row["grad_accum"])
        steps[key][int(row["gpus"])] = (published, _plan(row, blocking=False).time.step_s)
    published_growth, planned_growth = [], []
    for by_gpus in steps.values():
        fewest = min(by_gpus)
        if ONE_NODE in by_gpus and fewest < ONE_NODE:
            published_growth.append(by_gpus[ONE_NODE][0] / by_gpus[fewest][0])
            planned_growth.append(by_gpus[ONE_NODE][1] / by_gpus[fewest][1])
    return published_growth, planned_growth


def every_csv() -> dict[str, tuple[list[float], list[float]]]:
    """For each source (its owner/name or paper), the planned over published tokens/s of every run the plan
    scores, overlapped and with every launch blocking: the second the first's times the ratio of the two plans'
    throughputs, so that each run is held to its published figure as bench/plan_vs_published.py holds it."""
    out: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for path in runs_csvs():
        for o in plan_rows(read_rows(path)):
            if o.error is None or o.plan is None or o.plan.time is None:
                continue
            blocked = _plan(o.row, blocking=True)
            overlapped, blocking = out[o.row["source"].split(":")[0].split("@")[0]]
            overlapped.append(1 + o.error)
            blocking.append((1 + o.error) * blocked.time.tokens_per_s / o.plan.time.tokens_per_s)
    return out


def _within(ratios: list[float]) -> str:
    return f"{sum(abs(r - 1) <= 0.15 for r in ratios) / len(ratios):.0%}"


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
    print("\nMilliseconds of the step split by the accumulation (step = c + accumulation x layers x p over")
    print("runs that differ only in their global batch, no pipeline; medians over the groups of each row):\n")
    print(
        "| width | TP | micro-batch | groups | published c | planned c | published p | planned p "
        "| planned host a pass |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (width, tp, micro_batch), fits in sorted(accumulation_fit(rows).items()):
        medians = [statistics.median(f[i] for f in fits) for i in range(5)]
        print(f"| {width} | {tp} | {micro_batch} | {len(fits)} | " + " | ".join(f"{m:.2f}" for m in medians) + " |")
    published_growth, planned_growth = data_parallel_growth(rows)
    print(
        f"\nThe step on 8 GPUs over the same run on 2 or 4 ({len(published_growth)} pairs, no pipeline): published "
        f"{statistics.median(published_growth):.3f} at the median ({min(published_growth):.3f}-"
        f"{max(published_growth):.3f}), planned {statistics.median(planned_growth):.3f} "
        f"({min(planned_growth):.3f}-{max(planned_growth):.3f})."
    )

    by_source = every_csv()
    print("\nEvery published run the plan scores (bench/plan_vs_published.py's CSVs), planned over published")
    print("tokens/s per GPU overlapped and blocking: the median, the median |error| and the share within 15%.\n")
    print("| runs of | runs | overlapped | median abs error | within 15% | blocking | median abs error | within 15% |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    everything = ([r for o, _ in by_source.values() for r in o], [r for _, b in by_source.values() for r in b])
    others = [(o, b) for source, (o, b) in by_source.items() if source != SOURCE]
    rest = ([r for o, _ in others for r in o], [r for _, b in others for r in b])
    ranked = sorted(by_source.items(), key=lambda item: -len(item[1][0]))
    for name, (overlapped, blocking) in [("every CSV", everything), (f"all but {SOURCE}", rest), *ranked]:
        print(
            f"| {name} | {len(overlapped)} | {statistics.median(overlapped):.2f} | {_error(overlapped)} | "
            f"{_within(overlapped)} | {statistics.median(blocking):.2f} | {_error(blocking)} | {_within(blocking)} |"
        )


if __name__ == "__main__":
    main()
