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
scores' matmul with beta 0) do not hold: ALIBI_SCORE_BYTES a score element in each forward (again
under full activation checkpointing; score_traffic.py); the backward has no gradient to give the
constant bias.
"""

from __future__ import annotations

ALIBI = "alibi"  # a plan option (a published row's token): Megatron-DeepSpeed's ALiBi through baddbmm's beta
ALIBI_SCORE_BYTES = 2 + 2  # the expanded bias written into the scores, then read as cuBLAS's C
