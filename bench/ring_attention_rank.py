"""One rank's share of load-balanced ring attention, timed on one GPU, beside what the plan gives
it (harness/plan/parallel/context_parallel_cost.py): the compute side of torch's
`context_parallel`, whose communication needs two or more GPUs.

Each sequence is cut into 2·cp chunks and rank r holds chunks r and 2·cp-1-r (the head-tail
order torchtitan's and Megatron's CP use). The forward runs cp rounds, as torch's
`_templated_ring_attention` does: round 0 is causal attention over the rank's own two chunks;
a round whose k, v come from an earlier rank attends all of q to that rank's first chunk; one
whose k, v come from a later rank attends q's second chunk to both of its chunks. Each round's
output is merged into the running output in fp32 by its log-sum-exp (torch's `_SDPAMerger`). The
backward is autograd's through the same rounds and merges. The k, v each round needs are sliced
from tensors already on this GPU, so the time is the rank's kernels and merges with every ring
pass hidden, the best a ring can do.

Timed for the last rank (every rank does the same work) at a Llama 3 8B's attention (32 heads of
128, k and v repeated to 32 heads as torchtitan's model does before SDPA, batch 1), under
FlashAttention-2 (`SDPBackend.FLASH_ATTENTION`'s op). `plan` is the plan's time for the same
work: 1/cp of the whole sequence's causal forward+backward at the `flash` rate for its length.

On a GPU machine: python bench/ring_attention_rank.py --out bench/results/ring_attention_<gpu>.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import best_seconds, gpu_command, write_table  # noqa: E402
from harness.common.hardware import gpu_spec  # noqa: E402
from harness.plan.speed.attention import attention_seconds  # noqa: E402

HEADS, HEAD_DIM = 32, 128
POINTS = ((32768, 1), (65536, 2), (131072, 4), (262144, 8))  # torchtitan's 8B CP runs
REPEATS = 2


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp) of the flash kernel SDPA runs, with autograd through the output."""
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    else:  # the CPU's, so that tests/bench/test_ring_attention.py checks the schedule without a GPU
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse.detach()


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor):
    """Two partial attentions over disjoint keys made one, in fp32, as torch's ring merges them."""
    block_lse = block_lse.unsqueeze(-1).float()
    merged = out - torch.sigmoid(block_lse - lse) * (out - block_out.float())
    return merged, lse - F.logsigmoid(lse - block_lse)


def rank_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, cp: int) -> torch.Tensor:
    """Rank `rank`'s output of causal attention over the whole sequence, whose k and v for every
    rank's two chunks `k` and `v` hold (b, h, 2·cp·c, d), its own q being (b, h, 2c, d)."""
    c = q.shape[2] // 2

    def chunks_of(source: int) -> tuple[slice, slice]:
        return slice(source * c, (source + 1) * c), slice((2 * cp - 1 - source) * c, (2 * cp - source) * c)

    first, second = chunks_of(rank)
    own_k, own_v = torch.cat([k[:, :, first], k[:, :, second]], 2), torch.cat([v[:, :, first], v[:, :, second]], 2)
    block, block_lse = _flash(q, own_k, own_v, True)
    out, lse = block.float(), block_lse.unsqueeze(-1).float()
    for step in range(1, cp):
        source = (rank - step) % cp  # the ring brings the k, v of rank - step
        head, tail = chunks_of(source)
        if source < rank:  # all of q after that rank's first chunk
            block, block_lse = _flash(q, k[:, :, head], v[:, :, head], False)
            out, lse = _merge(out, lse, block, block_lse)
        else:  # only q's second chunk comes after that rank's two
            kv = torch.cat([k[:, :, head], k[:, :, tail]], 2), torch.cat([v[:, :, head], v[:, :, tail]], 2)
            block, block_lse = _flash(q[:, :, c:], *kv, False)
            later_out, later_lse = _merge(out[:, :, c:], lse[:, :, c:], block, block_lse)
            out, lse = torch.cat([out[:, :, :c], later_out], 2), torch.cat([lse[:, :, :c], later_lse], 2)
    return out.to(q.dtype)


def time_rank(seq: int, cp: int) -> float:
    """Seconds of the last rank's forward+backward on the GPU, the best of REPEATS after a warm-up."""
    c = seq // (2 * cp)
    q = torch.randn(1, HEADS, 2 * c, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(1, HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)
    )
    grad = torch.randn(1, HEADS, 2 * c, HEAD_DIM, device="cuda", dtype=torch.bfloat16)

    def once() -> None:
        rank_attention(q, k, v, cp - 1, cp).backward(grad)

    once()
    return best_seconds(once, REPEATS)


def main() -> int:
    out = gpu_command(__doc__.splitlines()[0], "ring_attention_rank.py")
    name = torch.cuda.get_device_name()
    gpu = gpu_spec(name)
    lines = [
        f"# One rank of load-balanced ring attention on {name} (torch {torch.__version__})",
        "",
        "Command: `python bench/ring_attention_rank.py`. A Llama 3 8B's attention (32 heads of 128, "
        "batch 1, bf16, FlashAttention-2), one layer's forward+backward on the last rank, every ring "
        "pass hidden; `plan`: 1/cp of the whole sequence's causal attention at the plan's `flash` rate.",
        "",
        "| seq | cp | measured s | plan s | plan / measured |",
        "|---|---|---|---|---|",
    ]
    for seq, cp in POINTS:
        measured = time_rank(seq, cp)
        torch.cuda.empty_cache()
        planned = None
        if gpu:
            forward, backward = attention_seconds(
                gpu, "flash", "bf16", batch=1, seq=seq, heads=HEADS, head_dim=HEAD_DIM
            )
            planned = (forward + backward) / cp
        plan_cells = f"{planned:.3f} | {planned / measured:.2f}" if planned else "- | -"
        lines.append(f"| {seq} | {cp} | {measured:.3f} | {plan_cells} |")
        print(lines[-1], flush=True)
    write_table(lines, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
