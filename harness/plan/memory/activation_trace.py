"""Activations of a model the planner has no formula for (no TransformerDims: a user's
model by import path), measured by tracing one micro-batch on the meta device.

The model runs forward on (micro_batch, seq_len) token ids that hold no data; every tensor
autograd saves for backward is counted once (by storage, parameters left out), and
attributed to the block running at that moment (models/blocks.py) or to the rest of the
model (embeddings, head, loss). Each block's input is what checkpointing keeps instead.
Precision: traced in fp32, or with the model cast to bf16/fp16 where the backend runs
everything in the low precision (FSDP's policy, DeepSpeed); under autocast the fp32 figure
stands, an upper bound, since autocast only casts on real devices.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from models.blocks import Blocks


class TraceError(RuntimeError):
    """The model cannot run on the meta device (an op without a meta kernel, a value read)."""


@dataclass(frozen=True)
class TracedActivations:
    """Bytes one micro-batch saves for backward."""

    blocks: tuple[int, ...]  # what each block saves
    block_inputs: tuple[int, ...]  # each block's input: what checkpointing keeps of it
    rest: int  # saved outside the blocks: embeddings, head, the loss


class ActivationTracer:
    """Traces a meta-device model on demand, once per micro-batch, sequence length and dtype."""

    def __init__(self, model: nn.Module, blocks: Blocks, vocab: int | None):
        names = {id(m): name for name, m in model.named_modules()}
        on_meta = all(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))
        self._model = model if on_meta else copy.deepcopy(model).to("meta")
        self._block_names = [names[id(b)] for b in blocks.modules]
        self.vocab = vocab  # what the loss's backward buffers span; None: unknown
        self._traced: dict[tuple[int, int, torch.dtype], TracedActivations] = {}

    def trace(self, micro_batch: int, seq_len: int, dtype: torch.dtype = torch.float32) -> TracedActivations:
        key = (micro_batch, seq_len, dtype)
        if key not in self._traced:
            # A copy holds no data on the meta device; casting it leaves the planner's model as built.
            model = self._model if dtype == torch.float32 else copy.deepcopy(self._model).to(dtype)
            blocks = [model.get_submodule(name) for name in self._block_names]
            self._traced[key] = _trace(model, blocks, micro_batch, seq_len)
        return self._traced[key]


def _storage_bytes(tensors: Any) -> dict[int, int]:
    found = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
    return {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in found if isinstance(t, torch.Tensor)}


def _trace(model: nn.Module, blocks: list[nn.Module], micro_batch: int, seq_len: int) -> TracedActivations:
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, tuple[int, int | None]] = {}  # storage -> (bytes, block index or None)
    inputs: dict[int, int] = {}
    current: list[int | None] = [None]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params and storage._cdata not in saved:
            saved[storage._cdata] = (storage.nbytes(), current[0])
        return t

    def entering(index: int):
        def hook(module: nn.Module, args: tuple) -> None:
            current[0] = index
            inputs[index] = sum(_storage_bytes(args).values())

        return hook

    def leaving(module: nn.Module, args: tuple, output: Any) -> None:
        current[0] = None

    handles = [
        h
        for i, b in enumerate(blocks)
        for h in (b.register_forward_pre_hook(entering(i)), b.register_forward_hook(leaving))
    ]
    tokens = torch.zeros((micro_batch, seq_len), dtype=torch.long, device="meta")
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens, tokens)
    except Exception as exc:  # whatever the model does that the meta device cannot
        raise TraceError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    finally:
        for handle in handles:
            handle.remove()
    per_block = [0] * len(blocks)
    rest = 0
    for nbytes, index in saved.values():
        if index is None:
            rest += nbytes
        else:
            per_block[index] += nbytes
    return TracedActivations(tuple(per_block), tuple(inputs.get(i, 0) for i in range(len(blocks))), rest)
