#!/usr/bin/env python3
"""A card's measured kernel table (bench/kernel_table.py's JSON) beside the planner's model without
it: the host's time per kernel against host_issue.py's rates, the memory-bound share against
compute.py's, each matmul against gemm.py's roofline (as a lone kernel: sustained 1) grouped by its
flops, and each attention point against attention.py's published rates. What a table would change
in every plan on the card, before it is put where the planner reads it.

    python bench/kernel_table_vs_plan.py harness/plan/speed/kernel_tables/H200.json
    python bench/kernel_table_vs_plan.py bench/results/kernel_table_h200.json --card H200 \
        > bench/results/kernel_table_h200.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.common.hardware import GPUS  # noqa: E402
from harness.plan.speed.attention import attention_tflops  # noqa: E402
from harness.plan.speed.compute import MEMORY_EFFICIENCY  # noqa: E402
from harness.plan.speed.gemm import _modelled  # noqa: E402
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL  # noqa: E402


def matmul_rows(matmuls: list[list[float]], card: str) -> list[str]:
    """Measured over modelled time by flops, two octaves a row."""
    gpu = GPUS[card]
    ratios: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for m, n, k, seconds in matmuls:
        flops = 2 * m * n * k
        ratios[int(math.log2(flops)) // 2 * 2].append((seconds / _modelled(m, n, k, gpu, "bf16", 1, 1.0), seconds))
    rows = [
        "| flops | matmuls | measured / modelled, median | min | max | measured time, median |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for octave in sorted(ratios):
        r = [x for x, _ in ratios[octave]]
        us = statistics.median(s for _, s in ratios[octave]) * 1e6
        rows.append(
            f"| 2^{octave}-2^{octave + 2} | {len(r)} | {statistics.median(r):.3f} | {min(r):.3f} | {max(r):.3f} "
            f"| {us:,.1f} us |"
        )
    return rows


def attention_rows(attention: dict[str, list[list[float]]], card: str) -> list[str]:
    gpu = GPUS[card]
    rows = [
        "| kernel | sequence | head dim | measured TFLOP/s | planned | measured / planned |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kernel, points in sorted(attention.items()):
        for seq, dim, tflops in points:
            try:
                planned = attention_tflops(gpu, kernel, int(dim), seq)
            except ValueError:
                continue
            rows.append(
                f"| {kernel} | {seq:,.0f} | {dim:.0f} | {tflops:.0f} | {planned:.0f} | {tflops / planned:.2f} |"
            )
    return rows


def report(table: dict, card: str) -> str:
    host = table["host_s_per_kernel"]
    lines = [
        f"Table: {table.get('source', '?')}",
        "",
        "| host time per kernel | measured | planner's rate without a table |",
        "|---|---:|---:|",
        *(
            f"| {kind} | {host[kind] * 1e6:.1f} us | {HOST_S_PER_KERNEL[kind] * 1e6:.1f} us |"
            for kind in ("eager", "compiled")
        ),
        "",
        f"Memory-bound kernels: {table['memory_efficiency']:.3f} of the data sheet's bandwidth measured, "
        f"{MEMORY_EFFICIENCY:.3f} planned without a table.",
        "",
        "Matmuls (bf16):",
        "",
        *matmul_rows(table["matmuls"], card),
        "",
        "Attention (causal, forward and backward):",
        "",
        *attention_rows(table.get("attention", {}), card),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path, help="a kernel table JSON")
    parser.add_argument("--card", help="the card's gpu= key (default: the table's file name)")
    args = parser.parse_args(argv)
    card = args.card or args.table.stem
    if card not in GPUS:
        parser.error(f"unknown card {card!r}: give --card, one of {', '.join(GPUS)}")
    try:
        table = json.loads(args.table.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"{args.table}: cannot read a kernel table ({exc})")
    sys.stdout.write(report(table, card))
    return 0


if __name__ == "__main__":
    sys.exit(main())
