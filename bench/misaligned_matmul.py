"""Unfused attention's batched matmuls on this GPU at head dims that are and are not a multiple of 8:
what a head dim like BigScience's 108, 150, 225 or 450 costs cuBLAS in fp16 and bf16, beside the
aligned head dims next to it (the plan prices it from a third party's plain matmul sweeps, gemm.py's
MISALIGNED_SHARE: docs/planner.md, "Widths not a multiple of 8"; this checks them on Megatron's own calls).

Each point times Megatron-LM's unfused core attention's two matmuls as it calls them, forward and
backward: the scores, baddbmm of q [b·heads, s, d] by kᵀ [b·heads, d, s] (inner dimension d), and
the context, bmm of the probabilities [b·heads, s, s] by v [b·heads, s, d] (output width d), with q,
k and v strided views of one fused projection [s, b, heads, 3d] as Megatron's ParallelAttention
splits it (so their rows start every 3d elements, not 16-byte aligned where d is odd).

On a GPU machine: python bench/misaligned_matmul.py --out bench/results/misaligned_matmul_<gpu>.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import best_seconds, gpu_command, write_table  # noqa: E402

SEQ = 2048
HEADS = 8  # one GPU's heads of BigScience's TP 8 runs
HEAD_DIMS = (104, 108, 112, 144, 150, 152, 224, 225, 232, 448, 450, 456)
REPEATS = 5


def time_matmuls(head_dim: int, dtype: torch.dtype) -> float:
    """Seconds of the scores' and the context's matmuls, forward and backward, the best of REPEATS."""
    fused = torch.randn(SEQ, 1, HEADS, 3 * head_dim, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(HEADS, SEQ, head_dim, device="cuda", dtype=dtype)

    def once() -> None:
        q, k, v = (t.reshape(SEQ, HEADS, head_dim).transpose(0, 1) for t in fused.split(head_dim, dim=-1))
        scores = torch.baddbmm(
            torch.empty(HEADS, SEQ, SEQ, device="cuda", dtype=dtype), q, k.transpose(1, 2), beta=0.0, alpha=1.0
        )
        context = torch.bmm(scores, v)
        context.backward(grad)

    once()
    return best_seconds(once, REPEATS)


def main() -> int:
    out = gpu_command(__doc__.splitlines()[0], "misaligned_matmul.py")
    name = torch.cuda.get_device_name()
    lines = [
        f"# Unfused attention's matmuls by head dim on {name} (torch {torch.__version__})",
        "",
        f"Command: `python bench/misaligned_matmul.py`. {HEADS} heads, sequence {SEQ}, the scores' and the "
        "context's matmuls forward and backward (6 · 2·s²·d·heads FLOPs), TFLOP/s.",
        "",
        "| head dim | multiple of 8 | fp16 | bf16 |",
        "|---|---|---|---|",
    ]
    for head_dim in HEAD_DIMS:
        flops = 6 * 2 * SEQ * SEQ * head_dim * HEADS
        rates = [flops / time_matmuls(head_dim, dtype) / 1e12 for dtype in (torch.float16, torch.bfloat16)]
        aligned = "yes" if head_dim % 8 == 0 else "no"
        lines.append(f"| {head_dim} | {aligned} | {rates[0]:.0f} | {rates[1]:.0f} |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    write_table(lines, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
