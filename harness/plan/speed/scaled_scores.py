"""An unfused attention that scales its scores in a pass of their own and masks them with
`masked_fill` (a published row's `scaled_scores`): two more passes over its scores each forward and
backward than the `math` rate holds.

The `math` rate (attention.py) is the FlashAttention README's "Pytorch" attention
(Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py `attention_pytorch` @ 0251105a):
the scale is the scores' matmul's own (`torch.baddbmm(..., beta=0, alpha=softmax_scale)`), the causal
mask is added by a kernel of its own, whose backward passes the gradient through, then the softmax
(masked_softmax.py). DeepSpeed's ZeRO-3 example trainer (deepspeedai/DeepSpeed
examples/sdma_allgather/train_zero3.py @ 66af8f03, `CausalSelfAttention.forward`) computes
`(q @ k.transpose(-2, -1)) * scale`, then `attn.masked_fill(causal_mask == 0, -inf)`, then the
softmax, in eager PyTorch: the multiply reads and writes every score (2 + 2 bytes in bf16) each
forward, and its backward multiplies the scores' gradient by the scale (2 + 2); `masked_fill` moves
what the benchmark's add moves forward, but its backward is a kernel of its own (the gradient
`masked_fill`ed with 0: 2 + 2) where the add's is none. The boolean mask, seq x seq broadcast over
the heads, is read from the cache and not counted; nor is the `== 0` that builds it, seq x seq
elements a layer beside the scores' heads x seq x seq. The host issues two more kernels a layer each
way: the `== 0` and the multiply forward (`masked_fill` in the add's place), the multiply's and
`masked_fill`'s backward (host_issue.py).
"""

from __future__ import annotations

from harness.plan.speed.compute import Kernels

SCALED_SCORES = "scaled_scores"  # a plan option (a published row's token): the scale and mask as passes of their own
SCALED_SCORES_FORWARD_BYTES = 2 + 2  # the multiply by the scale; masked_fill moves what the benchmark's add moves
SCALED_SCORES_BACKWARD_BYTES = (2 + 2) + (2 + 2)  # the multiply's backward, masked_fill's backward
SCALED_SCORES_KERNELS = (2, 2)  # a layer's forward and backward kernels beyond the benchmark's


def scaled_scores_kernels(layers: int, recomputed: bool) -> Kernels:
    """The kernels beyond the `math` attention's in every layer's forward, backward and, under full
    activation checkpointing, its forward again."""
    forward, backward = SCALED_SCORES_KERNELS
    return Kernels(forward * layers, backward * layers, forward * layers if recomputed else 0)
