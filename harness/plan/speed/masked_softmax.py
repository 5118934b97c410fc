"""Megatron-LM's fused softmax (`attention=fused_softmax`: FusedScaleMaskSoftmax between the unfused
attention's two batched matmuls), as its check takes or refuses the kernel: what the softmax moves
through memory beside the `math` rate, which holds PyTorch's two kernels.

The plan's `math` rate (attention.py) is the FlashAttention README's "Pytorch" attention
(benchmarks/benchmark_flash_attention.py `attention_pytorch` @ 0251105a): fp16 scores, the causal
mask added by a kernel of its own (reads and writes a score: 4 bytes), then a softmax (4 bytes):
BENCHMARK_FORWARD_BYTES a score element forward, the softmax's backward 6 (the add passes its
gradient through). Megatron's fused kernel (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h,
`scaled_upper_triang_masked_softmax_warp_forward`) scales, masks and normalises a row in registers: it
reads the scores and writes the probabilities once, 4 bytes forward, and its backward reads the
probabilities and their gradient and writes the scores' gradient, 6, as the benchmark's softmax does.
So where the kernel runs, 4 bytes a score element forward are taken off the `math` rate's time, in
each forward (twice under full activation checkpointing).

`FusedScaleMaskSoftmax.is_kernel_available` takes the kernel, for a causal mask, where the
attention batches (micro-batch x heads a GPU) divide by 4 and by the kernel's batches a block, and
the keys are 16 < sk <= MAX_FUSED_LENGTH (megatron/core/fusions/fused_softmax.py: 4096; 2048 in the
Megatron-DeepSpeed and Megatron-LM of 2021). The batches a block are those of a row of `sk` elements
(`get_batch_per_block` in scaled_masked_softmax.h): 4 at 2048 and 4096. Where it refuses, the
softmax runs op by op in fp32 (`forward_torch_softmax`): the fp16 scores cast to fp32, multiplied by
the layer's scale (`apply_query_key_layer_scaling`, on by default), masked in place
(`attention_mask_func`'s `masked_fill_`), the softmax, the cast back: 36 bytes a score element
forward (2 + 4, 4 + 4, 4 + 4, 4 + 4, 4 + 2) and 40 in autograd's backward of the same five ops, five
kernels each way where the fused kernel is one (the host issues four more each way).

Megatron-DeepSpeed from 9f5f5d4c (2021-10-21) to 1cb76a64 (2022-03-06), BigScience's runs of those
months among them (a published row's `swapped_softmax_check`), asks for the batches a block in
swapped order: `self.get_batch_per_block(sq, sk, b, np)` of a method declared
`get_batch_per_block(b, np, sq, sk)` (megatron/model/fused_softmax.py @ ae6277f5), which passes them
on to the kernel's `get_batch_per_block(query_seq_len, key_seq_len, batches, attn_heads)`: the
kernel's key length is the heads a GPU. So its batches a block are those of a row of `heads` elements
(`batches_per_block`): 32 at 8 heads a GPU, 16 at 9-16, 8 at 17-32; at 8 heads a GPU (64 heads over
TP 8) a micro-batch of 1 or 2 falls back, 4 takes the kernel. Megatron's start-up check
(megatron/initialize.py `_compile_dependencies`) asks only that the attention batches divide by 4,
so such a run neither aborts (`--abort-on-unmet-fused-kernel-constraints`) nor warns. 1cb76a64
("sync the whole Meg-LM fused_kernels sub-tree") declares the method in the order it is called.

Every score element is counted, the kernel and the fallback both passing over the masked half
(score_traffic.py).
"""

from __future__ import annotations

FUSED_SOFTMAX = "fused_softmax"  # the attention kernel this module prices (attention.py)
# A plan option: the run's attention is Megatron-DeepSpeed's FusedScaleMaskSoftmax of 9f5f5d4c to
# 1cb76a64, with the kernel's batches a block asked for in swapped order (a published row's token).
SWAPPED_SOFTMAX_CHECK = "swapped_softmax_check"
THREADS_PER_BLOCK = 128  # scaled_masked_softmax.h get_batch_per_block
WARP_SIZE = 32
MAX_FUSED_LENGTH = 4096  # is_kernel_available: 16 < sk <= 4096 (megatron/core/fusions/fused_softmax.py)
SWAPPED_MAX_FUSED_LENGTH = 2048  # the same check in Megatron-DeepSpeed @ ae6277f5
MIN_FUSED_LENGTH = 16
BATCHES_MULTIPLE = 4  # attn_batches % 4 == 0
FUSED_FORWARD_BYTES = 4  # the kernel: the scores read, the probabilities written
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


def fused_softmax_runs(micro_batch: int, heads: int, seq_len: int, swapped: bool = False) -> bool:
    """Whether `is_kernel_available` takes the fused kernel for a causal mask over `micro_batch` x
    `heads` (a GPU's) attention batches of `seq_len`; `swapped`: its batches a block asked for with the
    heads as the key length, the shorter limit of those versions (the module's account)."""
    batches = micro_batch * heads
    limit = SWAPPED_MAX_FUSED_LENGTH if swapped else MAX_FUSED_LENGTH
    if not (MIN_FUSED_LENGTH < seq_len <= limit and seq_len % 4 == 0 and batches % BATCHES_MULTIPLE == 0):
        return False
    return batches % batches_per_block(heads if swapped else seq_len) == 0


# The op-by-op softmax's kernels beyond the fused kernel's one, forward and backward: the five ops
# above (the cast up, the scale, the mask, the softmax, the cast back) and their five backwards.
FALLBACK_EXTRA_KERNELS = (4, 4)


def fused_softmax_kernels(micro_batch: int, heads: int, seq_len: int, swapped: bool = False) -> tuple[int, int]:
    """(forward, backward) kernels a layer's FusedScaleMaskSoftmax launches beyond its fused kernel's
    one: none where `is_kernel_available` takes it, FALLBACK_EXTRA_KERNELS where it refuses."""
    return (0, 0) if fused_softmax_runs(micro_batch, heads, seq_len, swapped) else FALLBACK_EXTRA_KERNELS


def fused_softmax_bytes(micro_batch: int, heads: int, seq_len: int, swapped: bool = False) -> tuple[int, int]:
    """(forward, backward) bytes a score element Megatron's FusedScaleMaskSoftmax moves beyond the `math`
    rate's softmax over `micro_batch` x `heads` (a GPU's) batches of `seq_len`: its kernel's where
    `is_kernel_available` takes it, the fp32 op-by-op softmax's where it refuses (the module's account)."""
    if fused_softmax_runs(micro_batch, heads, seq_len, swapped):
        forward, backward = FUSED_FORWARD_BYTES, BENCHMARK_BACKWARD_BYTES
    else:
        forward, backward = TORCH_FORWARD_BYTES, TORCH_BACKWARD_BYTES
    return forward - BENCHMARK_FORWARD_BYTES, backward - BENCHMARK_BACKWARD_BYTES
