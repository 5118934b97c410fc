"""Activation memory of one micro-batch, counted from the layer shapes: every tensor autograd
saves for backward, at the moment backward starts (when they are all alive).

Per token and block of width h, MLP width f, query width q = heads·head_dim and key/value
width k = kv_heads·head_dim (GPT-2: f = 4h, q = k = h):
  norms:                 LayerNorm keeps its input (residual dtype); RMSNorm as transformers
                         writes it computes in fp32 and keeps that fp32 input plus the
                         normalised tensor in the residual dtype
  matmul dtype:          attention input h (autocast: one bf16 copy per projection reading it),
                         q + 2k kept by SDPA, its output q (the same storage the output
                         projection reads: SDPA lays it out as (B, T, heads, head_dim), so the
                         transpose back is free), MLP input h, and 2f (GELU: its input and
                         output) or 4f (SwiGLU: gate, up, SiLU output, product)
  fp32:                  SDPA's log-sum-exp (4 bytes per head), each norm's statistics
                         (LayerNorm: mean and 1/std, 8 bytes; RMSNorm: 1/rms, 4 bytes)
SDPA's flash and memory-efficient kernels (what SDPA picks on a GPU, and its CPU flash
kernel) keep no T x T scores. The loss adds 12 bytes per token per vocabulary entry at the
start of backward: the fp32 log-softmax output, its incoming gradient and the gradient it
makes. Under autocast the residual stream stays fp32 (the embeddings' dtype) and matmuls run
in bf16; FSDP's policy and DeepSpeed run everything in the low precision. With activation
checkpointing each block keeps only its input and one block's activations are rebuilt at a
time. tests/plan/test_plan.py checks the saved-tensor part against autograd's own saved tensors.

A model with no transformer sizes (a user's model) has its activations traced instead
(activation_trace.py): the same accounting, measured rather than counted from shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.plan.activation_trace import TraceError
from harness.plan.model_shape import ModelShape, TransformerDims
from harness.plan.model_states import BYTES

LOSS_BYTES_PER_LOGIT = 12
# Of those, the log-softmax's incoming gradient and the one it makes (fp32): made in backward,
# never saved, so a trace of the forward does not see them.
LOSS_GRADIENT_BYTES_PER_LOGIT = 8
LOGSUMEXP_BYTES = 4
NORM_STATS_BYTES = {False: 8, True: 4}  # per token: LayerNorm's mean and 1/std; RMSNorm's 1/rms (fp32)


@dataclass(frozen=True)
class Activations:
    """Bytes per GPU of one micro-batch's activations, alive at the start of backward."""

    blocks: int  # what the transformer blocks keep for backward (checkpointed: only their inputs)
    head: int  # final norm, head input and the loss's fp32 buffers over the vocabulary
    rebuilt: int = 0  # checkpointed: one block rebuilt in backward, less the loss buffers freed by then

    @property
    def total(self) -> int:
        return self.blocks + self.head + self.rebuilt


def _dtypes(precision: str, mixed_precision: str) -> tuple[int, int]:
    """(residual-stream bytes, matmul bytes) per element."""
    if precision == "fp32":
        return 4, 4
    low = BYTES[precision]
    return (4, low) if mixed_precision == "autocast" else (low, low)


def norm_bytes_per_token(dims: TransformerDims, residual: int) -> int:
    if dims.rms_norm:
        return dims.width * (4 + residual) + NORM_STATS_BYTES[True]
    return dims.width * residual + NORM_STATS_BYTES[False]


def block_bytes_per_token(dims: TransformerDims, precision: str, mixed_precision: str) -> int:
    """What one block saves for backward, per token."""
    residual, matmul = _dtypes(precision, mixed_precision)
    h, f = dims.width, dims.ffn_width
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    autocast_copies = precision != "fp32" and mixed_precision == "autocast"
    attention_inputs = 1 if dims.fused_qkv or not autocast_copies else 3
    mlp_inputs = 2 if dims.gated_mlp and autocast_copies else 1
    matmul_elements = (
        attention_inputs * h
        + (q + 2 * kv)
        + q  # projections' input, q/k/v, SDPA output (= output projection input)
        + mlp_inputs * h
        + (4 if dims.gated_mlp else 2) * f
    )
    return 2 * norm_bytes_per_token(dims, residual) + matmul_elements * matmul + dims.heads * LOGSUMEXP_BYTES


def head_bytes_per_token(dims: TransformerDims, precision: str, mixed_precision: str) -> int:
    residual, matmul = _dtypes(precision, mixed_precision)
    return norm_bytes_per_token(dims, residual) + dims.width * matmul + LOSS_BYTES_PER_LOGIT * dims.vocab


def activations(
    shape: ModelShape, *, micro_batch: int, seq_len: int, precision: str, mixed_precision: str, checkpointing: bool
) -> Activations | None:
    """One micro-batch's activations on one GPU; None where they are unknown (a model neither
    a known transformer nor traceable on the meta device: shape.note says which)."""
    dims = shape.dims
    if dims is None:
        return _traced(
            shape,
            micro_batch=micro_batch,
            seq_len=seq_len,
            precision=precision,
            mixed_precision=mixed_precision,
            checkpointing=checkpointing,
        )
    tokens = micro_batch * seq_len
    block = block_bytes_per_token(dims, precision, mixed_precision) * tokens
    head = head_bytes_per_token(dims, precision, mixed_precision) * tokens
    if checkpointing:
        residual, _ = _dtypes(precision, mixed_precision)
        kept_inputs = dims.layers * dims.width * residual * tokens
        # The head's loss buffers are freed before the first block is rebuilt.
        return Activations(blocks=kept_inputs, head=head, rebuilt=max(0, block - head))
    return Activations(blocks=dims.layers * block, head=head)


TRACE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _traced(
    shape: ModelShape, *, micro_batch: int, seq_len: int, precision: str, mixed_precision: str, checkpointing: bool
) -> Activations | None:
    """The same accounting as the formulas, from a trace: what the blocks and the rest save,
    plus the loss's gradient buffers over the vocabulary that autograd does not save."""
    if shape.tracer is None:
        return None
    # Only a backend that casts the whole model runs the trace's ops in the low precision.
    low = precision != "fp32" and mixed_precision == "low_precision"
    try:
        traced = shape.tracer.trace(micro_batch, seq_len, TRACE_DTYPES[precision] if low else torch.float32)
    except TraceError:
        return None
    vocab = shape.tracer.vocab or 0
    head = traced.rest + LOSS_GRADIENT_BYTES_PER_LOGIT * micro_batch * seq_len * vocab
    if checkpointing and traced.blocks:
        # The head's loss buffers are freed before the first block is rebuilt.
        return Activations(blocks=sum(traced.block_inputs), head=head, rebuilt=max(0, max(traced.blocks) - head))
    return Activations(blocks=sum(traced.blocks), head=head)
