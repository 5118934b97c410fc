"""How close the plan has come to published training runs like the layout it recommends.

`bench/plan_vs_published.py` plans every published run of bench/data as a new user would ask for
it and writes, beside its report (bench/results/plan_vs_published.md, "Accuracy at a glance"),
the median error of tokens/s per GPU in each layout kind, in each kind at each scale and in each
card family to published_accuracy.json. A recommendation quotes the buckets its layout falls in, so a plan of a
kind the plan has priced far from published runs (tensor parallelism across nodes) says so beside
its figures, and one of a kind it prices well says that too. The Ultra-Scale Playbook's sweep (one
team's 1,738 runs on one EFA cluster, which the report holds apart) is quoted beside them by kind:
its pipelines and tensor parallelism across nodes ran 2-4x slower than planned.

The kinds overlap, as the report's do: Megatron-LM's `tp=4 pp=4 cp=2` counts under tensor
parallelism inside a node, under pipelines and under context parallelism. A node is the NVLink
domain where the card's spans several hosts (a GB200 NVL72 rack of 4-GPU trays).

Beside the kind, the plan's work per GPU per layer op (w = micro-batch x sequence x width / tp, the
elements one GPU's layer op moves) is quoted: what a fixed cost per kernel or collective is measured
against, so a small model or a narrow shard (small w, where the host's issue and the collectives'
latency bind) is planned worse than a large one of the same kind, and says so.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from harness.common.hardware import GPUS, GPUSpec

if TYPE_CHECKING:
    from harness.plan.model.model_shape import TransformerDims
    from harness.plan.network.fabric import Topology
    from harness.plan.parallel.layout import Layout

DATA_PARALLEL = "data parallel only"
TP_INSIDE = "TP x DP inside a node"
TP_ACROSS = "TP across nodes"
PIPELINE = "PP"
CONTEXT = "CP"
KINDS = (DATA_PARALLEL, TP_INSIDE, TP_ACROSS, PIPELINE, CONTEXT)
SCALES = ("one node", "2-8 nodes", "9-64 nodes", "more than 64 nodes")
# Work per GPU per layer op: (low, high) powers of two and the bucket's name, as the report names them.
WORK_BUCKETS = ((0, 20, "w < 2^20"), (20, 22, "2^20 <= w < 2^22"), (22, 24, "2^22 <= w < 2^24"), (24, 99, "w >= 2^24"))
ACCURACY_FILE = Path(__file__).with_name("published_accuracy.json")
FEW_RUNS = 20  # a bucket of fewer published runs is named as few: its median moves with one run


def layout_kinds(tp: int, pp: int, cp: int, tp_domain: int) -> tuple[str, ...]:
    """The kinds of a layout whose tensor-parallel groups may span `tp_domain` GPUs on NVLink, in KINDS'
    order."""
    kinds = []
    if tp > 1:
        kinds.append(TP_INSIDE if tp <= tp_domain else TP_ACROSS)
    if pp > 1:
        kinds.append(PIPELINE)
    if cp > 1:
        kinds.append(CONTEXT)
    return tuple(kinds) or (DATA_PARALLEL,)


def leading_kind(kinds: tuple[str, ...]) -> str:
    """The one kind a layout is filed under where each run counts once (the sweep's table): its
    pipeline, else its tensor parallelism across nodes, else inside one, else its first."""
    return next((kind for kind in (PIPELINE, TP_ACROSS, TP_INSIDE) if kind in kinds), kinds[0])


def work_bucket_of(work: float) -> str:
    """The WORK_BUCKETS name of `work` elements a GPU per layer op."""
    return next(name for _, high, name in WORK_BUCKETS if work < 2**high)


def work_per_op(micro_batch: int, seq_len: int, width: int, tp: int) -> float:
    """Elements one GPU's layer op moves: micro-batch x sequence x width / tp."""
    return micro_batch * seq_len * width / tp


def plan_work(micro_batch: int, seq_len: int, dims: TransformerDims | None, tp: int) -> float | None:
    """A plan's work per GPU per layer op; None for a model without transformer sizes."""
    return None if dims is None else work_per_op(micro_batch, seq_len, dims.width, tp)


def scale_of_nodes(nodes: int) -> str:
    """The SCALES bucket of a job over `nodes` hosts."""
    if nodes <= 1:
        return SCALES[0]
    if nodes <= 8:
        return SCALES[1]
    return SCALES[2] if nodes <= 64 else SCALES[3]


# The card families the report breaks its figures down by: those of 2026's clusters, each with the
# goal the report holds it to, then the older generations.
NEW_FAMILIES = (
    "Blackwell (B200, B300)",
    "Grace-Blackwell (GB200, GB300)",
    "AMD Instinct (MI300X-MI355X)",
    "Hopper variants (H800, H20)",
    "Volta (V100)",
)
OLDER_FAMILIES = {"hopper": "Hopper (H100, H200)", "ampere": "Ampere and Ada (A100, A800, L40S, ...)"}


# The cards' own names: a card given by its figures (plan_options.with_given_figures) is named apart from
# them, and belongs to no family the benchmark measured.
CARD_NAMES = frozenset(spec.name for spec in GPUS.values())


def card_family(spec: GPUSpec) -> str:
    """The family a card belongs to: NEW_FAMILIES, or its NCCL generation for the others."""
    if spec.generation == "blackwell":
        return NEW_FAMILIES[1] if spec.gpus_per_host < 8 else NEW_FAMILIES[0]
    if spec.generation.startswith("cdna"):
        return NEW_FAMILIES[2]
    if spec.name.startswith(("H800", "H20 ")):
        return NEW_FAMILIES[3]
    if spec.generation == "volta":
        return NEW_FAMILIES[4]
    return OLDER_FAMILIES[spec.generation]


@cache
def published_figures() -> dict:
    """The figures bench/plan_vs_published.py last wrote: {"kinds"|"families"|"work": {bucket: {"runs",
    "median_abs_error", "median_ratio"}}, "kinds_by_scale": {kind: {scale: ...}}, "sweep": {"what",
    "kinds"}}: the last the sweep one team ran on one cluster, which the report holds apart from the
    goals' buckets."""
    return json.loads(ACCURACY_FILE.read_text())


def _lean(ratio: float) -> str:
    if round(ratio, 2) == 1:
        return "no lean"
    if ratio >= 1.5:
        return f"{ratio:.1f}x fast at the median"
    return f"{abs(ratio - 1):.0%} {'fast' if ratio > 1 else 'slow'} at the median"


def _error(figures: dict) -> str:
    few = "only " if figures["runs"] < FEW_RUNS else ""
    return f"{figures['median_abs_error']:.1%} ({few}{figures['runs']} runs, {_lean(figures['median_ratio'])})"


def _bucket(name: str, figures: dict) -> str:
    return f"{name} {_error(figures)}"


def accuracy_line(layout: Layout, topology: Topology, gpu: GPUSpec | None, work: float | None = None) -> str:
    """One line: the plan's median error of tokens/s per GPU on published runs of each of the layout's
    kinds at its scale (a kind and a scale apart would hide a bucket of few runs: data parallelism
    past 64 nodes), then at its `work` per GPU per layer op (work_per_op; None: a model without
    transformer sizes), then on its card's family (a card given by its figures alone has none)."""
    figures = published_figures()
    kinds = layout_kinds(layout.tp, layout.pp, layout.cp, topology.per_domain)
    scale = scale_of_nodes(topology.nodes)
    described = []
    for kind in kinds:
        joint = figures["kinds_by_scale"].get(kind, {}).get(scale)
        if joint:
            described.append(_bucket(f"{kind} on {scale}", joint))
        elif kind in figures["kinds"]:
            described.append(f"{kind}, none published on {scale}: on any scale {_error(figures['kinds'][kind])}")
    if work is not None and work > 0:
        bucket = work_bucket_of(work)
        if bucket in figures.get("work", {}):
            at = (
                f"at its work per GPU per layer op, {bucket} (micro-batch x seq x width / tp = 2^{math.log2(work):.1f})"
            )
            described.append(_bucket(at, figures["work"][bucket]))
    if gpu is not None and gpu.name in CARD_NAMES:
        family = card_family(gpu)
        if family in figures["families"]:
            described.append(_bucket(f"on {family}", figures["families"][family]))
    sweep = figures.get("sweep", {})
    lead = leading_kind(kinds)
    if lead in sweep.get("kinds", {}):
        described.append(f"in {sweep['what']}, {_bucket(lead, sweep['kinds'][lead])}")
    return (
        "How close plans like it have come: the median error of tokens/s per GPU on published runs, "
        f"{'; '.join(described)} (bench/results/plan_vs_published.md)."
    )
