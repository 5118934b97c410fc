"""Dropout where a run trains with it: what it moves through memory and launches, beyond the
model without it.

Megatron-LM and its forks default to dropout 0.1 on the attention's probabilities and on each
block's two branch outputs (`--attention-dropout`, `--hidden-dropout` in megatron/arguments.py;
bigscience-workshop/Megatron-DeepSpeed @ ae6277f5 alike), as GPT-2's configs do (`attn_pdrop`,
`resid_pdrop`); Llama-style recipes train without it. Its cost does not depend on the probability,
only on whether it is drawn at all.

Attention dropout (`attention_dropout` > 0):
  unfused attention  (`math`, `fused_softmax`) torch's `native_dropout` over the softmax's output,
                    micro-batch x heads x seq^2 score elements a layer (the unfused kernels make
                    every score, the causal mask's too): forward reads the probabilities (2 bytes) and writes them
                    dropped (2) and the bool mask (1); backward (`native_dropout_backward`) reads
                    the gradient (2) and the mask (1) and writes the gradient (2)
                    (aten/src/ATen/native/cuda/Dropout.cu: `fused_dropout_kernel`, `masked_scale`).
                    One kernel each way. The 16-bit sizes are the compute dtype's.
  fused into the softmax  OneFlow's GPT (`scale_tril_softmax_dropout_fusion`, on by default) and a
                    compiled model: the softmax's kernel writes the dropped probabilities and the mask
                    beside its output (3 bytes an element forward) and its backward reads the mask
                    (1), no kernel of its own
  fused kernels     FlashAttention's and cuDNN's draw the mask inside the kernel from a Philox
                    seed, forward and again backward, and store nothing: their slowdown is not in
                    the kernels' published rates and no cited rate gives it, so none is counted.
Hidden dropout (`hidden_dropout` > 0), at each block's two branch outputs, over micro-batch x seq x
width elements (on the sequence shard under sequence parallelism):
  eager             an `nn.Dropout` of its own: forward reads the branch's output, writes it dropped
                    and the bool mask; backward reads the gradient and the mask, writes the
                    gradient (the same 5 and 5 bytes in the compute dtype), one kernel each way
  fused             Megatron-LM's fused bias-dropout-add (megatron/model/fused_bias_dropout.py, a
                    TorchScript fusion), OneFlow's (`bias_dropout_fusion`) and a compiled model
                    (Inductor's lowering of the dropout into the add's kernel) write the bool mask
                    beside the sum and read it back in the backward: a byte each way, no kernel of
                    its own
Activation checkpointing draws a recomputed block's dropout again: full checkpointing (and
Megatron-LM's recomputation of the core attention, for the attention's) repeat the forward's bytes.
What the masks keep in memory is activations.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import TransformerDims
from harness.plan.speed.attention import UNFUSED
from harness.plan.speed.compute import ComputeWork, Kernels, memory_bytes_per_s
from harness.plan.speed.score_traffic import with_score_traffic

MASK_BYTES = 1  # torch's dropout mask is a bool tensor


def eager_dropout_bytes(element: int) -> tuple[int, int]:
    """(forward, backward) bytes an eager dropout moves per element of `element` bytes."""
    return element + element + MASK_BYTES, element + MASK_BYTES + element


FUSED_DROPOUT_BYTES = (MASK_BYTES, MASK_BYTES)  # the mask written beside the fused add, read back
HIDDEN_SITES = 2  # after the attention's output projection and after the MLP
# A plan option (a published row's token): OneFlow's softmax kernel draws the attention's dropout (above).
SOFTMAX_DROPOUT_FUSION = "softmax_dropout_fusion"


def softmax_fused_dropout_bytes(element: int) -> tuple[int, int]:
    """(forward, backward) bytes a dropout fused into the softmax adds per score element of `element`
    bytes: the dropped probabilities and the mask written, the mask read back."""
    return element + MASK_BYTES, MASK_BYTES


@dataclass(frozen=True)
class Dropout:
    """Which dropouts a run draws, and how its kernels run them."""

    attention: bool  # on the attention's probabilities
    hidden: bool  # on each block's two branch outputs
    hidden_fused: bool  # into the add: Megatron-LM's fused bias-dropout-add, OneFlow's, a compiled model
    attention_fused: bool  # into the unfused kernel's softmax: OneFlow's, a compiled model

    @property
    def any(self) -> bool:
        return self.attention or self.hidden

    def attention_drawn(self, kernel: str) -> bool:
        """Whether the attention's dropout moves bytes of its own (the unfused kernel's: fused
        attention kernels draw it inside)."""
        return self.attention and kernel in UNFUSED


def _hidden_elements(dims: TransformerDims, tokens: int, tp: int, sequence_parallel: bool) -> float:
    return HIDDEN_SITES * tokens * dims.width * dims.layers / (tp if sequence_parallel else 1)


def with_dropout(
    work: ComputeWork,
    dims: TransformerDims,
    gpu: GPUSpec,
    dropout: Dropout,
    *,
    kernel: str,
    element_bytes: int,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    recompute_block: bool,
    recompute_attention: bool,
) -> ComputeWork:
    """`work` with the dropouts' bytes added at the card's memory-bound rate (the module's account):
    the attention's to the attention, the hidden ones' to the elementwise work; `recompute_block`:
    full checkpointing draws every block's again, `recompute_attention`: the core attention's is drawn
    again (Megatron-LM's selective recomputation)."""
    if dropout.attention_drawn(kernel):
        drawn = softmax_fused_dropout_bytes if dropout.attention_fused else eager_dropout_bytes
        forward, backward = drawn(element_bytes)
        work = with_score_traffic(
            work,
            dims,
            gpu,
            forward_bytes=forward,
            backward_bytes=backward,
            micro_batch=micro_batch,
            seq_len=seq_len,
            tp=tp,
            recomputed=recompute_block or recompute_attention,
        )
    if not dropout.hidden:
        return work
    forward, backward = FUSED_DROPOUT_BYTES if dropout.hidden_fused else eager_dropout_bytes(element_bytes)
    seconds = _hidden_elements(dims, micro_batch * seq_len, tp, sequence_parallel) / memory_bytes_per_s(gpu)
    again = forward * seconds if recompute_block else 0.0
    return replace(
        work,
        elementwise_s=work.elementwise_s + (forward + backward) * seconds + again,
        recompute_s=work.recompute_s + again,
        forward_s=work.forward_s + forward * seconds,
    )


def dropout_kernels(dims: TransformerDims, dropout: Dropout, kernel: str, checkpointing: str) -> Kernels:
    """The kernels a micro-step's dropouts launch on their own (the module's account): an eager
    dropout one each way, a fused one none."""
    per_layer = (1 if dropout.attention_drawn(kernel) and not dropout.attention_fused else 0) + (
        HIDDEN_SITES if dropout.hidden and not dropout.hidden_fused else 0
    )
    layers = dims.layers * per_layer
    return Kernels(layers, layers, layers if checkpointing == "full" else 0)
