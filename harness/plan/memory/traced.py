"""Activations of a model without transformer sizes, from a trace of one micro-batch on the
meta device (activation_trace.py): what the blocks and the rest save, plus the loss's gradient
buffers over the vocabulary that autograd does not save. Imports torch, so only a user's model
by import path pays for it."""

from __future__ import annotations

import torch

from harness.plan.memory.activation_trace import TraceError
from harness.plan.memory.activations import LOSS_GRADIENT_BYTES_PER_LOGIT, Activations
from harness.plan.model.model_shape import ModelShape

TRACE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def traced_activations(
    shape: ModelShape, *, micro_batch: int, seq_len: int, precision: str, mixed_precision: str, checkpointing: bool
) -> Activations | None:
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
