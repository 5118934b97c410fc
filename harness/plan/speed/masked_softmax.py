"""Megatron's fused softmax as Megatron-DeepSpeed ran it from 9f5f5d4c (2021-10-21) to 1cb76a64
(2022-03-06), BigScience's BLOOM trials of February 2022 among its runs: where its fused kernel is
refused at the run's shape, the softmax runs op by op in fp32.

`FusedScaleMaskSoftmax.is_kernel_available` (bigscience-workshop/Megatron-DeepSpeed
megatron/model/fused_softmax.py @ ae6277f5) takes the fused kernel, for a causal mask, only where
the attention batches (micro-batch x heads a GPU) divide by the kernel's batches a block. It asks
for them as `self.get_batch_per_block(sq, sk, b, np)` of a method declared
`get_batch_per_block(b, np, sq, sk)`, which passes them on to the kernel's
`get_batch_per_block(query_seq_len, key_seq_len, batches, attn_heads)`
(megatron/fused_kernels/scaled_masked_softmax.h): the kernel's key length is the heads a GPU. So
the batches a block are those of a row of `heads` elements (`batches_per_block`), not of the
sequence: 32 at 8 heads a GPU, 16 at 9-16, 8 at 17-32; at 8 heads a GPU (64 heads over TP 8) a
micro-batch of 1 or 2 falls back, 4 takes the kernel. Megatron's start-up check
(megatron/initialize.py `_compile_dependencies`) asks only that the attention batches divide by 4,
so such a run neither aborts (`--abort-on-unmet-fused-kernel-constraints`) nor warns. 1cb76a64
("sync the whole Meg-LM fused_kernels sub-tree") declares the method in the order it is called.

The fallback (`forward_torch_softmax`) casts the fp16 scores to fp32, multiplies them by the
layer's scale (`apply_query_key_layer_scaling`, on by default), masks them in place
(`attention_mask_func`'s `masked_fill_`), takes the softmax and casts back: 36 bytes a score
element forward (2 + 4, 4 + 4, 4 + 4, 4 + 4, 4 + 2) and 40 in autograd's backward of the same five
ops. The plan's `math` rate (attention.py) is the FlashAttention README's "Pytorch" attention
(benchmarks/benchmark_flash_attention.py `attention_pytorch` @ 0251105a): fp16 scores, the causal
mask added and a softmax, 8 bytes a score element forward and the softmax's backward, 6. What the
fallback moves beyond that, over every score element of micro-batch x heads a GPU x seq x seq, at
the card's memory-bound rate (compute.py `memory_bytes_per_s`), is added to the attention: in each
forward (twice under full activation checkpointing) and in the backward.
"""

from __future__ import annotations

from dataclasses import replace

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import TransformerDims
from harness.plan.speed.compute import ComputeWork, memory_bytes_per_s

# A plan option: the run's attention is Megatron-DeepSpeed's FusedScaleMaskSoftmax of 9f5f5d4c to
# 1cb76a64, with the kernel's batches a block asked for in swapped order (a published row's token).
SWAPPED_SOFTMAX_CHECK = "swapped_softmax_check"
THREADS_PER_BLOCK = 128  # scaled_masked_softmax.h get_batch_per_block
WARP_SIZE = 32
MAX_FUSED_LENGTH = 2048  # is_kernel_available: 16 < sq <= 2048, sk <= 2048
TORCH_FORWARD_BYTES = 36  # float(), * scale, masked_fill_, softmax, half(): read + write a score element
TORCH_BACKWARD_BYTES = 40  # their backwards: 6 + 12 + 8 + 8 + 6
BENCHMARK_FORWARD_BYTES = 8  # attention_pytorch: the mask's add, the softmax (fp16)
BENCHMARK_BACKWARD_BYTES = 6  # the softmax's backward (the add's passes its gradient through)


def batches_per_block(key_length: int) -> int:
    """The fused kernel's attention rows a thread block, for rows of `key_length` elements
    (scaled_masked_softmax.h `get_batch_per_block`)."""
    power = 1
    while power < key_length:
        power *= 2
    warp = min(power, WARP_SIZE)
    per_warp = 2 if power <= 128 else 1
    return THREADS_PER_BLOCK // warp * per_warp


def fused_softmax_runs(micro_batch: int, heads: int, seq_len: int) -> bool:
    """Whether `is_kernel_available` takes the fused kernel for a causal mask over `micro_batch` x
    `heads` (a GPU's) attention batches of `seq_len`, its batches a block asked for with the heads
    as the key length (the module's account)."""
    batches = micro_batch * heads
    if not (16 < seq_len <= MAX_FUSED_LENGTH and seq_len % 4 == 0 and batches % 4 == 0):
        return False
    return batches % batches_per_block(heads) == 0


def with_torch_softmax(
    work: ComputeWork,
    dims: TransformerDims,
    gpu: GPUSpec,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int,
    checkpointing: str,
) -> ComputeWork:
    """`work` with every layer's softmax run op by op in fp32 where the fused kernel is refused (the
    module's account); as it was where the kernel runs."""
    heads = dims.heads // tp
    if fused_softmax_runs(micro_batch, heads, seq_len):
        return work
    elements = micro_batch * heads * seq_len * seq_len * dims.layers
    rate = memory_bytes_per_s(gpu)
    forward = elements * (TORCH_FORWARD_BYTES - BENCHMARK_FORWARD_BYTES) / rate
    backward = elements * (TORCH_BACKWARD_BYTES - BENCHMARK_BACKWARD_BYTES) / rate
    again = forward if checkpointing == "full" else 0.0
    return replace(
        work,
        attention_s=work.attention_s + forward + again + backward,
        recompute_s=work.recompute_s + again,
        forward_s=work.forward_s + forward,
    )
