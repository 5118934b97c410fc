"""Causal attention's forward+backward rate on this GPU, by sequence length and head dimension,
beside the rate the plan gives it (harness/plan/speed/attention.py): the check of the plan's
attention time at the sequence lengths of context-parallel runs, past the published tables' 16k.

Each point times torch's scaled_dot_product_attention (is_causal=True, bf16) forward and backward
over batch x seq = max(16k, seq) tokens at a hidden size of 2048 (the published benchmark's
shape), under each SDPA backend that takes it: the default choice, FlashAttention-2 (`flash`) and
cuDNN's (`cudnn`). Rates count the flops as the benchmark does: causal forward 2·b·s²·h·d, the
backward 2.5 forwards.

On a GPU machine: python bench/attention_kernels.py --out bench/results/attention_<gpu>.md
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import best_seconds, gpu_command, write_table  # noqa: E402
from harness.common.hardware import gpu_spec  # noqa: E402
from harness.plan.speed.attention import attention_tflops, causal_attention_flops  # noqa: E402

HIDDEN = 2048
TOKENS = 16384
SEQS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
HEAD_DIMS = (64, 128)
REPEATS = 3


def _backends() -> dict[str, list]:
    from torch.nn.attention import SDPBackend

    return {
        "default": [],
        "flash": [SDPBackend.FLASH_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
    }


def time_attention(seq: int, head_dim: int, backend: list) -> float | None:
    """Seconds of one causal forward+backward, the best of REPEATS; None where the backend refuses."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    heads, batch = HIDDEN // head_dim, max(1, TOKENS // seq)
    q, k, v = (
        torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)

    def once() -> None:
        with sdpa_kernel(backend) if backend else contextlib.nullcontext():
            out = scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    try:
        once()  # warm-up, and the backend's refusal if it has one
    except RuntimeError:
        return None
    return best_seconds(once, REPEATS)


def main() -> int:
    out = gpu_command(__doc__.splitlines()[0], "attention_kernels.py")
    name = torch.cuda.get_device_name()
    gpu = gpu_spec(name)
    lines = [
        f"# Causal attention forward+backward on {name} (torch {torch.__version__})",
        "",
        "Command: `python bench/attention_kernels.py`. TFLOP/s as the FlashAttention benchmark counts them "
        f"(hidden {HIDDEN}, batch x seq = max({TOKENS}, seq) tokens, bf16); `plan`: the rate "
        "harness/plan/speed/attention.py gives the `flash` kernel on this card.",
        "",
        "| head dim | seq | default | flash | cudnn | plan | plan / default |",
        "|---|---|---|---|---|---|---|",
    ]
    for head_dim in HEAD_DIMS:
        for seq in SEQS:
            batch, heads = max(1, TOKENS // seq), HIDDEN // head_dim
            flops = 3.5 * causal_attention_flops(batch, seq, heads, head_dim)
            rates = {}
            for label, backend in _backends().items():
                seconds = time_attention(seq, head_dim, backend)
                rates[label] = flops / seconds / 1e12 if seconds else None
                torch.cuda.empty_cache()
            planned = attention_tflops(gpu, "flash", head_dim, seq) if gpu else None
            cells = [f"{rates[k]:.0f}" if rates[k] else "refused" for k in ("default", "flash", "cudnn")]
            ratio = f"{planned / rates['default']:.2f}" if planned and rates["default"] else "-"
            row = f"| {head_dim} | {seq} | {' | '.join(cells)} | {planned:.0f} | {ratio} |" if planned else ""
            lines.append(row or f"| {head_dim} | {seq} | {' | '.join(cells)} | - | - |")
            print(lines[-1], flush=True)
    write_table(lines, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
