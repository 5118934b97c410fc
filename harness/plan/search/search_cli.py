"""`runner.py plan search=true`: the fastest layouts that fit for one model, cluster and global
batch, as a table, a JSON document (format=json) and a chart of speed against memory.

    python runner.py plan search=true model=llama3.1-70b gpus=256 seq_len=8192 global_batch_tokens=4M
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harness.common.units import GIB
from harness.plan.model.model_shape import PlanError
from harness.plan.model.moe_shape import total_params
from harness.plan.parallel.pipeline_cost import pipeline_of
from harness.plan.parallel.planned_options import routed_options, what_if_lines
from harness.plan.plan_cli import aligned, basis_lines, strategy_names
from harness.plan.plan_options import (
    PlanConfig,
    global_batch_of,
    gpu_counts,
    models_asked,
    plot_dir,
    question,
    shape_for,
    too_few_sequences,
    with_seq_len,
)
from harness.plan.precision_what_if import precision_lines
from harness.plan.predict import Question
from harness.plan.published_accuracy import accuracy_line, plan_work
from harness.plan.recommendation import CHECKPOINTING_ORDER, domain_lines, shortfall
from harness.plan.search.layout_search import (
    TOP,
    Searched,
    SearchResult,
    distinct,
    fastest_tp_across_nodes,
    gib,
    search,
    why_slower,
)
from harness.plan.search.what_fits import what_fits
from strategies.option_routing import RoutedOptions

PLOT_NAME = "plan_search.png"
HEADER = (
    "#",
    "strategy",
    "tp",
    "pp",
    "cp",
    "shard",
    "hpz",
    "mb",
    "accum",
    "schedule",
    "ckpt",
    "tok/s/GPU",
    "MFU",
    "peak",
    "against #1",
)


def search_question(cfg: PlanConfig) -> tuple[Question, int]:
    """The question every layout shares, and its global batch in sequences."""
    if len(models_asked(cfg)) > 1 or len(gpu_counts(cfg)) > 1:
        raise PlanError("search=true plans one model on one GPU count: give model= and gpus= one value each")
    if cfg.micro_batch is not None:
        raise PlanError("search=true chooses the micro-batch and accumulation itself: drop micro_batch=")
    cfg = with_seq_len(cfg, shape_for(cfg, models_asked(cfg)[0]))
    global_batch = global_batch_of(cfg)
    if global_batch is None:
        raise PlanError("search=true needs the global batch: global_batch_tokens= (e.g. 4M) or batch_size= (sequences)")
    asked = replace(cfg, batch_size=global_batch, global_batch_tokens=None, micro_batch=None)
    return question(asked), global_batch


def _forwards(s: Searched) -> tuple[int, int, str]:
    """(sequences in one forward, forwards per step, schedule) of a GPU: a pipeline splits its local
    batch (the runner's micro_batch) into its micro-batches, the others accumulate whole micro-batches."""
    if s.plan.layout.pp == 1:
        return s.micro_batch, s.grad_accum, "-"
    pipe = pipeline_of(s.plan.backend.options, s.micro_batch, s.plan.layout.pp)
    schedule = pipe.schedule + (f" x{pipe.virtual}" if pipe.virtual > 1 else "")
    return s.micro_batch // pipe.microbatches, pipe.microbatches * s.grad_accum, schedule


def _row(rank: int, s: Searched, against: str) -> tuple[str, ...]:
    layout = s.plan.layout
    sequences, forwards, schedule = _forwards(s)
    return (
        str(rank),
        s.strategy,
        str(layout.tp),
        str(layout.pp) if layout.pp > 1 else "-",
        str(layout.cp) if layout.cp > 1 else "-",
        str(layout.shard) if layout.replicas > 1 else "-",
        str(layout.hpz) if layout.hpz > 1 else "-",
        str(sequences),
        str(forwards),
        schedule,
        s.checkpointing,
        f"{s.tokens_per_s_per_gpu:,.0f}",
        f"{s.mfu:.0%}",
        f"{s.peak_bytes / GIB:.1f}",
        against,
    )


def _leanest(layouts: list[Searched]) -> Searched:
    """The layout with the lowest peak; among equal peaks the one holding the least activations."""
    return min(layouts, key=lambda s: (s.peak_bytes, s.micro_batch, -CHECKPOINTING_ORDER.index(s.checkpointing)))


def nothing_fits(result: SearchResult) -> list[str]:
    """Why no layout fits, and the layouts of any strategy that would, on these GPUs or the fewest more."""
    q = result.question
    lean = _leanest(result.too_large)
    asked = f"{q.gpus} x {q.capacity_bytes / GIB:.0f} GiB"
    lines = [f"Nothing fits in {asked}: the leanest layout, {lean.arguments()}, {shortfall(lean.plan)}."]
    if q.gpu is not None:
        lines += what_fits(q, result.global_batch).lines(q.gpus)
    return lines


# The first `option=value` of a reason: reasons that differ only in that value are said once.
_FIRST_VALUE = re.compile(r"(\w+=)(\d+)")


def _not_laid_out(result: SearchResult) -> list[str]:
    """Why layouts could not be planned: each reason once, with the strategies it stopped and, where
    it recurs for several values of one option, those values."""
    reasons: dict[str, tuple[list[str], list[str]]] = {}
    for why in result.not_laid_out:
        name, _, rest = why.partition(": ")
        text = rest if rest else why
        value = _FIRST_VALUE.search(text)
        key = text if value is None else text[: value.start(2)] + "{}" + text[value.end(2) :]
        names, values = reasons.setdefault(key, ([], []))
        names.append(name if rest else "")
        if value is not None and value.group(2) not in values:
            values.append(value.group(2))
    lines = []
    for key, (names, values) in reasons.items():
        said = key.replace("{}", _either(values), 1) if values else key
        lines.append(f"  not laid out ({', '.join(dict.fromkeys(n for n in names if n)) or 'every strategy'}): {said}")
    return lines


def _either(values: list[str]) -> str:
    """'16', '16 or 32', '16, 32 or 64'."""
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _named(s: Searched, twins: list[str]) -> str:
    others = [twin for twin in twins if twin != s.strategy]
    return s.strategy + (f" (= {', '.join(others)})" if others else "")


def _numerics(s: Searched) -> list[str]:
    if not s.plan.backend.quantized_comm:
        return []
    return [
        f"  {s.strategy} sends weights as int8 and gradients as int4 (ZeRO++): compare its loss with zero3's on a "
        "smaller model (runner.py compare) before a long run."
    ]


def _accuracy(best: Searched, q: Question) -> str:
    """How close plans like the fastest layout have come to published runs (published_accuracy.py)."""
    work = plan_work(best.micro_batch, q.seq_len, q.shape.dims, best.plan.layout.tp)
    return accuracy_line(best.plan.layout, q.topology, q.gpu, work)


def text_lines(result: SearchResult, seconds: float, top: int = TOP) -> list[str]:
    q = result.question
    tokens = result.global_batch * q.seq_len
    s = q.shape
    gpu = q.gpu.name if q.gpu else "an unknown card"
    lines = [
        f"parabench plan search | {s.name} ({total_params(s) / 1e9:.3g}B params)",
        f"  {q.topology.describe()} | {gpu} | {q.precision} | global batch {tokens:,} tokens = {result.global_batch} "
        f"x {q.seq_len} | strategy x tp x pp x cp x shard x micro-batch x accumulation x schedule x checkpointing",
        *(f"  {line}" for line in basis_lines(q)),
        f"  fits: {result.ranked[0].plan.headroom.describe()}" if result.ranked else "",
        "  mb = sequences a GPU runs in one forward; accum = forwards a step (a pipeline's micro-batches); "
        "peak = predicted peak allocated per GPU (GiB); against #1: how much slower than #1, as #1's tokens/s over "
        "its own less 1 (-50%: #1 is 1.5x as fast), and the term of its step that costs it most",
        f"Planned {result.planned:,} layouts in {seconds:.1f} s: {len(result.ranked):,} fit, "
        f"{len(result.too_large):,} do not; {sum(result.not_laid_out.values()):,} more could not be laid out.",
        "",
    ]
    if not result.ranked:
        return lines + nothing_fits(result) + _not_laid_out(result)
    shown = distinct(result.ranked, top)
    best = shown[0][0]
    scale = q.factors.compute_scale
    losses = [why_slower(found, best, scale, q.topology) for found, _ in shown[1:]]
    rows = [HEADER, _row(1, best, "fastest")] + [
        _row(i + 2, found, loss.short) for i, ((found, _), loss) in enumerate(zip(shown[1:], losses, strict=True))
    ]
    if q.shape.dims is not None and q.shape.dims.moe is not None:  # a mixture of experts: each layout's ep
        eps = ["ep"] + [str(found.plan.layout.experts.ep) for found, _ in shown]
        rows = [(*row[:5], ep, *row[5:]) for row, ep in zip(rows, eps, strict=True)]
    lines += aligned(rows, left=2)
    lines += [
        "",
        f"Use {best.strategy}: {best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {best.mfu:.0%} MFU, "
        f"{gib(best.peak_bytes)} peak per GPU; to plan it alone, in place of search=true: {best.arguments()}",
        *domain_lines(best.plan.layout, q.topology),
        _accuracy(best, q),
        *_numerics(best),
    ]
    lines += [
        f"  #{i + 2} {_named(found, twins)}: {loss.describe()}."
        for i, ((found, twins), loss) in enumerate(zip(shown[1:], losses, strict=True))
    ]
    if shown[0][1]:
        lines.append(f"  #1 is planned alike by {', '.join(shown[0][1])}.")
    across = fastest_tp_across_nodes(result.ranked, [found for found, _ in shown])
    if across is not None:
        loss = why_slower(across, best, scale, q.topology)
        lines.append(
            f"  Fastest with tensor parallelism across nodes: {across.arguments()}, "
            f"{across.tokens_per_s_per_gpu:,.0f} tokens/s per GPU: {loss.describe()}."
        )
    frontier = result.frontier()
    lines.append(
        "Frontier (no layout both faster and leaner): "
        + "; ".join(
            f"{f.strategy} tp {f.plan.layout.tp}{f' pp {f.plan.layout.pp}' if f.plan.layout.pp > 1 else ''} "
            f"mb {_forwards(f)[0]} {f.checkpointing} {gib(f.peak_bytes)} {f.tokens_per_s_per_gpu:,.0f} tok/s"
            for f in frontier
        )
        + "."
    )
    return lines + _not_laid_out(result)


def as_json(cfg: PlanConfig, result: SearchResult, seconds: float) -> dict[str, Any]:
    q = result.question
    best = result.ranked[0] if result.ranked else None
    scale = q.factors.compute_scale
    shown = distinct(result.ranked, cfg.top or TOP)
    across = fastest_tp_across_nodes(result.ranked, [found for found, _ in shown]) if best is not None else None
    return {
        "question": asdict(cfg)
        | {
            "gpus": q.gpus,
            "nodes": q.nodes,
            "seq_len": q.seq_len,  # unset, the model's (with_seq_len)
            "topology": q.topology.describe(),
            "global_batch_sequences": result.global_batch,
            "global_batch_tokens": result.global_batch * q.seq_len,
            "capacity_bytes": q.capacity_bytes,
        },
        "model": {
            "name": q.shape.name,
            "params": q.shape.params,
            "flops_per_token": q.shape.flops_per_token(q.seq_len),
        },
        "basis": basis_lines(q),
        "planned": result.planned,
        "fit": len(result.ranked),
        "did_not_fit": len(result.too_large),
        "not_laid_out": result.not_laid_out,
        "seconds": seconds,
        "top": cfg.top or TOP,  # the most layouts kept: more may fit (top= keeps more)
        "layouts": [
            found.as_dict()
            | {
                "planned_alike_by": twins,
                "against_first": None if found is best else why_slower(found, best, scale, q.topology).describe(),
            }
            for found, twins in shown
        ],
        "frontier": [found.as_dict() for found in result.frontier()],
        "fastest_tp_across_nodes": None
        if across is None
        else across.as_dict() | {"against_first": why_slower(across, best, scale, q.topology).describe()},
        "nothing_fits": nothing_fits(result) if best is None and result.too_large else None,
        "published_accuracy": None if best is None else _accuracy(best, q),
    }


def option_lines(result: SearchResult, routed: RoutedOptions, top: int = TOP) -> list[str]:
    """Which strategies each compare-wide option reached, the what-ifs priced (a precision train does not
    run for the `top` layouts listed), and the layouts listed under another strategy's name."""
    reaches = [f"  {line}." for line in routed.reaches()] if len(routed.by_strategy) > 1 else []
    sizes: dict[tuple[str, str], list[str]] = {}
    for what, first in result.listed_as.items():
        name, _, dims = what.partition(" at ")
        sizes.setdefault((name, first), []).append(dims)
    alike = [
        f"  listed once: {name} at {_either(dims).replace(' or ', ' and ')} lays out as {first} does, listed under "
        f"{first}."
        for (name, first), dims in sizes.items()
    ]
    shown = [found.plan for found, _ in distinct(result.ranked, top)]
    precision = [f"  {line}" for line in precision_lines(result.question.precision, shown)]
    return reaches + [f"  {line}" for line in what_if_lines(routed)] + precision + alike


def nothing_laid_out(cfg: PlanConfig, result: SearchResult) -> str:
    """Why no layout could be planned, in one line: a batch too small for every layout says the smallest
    one a layout takes, in the option the user gave; other reasons are each said once."""
    q, fewest = result.question, result.fewest_sequences
    where = f"{q.shape.name} on {q.gpus} GPUs"
    if fewest is None:
        return f"{where}: no layout can take the batch: " + "; ".join(line.strip() for line in _not_laid_out(result))
    return f"{where}: {too_few_sequences(cfg, result.global_batch, q.seq_len, fewest)}"


def run_search(cfg: PlanConfig) -> int:
    q, global_batch = search_question(cfg)
    names = strategy_names(cfg, q.gpus)
    routed = routed_options(names, cfg.strategy_options, verb="search")
    started = time.perf_counter()
    # activation_checkpointing= given: the layouts under that mode alone; unset: under each.
    result = search(
        q,
        names,
        global_batch,
        modes=CHECKPOINTING_ORDER if cfg.activation_checkpointing is None else (q.checkpointing,),
    )
    seconds = time.perf_counter() - started
    if not result.planned:
        raise PlanError(nothing_laid_out(cfg, result))
    plots: list[Path] = []
    if cfg.plot:
        from harness.plan.search.search_plot import frontier_chart  # matplotlib only when asked

        plots = [frontier_chart(result, plot_dir(cfg) / PLOT_NAME)]
    if cfg.format == "json":
        facts = {"plots": [str(p) for p in plots], "listed_as": result.listed_as}
        facts["strategy_options_reach"] = routed.takers
        print(json.dumps(as_json(cfg, result, seconds) | facts, indent=2))
        return 0
    drawn = [f"wrote {p}" for p in plots] or ["plot=true draws tokens/s against memory per GPU, the frontier marked."]
    print("\n".join(text_lines(result, seconds, cfg.top or TOP) + option_lines(result, routed, cfg.top or TOP) + drawn))
    return 0
