#!/usr/bin/env python3
"""Llama 3.1 405B on 1,024 H100s at sequence 8192: what `runner.py plan` and `plan search=true`
recommend, the best layout of each family they plan (ZeRO-3 and FSDP, FSDP x TP, Megatron-style
TP x PP beside DDP or ZeRO-1, FSDP x TP x PP) with the term of its step that makes it lose, beside the
layouts published runs of that size used, and those runs planned as they ran (bench/plan_vs_published.py:
Megatron-LM's engine for NVIDIA's, torchtitan's FSDP2 for its own). The search lays out only what a
registered strategy takes (its `train` options): a family no strategy takes the sizes of yet is said so.

    python bench/plan_405b.py              # written to bench/results/plan_405b.md
    python bench/plan_405b.py --out -      # printed only

The published figures are the sources' own (no plan is fitted to them): Llama 3's pre-training
stages (arXiv 2407.21783, Table 4: TFLOPs per GPU and BF16 MFU), torchtitan's 405B on 512 H100s
(bench/data/public_runs.csv) and NVIDIA's 405B on 576-2,304 H100s (dgxc-benchmarking's
llama3.1/README_405b.md @ 35a9aecc8d5b, TP 8, PP 9, VP 7, CP 2, bf16).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import runner  # noqa: E402
from bench import plan_vs_published as published  # noqa: E402
from harness.plan.plan_cli import PlanConfig, strategy_names  # noqa: E402
from harness.plan.predict import Question, StrategyPlan, plan_backend  # noqa: E402
from harness.plan.search.layout_search import (  # noqa: E402
    TERMS,
    Searched,
    layout_question,
    search,
    step_terms,
    why_slower,
)
from harness.plan.search.search_cli import search_question  # noqa: E402

QUESTION = {"model": "llama3.1-405b", "gpus": 1024, "seq_len": 8192}
PLAN_ARGS = ["batch_size=2048", "micro_batch=1", "activation_checkpointing=full"]
SEARCH = {**QUESTION, "global_batch_tokens": "16M"}
LLAMA3 = "Llama 3, arXiv 2407.21783 Table 4"
TITAN = "torchtitan, bench/data/public_runs.csv"
NVIDIA = "NVIDIA dgxc-benchmarking 405B, NeMo 24.09"
# (who, GPUs, layout, seq, the published figure)
PUBLISHED = [
    (LLAMA3, 8192, "TP 8 x PP 16 x DP 64 (no checkpointing)", 8192, "430 TFLOP/s, 43% MFU"),
    (LLAMA3, 16384, "TP 8 x PP 16 x DP 128", 8192, "400 TFLOP/s, 41% MFU"),
    (LLAMA3, 16384, "TP 8 x CP 16 x PP 16 x DP 8", 131072, "380 TFLOP/s, 38% MFU"),
    (TITAN, 512, "FSDP 8 x TP 8 x PP 8, 1F1B, float8", 8192, "100 tokens/s per GPU"),
    (TITAN, 512, "FSDP 8 x TP 8 x PP 8, interleaved, float8", 8192, "128 tokens/s per GPU"),
    (NVIDIA, 576, "TP 8 x PP 9 x VP 7 x CP 2 x DP 4, bf16", 8192, "208 tokens/s per GPU"),
    (NVIDIA, 2304, "TP 8 x PP 9 x VP 7 x CP 2 x DP 16, bf16", 8192, "203 tokens/s per GPU"),
]
MEGATRON_FAMILY = "Megatron-style TP x PP (DDP or ZeRO-1 inside each stage)"
FAMILIES = {
    "ZeRO-3 / FSDP (no tensor or pipeline parallel)": lambda s: s.plan.layout.tp == 1 and s.plan.layout.pp == 1,
    "FSDP x TP": lambda s: s.plan.layout.tp > 1 and s.plan.layout.pp == 1 and s.plan.backend.stage == 3,
    "Megatron-style TP x PP (DDP or ZeRO-1 inside each stage)": lambda s: (
        s.plan.layout.tp > 1 and s.plan.layout.pp > 1 and s.plan.backend.stage < 3
    ),
    "FSDP x TP x PP": lambda s: s.plan.layout.tp > 1 and s.plan.layout.pp > 1 and s.plan.backend.stage == 3,
    "pipeline without TP": lambda s: s.plan.layout.tp == 1 and s.plan.layout.pp > 1,
}


def plan_lines() -> list[str]:
    """`runner.py plan`'s table rows and recommendation for the question."""
    args = ["plan", *(f"{k}={v}" for k, v in QUESTION.items()), *PLAN_ARGS]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runner.main(args)
    names = ("zero3", "fsdp", "fsdp-tp", "ddp-tp", "zero1-tp", "fsdp-pp", "zero1-pp")
    text = out.getvalue().splitlines()
    table = [line for line in text if line.split(" ")[0] in ("strategy", *names) and "  " in line]
    pipelines = [line for line in text if line.split(" ")[0] in names and " as a pipeline of " in line]
    answer = [
        line
        for line in text
        if line.startswith(("Use ", "Runner-up")) or line.strip().split(":")[0] in names and line.startswith("  ")
    ]
    command = "python runner.py " + " ".join(args)
    return ["## The default plan", "", f"`{command}`", "", "```", *table, "", *pipelines, "", *answer, "```", ""]


def _row(s: Searched, best: Searched, scale: float, family: str) -> str:
    loss = "the winner" if s is best else why_slower(s, best, scale).describe()
    speed = f"{s.tokens_per_s_per_gpu:,.0f} | {s.mfu:.0%} | {s.peak_bytes / 2**30:.1f}"
    return f"| {family}: {s.arguments()} | {speed} | {loss} |"


def search_lines() -> list[str]:
    cfg = PlanConfig(**SEARCH, search=True)
    q, global_batch = search_question(cfg)
    result = search(q, strategy_names(cfg, q.gpus), global_batch)
    best = result.ranked[0]
    scale = q.factors.compute_scale
    args = " ".join(f"{k}={v}" for k, v in SEARCH.items())
    lines = [
        "## The search: the best layout of each family",
        "",
        f"`python runner.py plan search=true {args}`: {result.planned:,} layouts, {len(result.ranked):,} fit.",
        "",
        "| family: its fastest layout that fits | tok/s/GPU | MFU | peak GiB | against the fastest |",
        "|---|---:|---:|---:|---|",
    ]
    found = {family: next((s for s in result.ranked if member(s)), None) for family, member in FAMILIES.items()}
    for family, s in found.items():
        if s is not None:
            lines.append(_row(s, best, scale, family))
        elif any(FAMILIES[family](t) for t in result.too_large):
            lines.append(f"| {family}: none fits | | | | |")
        else:
            lines.append(f"| {family}: none laid out (no registered strategy takes these sizes together) | | | | |")
    terms = list(TERMS)
    lines += [
        "",
        "Each family's fastest layout, its step by term (seconds; the imbalance is part of the compute: what the "
        "slowest pipeline stage computes beyond an even share, which the others wait out):",
        "",
        "| family | step | " + " | ".join(terms) + " | of the compute, imbalance |",
        "|---|---:|" + "---:|" * (len(terms) + 1),
    ]
    for family, s in found.items():
        if s is None or s.plan.time is None:
            continue
        split = step_terms(s, scale)
        cells = " | ".join(f"{split[t]:.1f}" for t in terms)
        lines.append(f"| {family} | {s.plan.time.step_s:.1f} | {cells} | {s.plan.time.imbalance_s:.1f} |")
    megatron = found[MEGATRON_FAMILY]
    overlapped = None if megatron is None else with_async_tp(megatron, q)
    return lines + ["", *reading(found, best, scale, overlapped), *engine_lines(best, megatron, overlapped)]


def with_async_tp(s: Searched, q: Question) -> Searched:
    """The same layout with its tensor-parallel collectives pipelined with their matmuls (torch's async
    TP, which needs compile; parallel/async_tp_cost.py), the rest of its plan as the search's."""
    options = {**s.options, "async_tp": True}
    backend = replace(s.plan.backend, options={**s.plan.backend.options, "async_tp": True})
    asked = layout_question(replace(q, compiled=True), options, s.micro_batch, s.grad_accum, s.checkpointing)
    return replace(s, options=options, plan=plan_backend(backend, asked))


def _tok_s(plan: StrategyPlan, gpus: int) -> float:
    assert plan.time is not None
    return plan.time.tokens_per_s / gpus


# Llama 3's layout (arXiv 2407.21783 Table 4: TP 8, PP 16, 8K sequences) at 1,024 GPUs on Megatron-LM's
# engine as the published NVIDIA rows run it (its plan tokens: bench/data/README.md), bf16, full
# checkpointing (this planner's memory model does not fit it without), 2,048 sequences a step.
LLAMA3_AT_1024 = (
    "megatron tp=8 pp=16 dp=8 distributed_optimizer sequence_parallel tp_comm_overlap overlap_grad_reduce "
    "overlap_param_gather transformer_engine attention=cudnn fused_loss"
)


def llama3_layout_plan() -> StrategyPlan | None:
    """Llama 3's TP 8 x PP 16 on 1,024 H100s, planned as bench/plan_vs_published.py plans a Megatron row."""
    row = dict.fromkeys(published.COLUMNS, "")
    row.update(
        source="arXiv 2407.21783v1 Table 4 (the layout at 1,024 GPUs)",
        model="llama3.1-405b",
        arch="llama",
        n_layers="126",
        d_model="16384",
        n_heads="128",
        kv_heads="8",
        ffn="53248",
        vocab="128256",
        seq_len="8192",
        gpus="1024",
        nodes="128",
        gpu="H100-80",
        network="ndr",
        micro_batch="1",
        grad_accum=str(2048 // 8),
        activation_checkpointing="true",
        compile="false",
        sharding=LLAMA3_AT_1024,
        precision="bf16",
        mp_mode="bf16 parameters, fp32 main parameters and gradient reduction",
        notes="",
    )
    return published.question(row)[1]


def engine_lines(best: Searched, megatron: Searched | None, overlapped: Searched | None) -> list[str]:
    """The published family on the engine the published runs ran, beside the search's fastest."""
    lines = ["## The published family on the engine it ran", ""]
    llama3 = llama3_layout_plan()
    runs = [
        o
        for path in published.runs_csvs()
        for o in published.plan_rows(published.read_rows(path))
        if o.row["model"] == "llama3.1-405b"
        and o.row["gpus"] == "1024"
        and o.row["gpu"].startswith("H100")
        and o.row["precision"] == "bf16"
        and o.predicted is not None
    ]
    lines.append(
        "| layout at 1,024 H100s, bf16, 8K | engine | planned tok/s/GPU | published tok/s/GPU | against the search's "
        f"fastest ({best.tokens_per_s_per_gpu:,.0f}) |"
    )
    lines.append("|---|---|---:|---:|---:|")
    if megatron is not None:
        lines.append(
            f"| {megatron.arguments()} | parabench's zero1-tp (torch's TP) | {megatron.tokens_per_s_per_gpu:,.0f} | - "
            f"| {megatron.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu - 1:+.0%} |"
        )
    if overlapped is not None:
        rate = overlapped.tokens_per_s_per_gpu
        lines.append(
            f"| the same with strategy_options.async_tp=true compile=true | torch's async TP | "
            f"{rate:,.0f} | - | {rate / best.tokens_per_s_per_gpu - 1:+.0%} |"
        )
    if llama3 is not None and llama3.time is not None:
        rate = _tok_s(llama3, 1024)
        fits = "" if llama3.fits else " (planned not to fit)"
        lines.append(
            f"| Llama 3's TP 8 x PP 16 x DP 8, full checkpointing{fits} | Megatron-LM's, TransformerEngine's "
            f"tp_comm_overlap | {rate:,.0f} | - | {rate / best.tokens_per_s_per_gpu - 1:+.0%} |"
        )
    for o in runs:
        assert o.predicted is not None and o.published is not None
        layout = " ".join(w for w in published._layout_sharding(o.row).split() if "=" in w and w[:2] in "tppvpcpdp")
        lines.append(
            f"| {layout} ({o.row['source'].split(':')[0]}) | Megatron-LM's (NeMo) | {o.predicted:,.0f} | "
            f"{o.published:,.0f} | {o.predicted / best.tokens_per_s_per_gpu - 1:+.0%} |"
        )
    if runs:
        top = max(runs, key=lambda o: o.predicted or 0.0)
        assert top.predicted is not None and top.published is not None
        lines += [
            "",
            f"The answer: the published family, on the engine it ran, is the fastest layout planned here: "
            f"{top.predicted:,.0f} tokens/s per GPU against the search's {best.tokens_per_s_per_gpu:,.0f} "
            f"({top.predicted / best.tokens_per_s_per_gpu - 1:+.0%}), and its plan is "
            f"{top.predicted / top.published:.2f}x "
            f"its published {top.published:,.0f}, where the search's ZeRO-3 and FSDP layouts rest on a model unchecked "
            "at this scale (above). Among parabench's own strategies the search ranks FSDP first because torch's "
            "tensor parallelism without async TP waits on its collectives in every micro-batch and fits 8K "
            "sequences only with full checkpointing; NVIDIA's layout recomputes nothing (context parallel 2 and "
            "pipeline stages of 16 blocks leave room), which is most of its lead.",
        ]
    return lines + [""]


def reading(found: dict[str, Searched | None], best: Searched, scale: float, overlapped: Searched | None) -> list[str]:
    """What the search says against the published layouts, from its own figures."""
    megatron = found[MEGATRON_FAMILY]
    lines = ["## Reading", ""]
    lines.append(
        f"The search's fastest is `{best.arguments()}` at {best.mfu:.0%} MFU. The layout family the published "
        "runs of this size used (TP 8 with pipeline stages beside data parallel, 38-43% MFU in Llama 3's Table 4) "
        + (
            f"plans at {megatron.mfu:.0%} here ({megatron.arguments()}): "
            f"{why_slower(megatron, best, scale).describe()}."
            if megatron
            else "is not among the search's layouts (no registered strategy takes its sizes together)."
        )
    )
    lines.append("")
    if megatron is not None and overlapped is not None and megatron.plan.time and overlapped.plan.time:
        lines.append(
            "That cost is what torch's tensor parallelism with sequence parallelism costs there, not an artifact: "
            "parabench's zero1-tp runs torch's TP, whose all-gathers and reduce-scatters of each block's "
            "activations (a micro-batch of 8,192 tokens x 16,384 wide in bf16 over 8 GPUs) wait in every "
            f"micro-batch's critical path, {megatron.plan.time.recurring_comm_s:.1f} s a step against its "
            f"{megatron.plan.time.compute_s:.1f} s of compute. With torch's async TP (`strategy_options.async_tp=true "
            "compile=true`: the gathers and scatters Inductor fuses pipelined with their matmuls) the same layout "
            f"plans at {overlapped.tokens_per_s_per_gpu:,.0f} tokens/s per GPU ({overlapped.mfu:.0%} MFU), "
            f"{overlapped.plan.time.recurring_comm_s:.1f} s left in the critical path; against torchtitan's runs "
            "published both ways the plan's gain from async TP is within 1-10 points of the published one "
            '(docs/planner.md, "Async tensor parallelism"). Megatron-LM\'s engine, which the published runs of '
            "this family ran, pipelines them likewise (TransformerEngine's tp_comm_overlap) and copies nothing "
            "around them: the section below."
        )
        lines.append("")
    lines.append(
        "How far the planner's ZeRO-3 / FSDP model at about 1,000 GPUs has been checked: against published runs "
        "at 256 GPUs and more with no tensor or pipeline parallelism, llm-foundry's FSDP1 on 256 and 512 H100s "
        "(MPT 1B-70B, bench/data/public_runs.csv: planned 5-23% fast at 512, the published rates falling 1-7% from "
        "256 to 512 GPUs where the plan's barely move), InternEvo's ZeRO-1 on 512 and 1,024 A100s (its "
        "HybridZeroOptimizer's per-rank broadcasts, planned as its code runs them) and DeepSpeed's ZeRO-3 of 2021 "
        "for 175B and 530B GPTs on 384-2,240 A100s (Narayanan et al. 2021, Table 2, in bench/data/public_runs.csv: "
        "planned 1.2-1.7x fast, the more GPUs the faster, after its list collectives and host synchronisation are "
        "priced; their published step stays the same as the GPUs double, bandwidth-bound at about one 200G card's "
        "rate per GPU, which the plan does not reproduce). So the ZeRO-3 / FSDP rows above rest on a model that "
        "is fast at this scale on the one published set there is, and the published family on its own engine is "
        "the answer that rests on published runs."
    )
    return lines + [""]


# The published runs planned as they ran: this model, card and sequence, at 512 to 2,304 GPUs.
PLANNED_RUNS = {"model": "llama3.1-405b", "seq_len": "8192", "gpus": range(512, 2305)}


def planned_runs_lines() -> list[str]:
    """Each published run of PLANNED_RUNS's size in bench/data, planned as it ran (its engine, layout,
    batch and precision: bench/plan_vs_published.py), beside its published rate."""
    lines = [
        "## The published runs of this size, planned as they ran",
        "",
        "`python bench/plan_vs_published.py`'s plan of each (Megatron-LM's engine for NVIDIA's rows, "
        "torchtitan's FSDP2 for its own), on H100s at sequence 8192:",
        "",
        "| source | GPUs | layout | precision | published tok/s/GPU | planned | planned / published |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for path in published.runs_csvs():
        for outcome in published.plan_rows(published.read_rows(path)):
            row = outcome.row
            if (
                row["model"] != PLANNED_RUNS["model"]
                or row["seq_len"] != PLANNED_RUNS["seq_len"]
                or not row["gpu"].startswith("H100")
                or int(row["gpus"]) not in PLANNED_RUNS["gpus"]
                or outcome.predicted is None
                or not outcome.published
            ):
                continue
            source = row["source"].split("@")[0]
            lines.append(
                f"| {source} | {int(row['gpus']):,} | {row['sharding']} | {row['precision']} | "
                f"{outcome.published:,.0f} | {outcome.predicted:,.0f} | {outcome.predicted / outcome.published:.2f} |"
            )
    return lines + [""]


def published_lines() -> list[str]:
    lines = [
        "## Published runs of this size",
        "",
        "| source | GPUs | layout | seq | published |",
        "|---|---:|---|---:|---|",
    ]
    lines += [f"| {who} | {gpus:,} | {layout} | {seq:,} | {figure} |" for who, gpus, layout, seq, figure in PUBLISHED]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_405b.md"), help="'-': print only")
    args = p.parse_args(argv)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            "# Llama 3.1 405B on 1,024 H100s: the plan beside the published layouts",
            "",
            f"{stamp}; `python bench/plan_405b.py`. H100 SXM 80GB, 8 x 400 Gb/s InfiniBand a node, bf16, "
            "16M tokens a step (2,048 sequences of 8,192), the default factors.",
            "",
            *published_lines(),
            *plan_lines(),
            *search_lines(),
            *planned_runs_lines(),
        ]
    )
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
