"""Megatron-LM's GPT functional tests (bench/data/ci_baselines/) split into time per layer and
micro-batch, beside what the plan puts there: its GPU compute and its host issue.

Each width-512 run's iteration time is divided by the layer slots one GPU runs in a step: the
layers of its pipeline stage times (micro-batches + stages - 1), the fill and drain included. Runs
with an interleaved schedule, context parallelism or one GB200 tray (whose files differ from the
two-tray runs of the same tests by up to 10x, bench/data/README.md) are left out. Grouped by card,
the layers' implementation (TransformerEngine, Megatron-core's local layers with TransformerEngine
installed, or the `uninstall_te` tests without it), tensor parallel size and precision, so that what
the time follows (the card's host CPU, its GPU, the work per GPU, TransformerEngine) can be read off.

    python bench/ci_layer_time.py > bench/results/ci_layer_time.md
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.layout_kinds import layer_slots as stage_layer_slots  # noqa: E402
from bench.plan_vs_published import DATA, question, read_rows  # noqa: E402

CI_CSV = DATA / "ci_baselines" / "megatron_functional_tests.csv"
ITERATION = re.compile(r"median iteration-time ([\d.]+) s")


def _size(sharding: str, name: str) -> int:
    found = re.search(rf"\b{name}=(\d+)", sharding)
    return int(found.group(1)) if found else 1


def layer_slots(row: dict[str, str]) -> int | None:
    """Layer forward-and-backward passes one GPU's step takes the time of; None where the schedule
    is not a plain one (interleaved, context parallel) or the run is a one-tray GB200 one."""
    sharding = row["sharding"]
    if "vp=" in sharding or _size(sharding, "cp") > 1 or "_1node" in row["table"]:
        return None
    return stage_layer_slots(int(row["n_layers"]), _size(sharding, "pp"), int(row["grad_accum"] or 1))


def implementation(row: dict[str, str]) -> str:
    if "transformer_engine" in row["sharding"]:
        return "TransformerEngine"
    return "local, no TE installed" if "uninstall_te" in row["table"] else "local"


def main() -> None:
    groups: dict[tuple, list[tuple[float, float, float]]] = defaultdict(list)
    for row in read_rows(CI_CSV):
        slots = layer_slots(row) if row["d_model"] == "512" else None
        found = ITERATION.search(row["notes"])
        if slots is None or found is None:
            continue
        _, plan, _ = question(row)
        if plan is None or plan.time is None or plan.time.host is None:
            continue
        mb = int(row["grad_accum"] or 1)
        stage_layers = int(row["n_layers"]) // _size(row["sharding"], "pp")
        per_layer = stage_layers * mb
        key = (row["gpu"], implementation(row), _size(row["sharding"], "tp"), row["precision"])
        groups[key].append(
            (
                float(found.group(1)) / slots,
                plan.time.compute_s / per_layer,
                plan.time.host.seconds * mb / per_layer,
            )
        )
    print("# Megatron-LM's functional tests: time per layer and micro-batch\n")
    print("Written by `python bench/ci_layer_time.py` (its docstring says how the time is split). Planned GPU:")
    print("the plan's compute per layer and micro-batch (the head and loss spread over the layers); planned host:")
    print("its host issue likewise (harness/plan/speed/host_issue.py). Milliseconds per layer")
    print("and micro-batch, medians over the runs of each group.\n")
    columns = ("GPU", "layers", "TP", "precision", "runs", "published ms", "planned GPU ms", "planned host ms")
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for key in sorted(groups):
        values = groups[key]
        published, gpu, host = (statistics.median(v[i] for v in values) * 1e3 for i in range(3))
        cells = (*map(str, key), str(len(values)), f"{published:.2f}", f"{gpu:.2f}", f"{host:.2f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
