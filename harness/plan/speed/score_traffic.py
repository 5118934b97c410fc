"""Memory traffic over the unfused attention's scores: every score element of micro-batch x heads a GPU
x seq x seq a layer (the unfused kernels make the causal mask's half too), at the card's memory-bound
rate. Megatron's softmax as its kernel runs (masked_softmax.py), ALiBi's bias through the scores'
matmul (alibi_scores.py) and dropout over the probabilities (dropout.py) each add their bytes a score
element here: to each forward (again where activation checkpointing recomputes it) and to the backward."""

from __future__ import annotations

from dataclasses import replace

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import TransformerDims
from harness.plan.speed.compute import ComputeWork, memory_bytes_per_s


def score_elements(dims: TransformerDims, micro_batch: int, seq_len: int, tp: int) -> float:
    """Score elements of every layer's attention over a micro-batch on one of `tp` GPUs."""
    return micro_batch * (dims.heads // tp) * seq_len * seq_len * dims.layers


def with_score_traffic(
    work: ComputeWork,
    dims: TransformerDims,
    gpu: GPUSpec,
    *,
    forward_bytes: float,
    backward_bytes: float,
    micro_batch: int,
    seq_len: int,
    tp: int,
    recomputed: bool,
) -> ComputeWork:
    """`work` with `forward_bytes` and `backward_bytes` a score element added to its attention (negative
    where a kernel moves less than the rate holds); `recomputed`: the forward's again in the backward."""
    seconds = score_elements(dims, micro_batch, seq_len, tp) / memory_bytes_per_s(gpu)
    forward, backward = forward_bytes * seconds, backward_bytes * seconds
    again = forward if recomputed else 0.0
    return replace(
        work,
        attention_s=work.attention_s + forward + again + backward,
        recompute_s=work.recompute_s + again,
        forward_s=work.forward_s + forward,
    )
