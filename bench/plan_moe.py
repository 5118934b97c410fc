#!/usr/bin/env python3
"""How should a mixture of experts be laid out? The planner's answer for Mixtral 8x7B on 64 H100s and
Qwen3-235B-A22B on 512 H100s (8 to a node, 8 x 400G InfiniBand), at 4096 tokens a sequence:

  * the layout search over the registered strategies that run a mixture of experts (ddp-ep,
    zero1-ep, zero2-ep with every ep_size that divides the experts and the GPUs; fsdp and zero3
    holding every expert), as `runner.py plan search=true` prints it, each loser with the term of
    its step that costs it most;
  * Megatron-core's layouts (tensor, pipeline and expert parallel, the distributed optimizer), which
    no registered strategy runs, planned as bench/plan_vs_published.py plans a published
    Megatron-Bridge run (bench/moe_rows.py), ranked the same way, with the layouts that do not fit
    and what fills them;
  * the best expert-parallel layout again with the busiest GPU's experts at 1.5x the mean load
    (`moe_imbalance=1.5`; published Megatron-Bridge benchmarks force balanced routing).

    python bench/plan_moe.py             # written to bench/results/plan_moe.md
    python bench/plan_moe.py --out -     # printed only

Runs on the CPU in seconds (no torch).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plan_vs_published import question as published_question  # noqa: E402
from harness.common.units import GIB  # noqa: E402
from harness.plan.predict import plan_backend, storage_precision  # noqa: E402
from harness.plan.search.layout_search import Searched, largest_part, why_slower  # noqa: E402

MOE_STRATEGIES = "[ddp-ep,zero1-ep,zero2-ep,fsdp,zero3]"
SEARCHES = [
    f"model=mixtral-8x7b gpus=64 gpu=H100 seq_len=4096 global_batch_tokens=4M strategies={MOE_STRATEGIES}",
    f"model=qwen3-235b-a22b gpus=512 gpu=H100 seq_len=4096 global_batch_tokens=8M strategies={MOE_STRATEGIES}",
]
# The published Megatron-Bridge row whose model, run and recipe the Megatron-core layouts take: Qwen3-235B-A22B
# on 256 H100s, bf16 (the Model Zoo's cross-node EP row), its layout replaced by each of GRID's.
TEMPLATE = ("qwen3-235b-a22b", "yanring/Megatron-MoE-ModelZoo:examples/qwen3/readme.md")
GPUS, NODES, GLOBAL_BATCH = 512, 64, 2048
GRID = [  # (tp, pp, vp, ep): the expert-parallel sizes Megatron-core's recipes use beside tp and pp
    (tp, pp, vp, ep)
    for tp in (1, 2, 4)
    for pp in (4, 8, 16)
    for vp in (1, 2, 4)
    for ep in (8, 16, 32, 64)
    if 94 >= pp * vp and GPUS % (tp * pp) == 0 and (GPUS // pp) % ep == 0
]
RECOMPUTE = ("none", "layernorm+moe_act", "layernorm+moe")


def _template() -> dict[str, str]:
    with (ROOT / "bench" / "data" / "moe_runs.csv").open(newline="") as f:
        return next(r for r in csv.DictReader(f) if r["model"] == TEMPLATE[0] and r["source"].startswith(TEMPLATE[1]))


def _row(template: dict[str, str], tp: int, pp: int, vp: int, ep: int, recompute: str) -> dict[str, str]:
    dp = GPUS // (tp * pp)
    sharding = (
        f"megatron tp={tp} pp={pp}{f' vp={vp}' if vp > 1 else ''} ep={ep} etp=1 dp={dp} edp={GPUS // (ep * pp)} "
        "distributed_optimizer sequence_parallel overlap_grad_reduce overlap_param_gather"
        + (f" recompute={recompute}" if recompute != "none" else "")
    )
    micro_batches = GLOBAL_BATCH // dp
    return {
        **template,
        "gpus": str(GPUS),
        "nodes": str(NODES),
        "micro_batch": "1",
        "grad_accum": str(micro_batches),
        "global_batch": str(GLOBAL_BATCH),
        "activation_checkpointing": "selective" if recompute != "none" else "false",
        "sharding": sharding,
    }


def megatron_layouts() -> tuple[list[Searched], list[Searched]]:
    """(the layouts that fit, fastest first; those that do not)."""
    template = _template()
    fitting, too_large = [], []
    for tp, pp, vp, ep in GRID:
        for recompute in RECOMPUTE:
            row = _row(template, tp, pp, vp, ep, recompute)
            if vp > 1 and int(row["grad_accum"]) % pp:
                continue
            try:
                q, plan, why = published_question(row)
            except ValueError:  # a size the layout refuses (a pipeline deeper than the blocks)
                continue
            if plan is None or plan.time is None:
                continue
            options = {"tp": tp, "pp": pp, "vp": vp, "ep": ep, "recompute": recompute}
            peak = q.gpu.peak_flops[storage_precision(q.precision)]
            found = Searched(
                options, 1, int(row["grad_accum"]), recompute, plan, GPUS, peak, q.shape.flops_per_token(q.seq_len)
            )
            (fitting if plan.fits else too_large).append(found)
    fitting.sort(key=lambda s: -s.tokens_per_s_per_gpu)
    return fitting, too_large


def _layout(s: Searched) -> str:
    o = s.options
    virtual = f" (vp {o['vp']})" if o["vp"] > 1 else ""
    return f"tp {o['tp']} x pp {o['pp']}{virtual} x ep {o['ep']}, recompute {o['recompute']}"


def megatron_lines() -> list[str]:
    fitting, too_large = megatron_layouts()
    best = fitting[0]
    lines = [
        "### Megatron-core's layouts: Qwen3-235B-A22B on 512 H100s",
        "",
        f"{len(fitting) + len(too_large)} layouts planned ({len(GRID)} of tp x pp x vp x ep, each with recompute none, "
        f"layernorm+moe_act, layernorm+moe), {len(fitting)} fit. Global batch {GLOBAL_BATCH} sequences of 4096, "
        "micro-batch 1, bf16 with Megatron's fp32 master, the Model Zoo's settings (DeepEP's dispatcher, which "
        "sends a token once to each node holding its experts): planned as bench/plan_vs_published.py plans the "
        "published row.",
        "",
        "| # | layout | tok/s/GPU | MFU | peak GiB | against #1 |",
        "|---:|---|---:|---:|---:|---|",
    ]
    shown = fitting[:12]
    for i, s in enumerate(shown):
        why = "fastest" if i == 0 else why_slower(s, best, 1.0).describe()
        speed = f"{s.tokens_per_s_per_gpu:,.0f} | {s.mfu:.0%} | {s.peak_bytes / GIB:.1f}"
        lines.append(f"| {i + 1} | {_layout(s)} | {speed} | {why} |")
    lines += ["", "The fastest of each expert-parallel size, against #1:", ""]
    for ep in sorted({s.options["ep"] for s in fitting}):
        s = next(f for f in fitting if f.options["ep"] == ep)
        why = "fastest" if s is best else why_slower(s, best, 1.0).describe()
        lines.append(f"- ep {ep}: {_layout(s)}, {s.tokens_per_s_per_gpu:,.0f} tokens/s per GPU: {why}")
    lines += ["", "Do not fit (the leanest of each expert-parallel size, and what fills it):", ""]
    for ep in sorted({s.options["ep"] for s in too_large}):
        s = min((f for f in too_large if f.options["ep"] == ep), key=lambda f: f.peak_bytes)
        part, size = largest_part(s)
        states = sum(s.plan.states_on().values()) / GIB
        need, usable = s.plan.reserved_bytes / GIB, s.plan.headroom.usable / GIB
        lines.append(
            f"- ep {ep}: {_layout(s)} needs {need:.1f} GiB of {usable:.1f} usable; largest part {part} "
            f"{size / GIB:.1f} GiB (model states {states:.1f} GiB)"
        )
    imbalanced = _imbalanced(best)
    loss = why_slower(imbalanced, best, 1.0)
    lines += [
        "",
        f"With the busiest GPU's experts at 1.5x the mean load (moe_imbalance=1.5), #1 runs "
        f"{imbalanced.tokens_per_s_per_gpu:,.0f} tokens/s per GPU: {loss.describe()}.",
        "",
    ]
    return lines


def _imbalanced(s: Searched) -> Searched:
    """`s` planned again with moe_imbalance=1.5."""
    backend = s.plan.backend
    row = _row(_template(), s.options["tp"], s.options["pp"], s.options["vp"], s.options["ep"], s.options["recompute"])
    q, _, _ = published_question(row)
    q = replace(q, recipe=replace(q.recipe, moe_imbalance=1.5))
    return replace(s, plan=plan_backend(backend, q))


def search_lines(args: str) -> list[str]:
    command = ["python", "runner.py", "plan", "search=true", *args.split()]
    out = subprocess.run(
        [sys.executable, *command[1:]], capture_output=True, text=True, cwd=ROOT, timeout=300, check=True
    ).stdout
    return [f"### `{shlex.join(command)}`", "", "```", *out.rstrip().splitlines(), "```", ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_moe.md"), help="'-': print only")
    args = p.parse_args(argv)
    lines = []
    for search in SEARCHES:
        lines += search_lines(search)
    lines += megatron_lines()
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([f"## {now}", "", "Command: `python bench/plan_moe.py`", "", *lines])
    print(text)
    if args.out != "-":
        Path(args.out).write_text(
            "# Mixtures of experts: the planner's layouts\n\n" + __doc__.split("\n\n", 1)[1] + "\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
