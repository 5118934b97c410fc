#!/usr/bin/env python3
"""The planner's matmul model (harness/plan/speed/gemm.py) on the B200 against OpenXLA's measured sm_100
table (bench/data/xla_sm100_matmul.csv: bf16 and fp8 e4m3 matmuls, m, n, k from 1,024 to 4,096): each
shape's modelled rate for a lone kernel (no sustained share: the table times kernels, not training steps)
over the measured one, and the median by precision and by m.

    python bench/xla_sm100_check.py

No torch, on the CPU. Nothing of the planner is set from this table: it checks the model at the shapes a
mixture of experts' experts run on Blackwell (m = 1,024-4,096 tokens a local expert).
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.common.hardware import GPUS  # noqa: E402
from harness.plan.speed.gemm import gemm_tflops  # noqa: E402

TABLE = ROOT / "bench" / "data" / "xla_sm100_matmul.csv"
PRECISIONS = {"bf16": "tflops_bf16", "fp8": "tflops_fp8"}


def ratios(card: str = "B200") -> list[tuple[str, int, int, int, float]]:
    """(precision, m, n, k, modelled over measured) for every row of the table."""
    gpu = GPUS[card]
    with TABLE.open(newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out = []
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        for precision, column in PRECISIONS.items():
            modelled = gemm_tflops(m, n, k, gpu, precision, sustained=1.0)
            out.append((precision, m, n, k, modelled / float(r[column])))
    return out


def main() -> int:
    found = ratios()
    print("| precision | m | shapes | median modelled / measured | range |")
    print("|---|---:|---:|---:|---|")
    for precision in PRECISIONS:
        for m in sorted({row[1] for row in found}):
            cell = [row[4] for row in found if row[0] == precision and row[1] == m]
            print(
                f"| {precision} | {m} | {len(cell)} | {statistics.median(cell):.3f} | {min(cell):.3f}-{max(cell):.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
