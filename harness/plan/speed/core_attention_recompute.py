"""Megatron-LM's selective recomputation (`--recompute-granularity selective`, its default
`--recompute-modules core_attn`): each layer's core attention, the kernel between the q, k, v
projections and the output projection, runs under `tensor_parallel.checkpoint`
(megatron/core/transformer/attention.py, `checkpoint_core_attention` and
`_checkpointed_attention_forward`), so the forward keeps only its inputs, q, k and v, which the
kernel keeps anyway, and the backward runs the kernel's forward again before its backward. Nothing
else is recomputed: no matmul, no tensor-parallel collective (Korthikanti et al. 2022, arXiv
2205.05198, section 5).

Its time: one more attention forward a layer and micro-step, at the kernel's rate. Its memory
(activations.py): the kernel's own saved tensors beyond q, k, v are not kept, the log-sum-exp of
flash and fused kernels, the softmax of the unfused one, and one layer's are rebuilt in the
backward; the attention's output is kept all the same, as the output projection's saved input.
"""

from __future__ import annotations

from dataclasses import replace

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import TransformerDims
from harness.plan.speed.attention import FP8_KERNELS, causal_attention_flops, every_layer_attention_seconds
from harness.plan.speed.compute import ComputeWork


def with_core_attention_recomputed(
    work: ComputeWork,
    dims: TransformerDims,
    gpu: GPUSpec,
    kernel: str,
    precision: str,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int,
    fp8_attention: bool = False,
) -> ComputeWork:
    """`work` (planned without checkpointing) with each layer's attention forward run again."""
    again, _ = every_layer_attention_seconds(
        dims,
        gpu,
        FP8_KERNELS[kernel] if fp8_attention else kernel,
        precision,
        micro_batch=micro_batch,
        seq_len=seq_len,
        tp=tp,
    )
    return replace(work, attention_s=work.attention_s + again, recompute_s=work.recompute_s + again)


def recomputed_attention_flops(dims: TransformerDims, micro_batch: int, seq_len: int, tp: int) -> float:
    """FLOPs of the attention forwards run again in one micro-step on one GPU (a fixed-MFU plan)."""
    return dims.layers * causal_attention_flops(micro_batch, seq_len, dims.heads // tp, dims.attention_dim)
