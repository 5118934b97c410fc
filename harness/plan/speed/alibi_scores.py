"""Megatron-DeepSpeed's ALiBi (`--position-embedding-type alibi`, BigScience's BLOOM and its trials: a
published row's `alibi`): the bias enters the attention's scores through the batched matmul's
input, which costs the unfused attention two more passes over its scores each forward.

`ParallelAttention.forward` (bigscience-workshop/Megatron-DeepSpeed megatron/model/transformer.py @
ae6277f5) computes the scores as `torch.baddbmm(matmul_result, q, kᵀ, beta=beta, alpha=1/norm)` with
`matmul_result` the ALiBi tensor, one row of `seq` biases a head broadcast over the queries
(`_build_alibi_tensor`: micro-batch x heads a GPU, 1, seq), and `beta` = 1 / the layer's number
(`apply_query_key_layer_scaling`, on by default; 1 without it): never 0. Without ALiBi `beta` is 0.
torch's CUDA baddbmm (aten/src/ATen/native/cuda/Blas.cpp `baddbmm_out_cuda_impl`) copies the input,
expanded to every query, into the result when beta is not 0, and cuBLAS then reads that result as its
C: 2 bytes a score element written and 2 read (fp16), which the `fused_softmax` and `math` rates (the
scores' matmul with beta 0) do not hold. ALIBI_SCORE_BYTES over micro-batch x heads a GPU x seq^2 each
layer, at the memory-bound rate, in each forward (twice under full activation checkpointing); the
backward has no gradient to give the constant bias.
"""

from __future__ import annotations

from dataclasses import replace

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import TransformerDims
from harness.plan.speed.compute import ComputeWork, memory_bytes_per_s

ALIBI = "alibi"  # a plan option (a published row's token): Megatron-DeepSpeed's ALiBi through baddbmm's beta
ALIBI_SCORE_BYTES = 2 + 2  # the expanded bias written into the scores, then read as cuBLAS's C


def with_alibi_scores(
    work: ComputeWork,
    dims: TransformerDims,
    gpu: GPUSpec,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int,
    checkpointing: str,
) -> ComputeWork:
    """`work` with the ALiBi bias's copy and read added to every layer's scores (the module's account)."""
    elements = micro_batch * (dims.heads // tp) * seq_len * seq_len * dims.layers
    forward = elements * ALIBI_SCORE_BYTES / memory_bytes_per_s(gpu)
    again = forward if checkpointing == "full" else 0.0
    return replace(
        work,
        attention_s=work.attention_s + forward + again,
        recompute_s=work.recompute_s + again,
        forward_s=work.forward_s + forward,
    )
