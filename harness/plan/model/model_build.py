"""The shape of a model the planner cannot read from its sizes (a user's model by import path,
an `hf:` class hf_configs.py does not list, blocks named with model_blocks=): built on the meta
device (no memory, but torch and the model's library are imported), its parameters and blocks
read off the module, its activations traced where no formula applies."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from harness.plan.memory.activation_trace import ActivationTracer, TraceError
from harness.plan.model.model_shape import ModelShape, ParamTensor, TransformerDims
from models.blocks import Blocks, find_blocks
from models.zoo import build_model

PROBE_SEQ_LEN = 8  # tokens of the trial trace that tells whether a model can be traced at all


def built_shape(spec: str, model_kwargs: dict[str, Any], block_names: list[str] | None) -> ModelShape:
    if spec.startswith("hf:"):
        from harness.plan.model.hf_files import refuse_experts
        from models.hf import build_config

        refuse_experts(spec, build_config(spec[3:], model_kwargs).to_dict())
    with torch.device("meta"):
        model = build_model(spec, model_kwargs)
    return shape_of_module(spec, model, block_names)


def _dims_of(model: nn.Module, blocks: Blocks) -> TransformerDims | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "n_layer") and hasattr(config, "n_embd") and not hasattr(config, "hidden_size"):
        width, heads = config.n_embd, config.n_head  # the zoo's GPT
        return TransformerDims(
            config.n_layer, width, heads, width // heads, heads, 4 * width, config.vocab_size, tp_splits_head=False
        )
    if hasattr(config, "hidden_size") and hasattr(config, "num_hidden_layers"):
        width, heads = int(config.hidden_size), int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or width // heads
        ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width
        first = blocks.modules[:1]
        names = [name for block in first for name, _ in block.named_parameters()]
        classes = [type(m).__name__ for block in first for m in block.modules()]
        return TransformerDims(
            int(config.num_hidden_layers),
            width,
            heads,
            int(head_dim),
            int(getattr(config, "num_key_value_heads", None) or heads),
            int(ffn),
            int(config.vocab_size),
            gated_mlp=any("gate" in n for n in names),
            fused_qkv=not any("q_proj" in n for n in names),
            rms_norm=any("RMSNorm" in c for c in classes),
            rotary=any("Rotary" in type(m).__name__ for m in model.modules()),
        )
    return None


def _projection(module: nn.Module) -> bool:
    """A module of a matrix weight and a bias (nn.Linear, GPT-2's Conv1D): a projection whose bias's
    gradient is a reduction of its own, where a norm's weight and bias are vectors."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    return isinstance(weight, nn.Parameter) and weight.dim() == 2 and isinstance(bias, nn.Parameter)


def shape_of_module(name: str, model: nn.Module, block_names: list[str] | None = None) -> ModelShape:
    """The shape of a built model (any device, meta included); `block_names` as model_blocks=."""
    blocks = find_blocks(model, block_names)
    block_of: dict[int, int] = {}
    for index, block in enumerate(blocks.modules):
        for p in block.parameters():
            block_of.setdefault(id(p), index)
    unique = {id(p): p for p in model.parameters()}
    biases = {id(m.bias) for m in model.modules() if _projection(m)}
    tensors = tuple(
        ParamTensor(tuple(p.shape), block_of.get(key), projection_bias=key in biases) for key, p in unique.items()
    )
    total = sum(t.numel for t in tensors)
    flops_params = int(model.num_params()) if hasattr(model, "num_params") else total
    dims = _dims_of(model, blocks)
    holders = sum(1 for m in model.modules() if next(m.parameters(recurse=False), None) is not None)
    if dims is not None:
        return ModelShape(name, total, flops_params, dims, tensors, param_modules=holders)
    tracer, note = _activation_tracer(model, blocks)
    return ModelShape(name, total, flops_params, None, tensors, note, tracer, param_modules=holders)


def _activation_tracer(model: nn.Module, blocks: Blocks) -> tuple[ActivationTracer | None, str]:
    """A tracer for a model without transformer sizes, and the note that says what it assumes."""
    vocab, vocab_note = _vocab(model)
    tracer = ActivationTracer(model, blocks, vocab)
    try:
        tracer.trace(1, PROBE_SEQ_LEN)
    except TraceError as exc:
        return None, (
            f"activations unknown: the model does not run on the meta device ({exc}), so they cannot be "
            "traced and the peak is not predicted"
        )
    found = f"{blocks.describe()} ({blocks.found_by})" if blocks.modules else "none found, so no checkpointing"
    return tracer, (
        "activations traced: what autograd saves in one micro-batch's forward on the meta device, in fp32 "
        "or cast to bf16/fp16 where the backend runs in it (under autocast the fp32 figure, an upper "
        f"bound); blocks: {found}; {vocab_note}"
    )


def _vocab(model: nn.Module) -> tuple[int | None, str]:
    """The vocabulary the loss's backward buffers span, and how it was known."""
    vocab = getattr(model, "vocab_size", None)
    if isinstance(vocab, int):
        return vocab, f"the loss's backward buffers over its vocabulary of {vocab}"
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    if tables:
        return max(tables), (
            f"the model has no vocab_size: vocabulary assumed {max(tables)} (its largest embedding) "
            "for the loss's backward buffers"
        )
    return None, "the model has no vocab_size or embedding: the loss's backward buffers are left out"
