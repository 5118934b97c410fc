"""A model's shape, which is all the planner needs: its parameter tensors (for sharding and
padding), its transformer sizes (for activations and attention flops) and N for 6N.

From a zoo name, an import path or an `hf:` spec the model is built on the meta device,
so a 70B model costs no memory; from a bare description (params=, or layers/width/heads/
vocab) the shape is a nanoGPT-style GPT of those sizes.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from harness.plan.activation_trace import ActivationTracer, TraceError
from models.blocks import Blocks, find_blocks
from models.zoo import build_model

PROBE_SEQ_LEN = 8  # tokens of the trial trace that tells whether a model can be traced at all


class PlanError(ValueError):
    """A planning question that cannot be answered as asked (one line, says what to do)."""


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor (tied weights appear once)."""

    shape: tuple[int, ...]
    block: int | None  # index of the block holding it (models/blocks.py); None: the root (embeddings, final norm, head)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class TransformerDims:
    layers: int
    width: int
    heads: int
    head_dim: int
    kv_heads: int
    ffn_width: int
    vocab: int
    gated_mlp: bool = False  # SwiGLU-style (gate and up projections) rather than one GELU MLP
    fused_qkv: bool = True  # one matmul makes q, k and v (GPT-2) rather than three (Llama)
    rms_norm: bool = False  # RMSNorm, which saves two tensors for backward where LayerNorm saves one


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: int  # every parameter, tied ones counted once
    flops_params: int  # N of 6N: position embeddings left out
    dims: TransformerDims | None  # None for a model that is not a recognisable transformer
    tensors: tuple[ParamTensor, ...] | None  # None when only a parameter count was given
    note: str = ""  # how the shape was obtained where it was not read from a model, and what was assumed
    # Measures activations where no formula applies (dims is None); None where none can be traced.
    tracer: ActivationTracer | None = field(default=None, compare=False, repr=False)
    param_modules: int | None = None  # modules holding parameters directly (ZeRO-3 fetches each); None: unknown

    def matrix_width(self) -> int | None:
        """The size most weight matrices share, as strategies/deepspeed_config.model_size counts it."""
        if self.tensors is None:
            return self.dims.width if self.dims else None
        dims = Counter(d for t in self.tensors if len(t.shape) == 2 for d in t.shape)
        return dims.most_common(1)[0][0] if dims else None

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12·L·H·Q·T (PaLM appendix B), the same count the training loop uses for MFU."""
        attention = 0
        if self.dims is not None:
            attention = 12 * self.dims.layers * self.dims.heads * self.dims.head_dim * seq_len
        return 6.0 * self.flops_params + attention

    def block_params(self) -> list[int]:
        """Parameters of each transformer block (the unit FSDP and ZeRO-3 gather at once)."""
        if self.tensors is not None:
            counts: dict[int, int] = {}
            for t in self.tensors:
                if t.block is not None:
                    counts[t.block] = counts.get(t.block, 0) + t.numel
            return [counts[i] for i in sorted(counts)]
        if self.dims is None:
            return []
        return [(self.params - self.root_params()) // self.dims.layers] * self.dims.layers

    def root_params(self) -> int:
        """Parameters outside the blocks: embeddings, final norm, head (gathered for the whole step)."""
        if self.tensors is not None:
            return sum(t.numel for t in self.tensors if t.block is None)
        if self.dims is None:
            return self.params
        return self.dims.vocab * self.dims.width + self.dims.width


def _dims_of(model: nn.Module, blocks: Blocks) -> TransformerDims | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "n_layer") and hasattr(config, "n_embd") and not hasattr(config, "hidden_size"):
        width, heads = config.n_embd, config.n_head  # the zoo's GPT
        return TransformerDims(config.n_layer, width, heads, width // heads, heads, 4 * width, config.vocab_size)
    if hasattr(config, "hidden_size") and hasattr(config, "num_hidden_layers"):
        width, heads = int(config.hidden_size), int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or width // heads
        ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width
        first = blocks.modules[:1]
        names = [name for block in first for name, _ in block.named_parameters()]
        norms = [type(m).__name__ for block in first for m in block.modules()]
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
            rms_norm=any("RMSNorm" in n for n in norms),
        )
    return None


def shape_of_module(name: str, model: nn.Module, block_names: list[str] | None = None) -> ModelShape:
    """The shape of a built model (any device, meta included); `block_names` as model_blocks=."""
    blocks = find_blocks(model, block_names)
    block_of: dict[int, int] = {}
    for index, block in enumerate(blocks.modules):
        for p in block.parameters():
            block_of.setdefault(id(p), index)
    unique = {id(p): p for p in model.parameters()}
    tensors = tuple(ParamTensor(tuple(p.shape), block_of.get(key)) for key, p in unique.items())
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


def shape_of_spec(
    spec: str, model_kwargs: dict[str, Any] | None = None, block_names: list[str] | None = None
) -> ModelShape:
    """A zoo preset, an import path or an `hf:` spec, built on the meta device."""
    with torch.device("meta"):
        model = build_model(spec, model_kwargs)
    return shape_of_module(spec, model, block_names)


GPT2_VOCAB = 50304
HEAD_DIM = 64  # GPT-2's head size, used when heads are not given
ASPECT_RATIO = 128  # width / layers of GPT-3's family (175B: 12288 / 96), used when only params are given


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise PlanError(f"{name}={value} must be a positive number")


def shape_of_description(
    *, params: float | None, layers: int | None, width: int | None, heads: int | None, vocab: int | None, seq_len: int
) -> ModelShape:
    """A GPT from its sizes; or, from a parameter count alone, the model states exactly and a
    GPT-3-proportioned shape (width = 128 x layers) for activations, said so in `note`."""
    for key, value in (("params", params), ("layers", layers), ("width", width), ("heads", heads), ("vocab", vocab)):
        _positive(key, value)
    vocab = int(vocab or GPT2_VOCAB)
    if layers is None and width is None:
        if params is None:
            raise PlanError(
                "no model given: set model=<zoo name|pkg.mod:fn|hf:ConfigClass>, or params=, or layers= and width="
            )
        return _shape_from_count(int(params), vocab, heads)
    if layers is None or width is None:
        raise PlanError("a described model needs both layers= and width= (heads= and vocab= are optional)")
    heads = int(heads or max(1, width // HEAD_DIM))
    if width % heads:
        raise PlanError(f"width={width} must be a multiple of heads={heads}")
    from models.gpt import GPT, GPTConfig

    with torch.device("meta"):
        model = GPT(
            GPTConfig(n_layer=int(layers), n_head=heads, n_embd=int(width), vocab_size=vocab, block_size=seq_len)
        )
    shape = shape_of_module(f"gpt(layers={layers}, width={width}, heads={heads}, vocab={vocab})", model)
    if params is None:
        return shape
    # A count given beside the sizes wins for the model states; the sizes still shape activations.
    return ModelShape(
        f"{params:.3g} params, {shape.name}",
        int(params),
        int(params),
        shape.dims,
        None,
        "parameter count as given; layer sizes as described",
        param_modules=shape.param_modules,
    )


def _shape_from_count(params: int, vocab: int, heads: int | None) -> ModelShape:
    def count(layers: int) -> int:
        width = ASPECT_RATIO * layers
        return 12 * layers * width * width + vocab * width

    layers = min(range(1, 1000), key=lambda n: abs(count(n) - params))
    width = ASPECT_RATIO * layers
    heads = int(heads or max(1, width // ASPECT_RATIO))
    dims = TransformerDims(layers, width, heads, width // heads, heads, 4 * width, vocab)
    note = (
        f"only a parameter count was given: layer sizes assumed GPT-3-proportioned "
        f"(layers={layers}, width={width}, heads={heads}, vocab={vocab}); give layers= and width= to fix them"
    )
    return ModelShape(f"{params:.3g} params", params, params, dims, None, note)
