"""activation_checkpointing=true for any model: each block keeps only its input in the
forward and is recomputed in the backward; =selective keeps what torchtitan's op-level policy
keeps besides (models/selective_checkpointing.py) and recomputes the rest.

A model with its own switch (parabench's GPT, `hf:` models: an `activation_checkpointing`
attribute) checkpoints its own blocks. Any other model has the blocks models/blocks.py
finds checkpointed here, by replacing each block instance's `forward` with a
non-reentrant `torch.utils.checkpoint` around the original: the module tree and so the
state-dict names stay as they were, and the block is still called through its
`__call__`, so FSDP2's and DeepSpeed ZeRO-3's hooks on it run once in the forward
(the recompute calls the original forward inside the block's own backward, after those
hooks have gathered its parameters again), and per-block compile traces the checkpoint.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from models.blocks import FOUND_BY_METHOD, FOUND_BY_NAMES, Blocks
from models.selective_checkpointing import selective_context


class CheckpointingError(ValueError):
    """activation_checkpointing=true on a model with neither blocks nor its own switch."""


def enable_checkpointing(model: nn.Module, blocks: Blocks, selective: bool = False) -> str:
    """Turn activation checkpointing on, whole blocks or (`selective`) torchtitan's op-level policy
    inside each; returns what is checkpointed, for the run's report. Blocks named with model_blocks=
    are checkpointed here even where the model has a switch: the run asked for those blocks."""
    context_fn = selective_context if selective else noop_context_fn
    policy = ", selective: every second matmul and the attention kept" if selective else ""
    if hasattr(model, "activation_checkpointing") and blocks.found_by != FOUND_BY_NAMES:
        if selective and not hasattr(model, "checkpoint_context_fn"):
            raise CheckpointingError(
                "activation_checkpointing=selective: this model's own activation_checkpointing switch recomputes whole "
                "blocks: name its blocks with model_blocks=<ClassName> to checkpoint them selectively, or give full"
            )
        if selective:
            model.checkpoint_context_fn = context_fn  # before the switch: HF's reads it as it turns on
        model.activation_checkpointing = True
        own = f" ({blocks.describe()})" if blocks.found_by == FOUND_BY_METHOD else ""
        return f"the model's own switch{own}{policy}"
    if not blocks.modules:
        raise CheckpointingError(
            f"activation_checkpointing={'selective' if selective else 'true'} needs blocks to recompute, and this "
            "model has no repeated layers and no activation_checkpointing switch: name them with "
            f"model_blocks=<ClassName> (classes in this model: "
            f"{', '.join(blocks.model_classes)})"
        )
    for block in blocks.modules:
        block.forward = _checkpointed(block, block.forward, context_fn)
    return blocks.describe() + policy


def recompute(
    fn: Callable[..., Any], *args: Any, context_fn: Callable[[], Any] = noop_context_fn, **kwargs: Any
) -> Any:
    """`fn(*args, **kwargs)` under non-reentrant torch.utils.checkpoint, keeping what `context_fn` keeps. The
    no-op context is not passed: given at all, torch.compile cannot trace a checkpoint around it (it reads
    the argument only as a function it has already resolved), which compiles the model whole or a block."""
    if context_fn is noop_context_fn:
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


def is_checkpointed(block: nn.Module) -> bool:
    """Whether enable_checkpointing wrapped this block's forward."""
    return getattr(block.forward, "_parabench_checkpointed", False)


def _checkpointed(block: nn.Module, forward: Callable[..., Any], context_fn: Callable[[], Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not (block.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)  # nothing is saved for a backward that will not come
        return recompute(forward, *args, context_fn=context_fn, **kwargs)

    run._parabench_checkpointed = True  # type: ignore[attr-defined]
    return run
