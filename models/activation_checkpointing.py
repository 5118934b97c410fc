"""activation_checkpointing=true for any model: each block keeps only its input in the
forward and is recomputed in the backward.

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
from torch.utils.checkpoint import checkpoint

from models.blocks import FOUND_BY_METHOD, FOUND_BY_NAMES, Blocks


class CheckpointingError(ValueError):
    """activation_checkpointing=true on a model with neither blocks nor its own switch."""


def enable_checkpointing(model: nn.Module, blocks: Blocks) -> str:
    """Turn activation checkpointing on; returns what is checkpointed, for the run's report.
    Blocks named with model_blocks= are checkpointed here even where the model has a switch:
    the run asked for those blocks."""
    if hasattr(model, "activation_checkpointing") and blocks.found_by != FOUND_BY_NAMES:
        model.activation_checkpointing = True
        own = f" ({blocks.describe()})" if blocks.found_by == FOUND_BY_METHOD else ""
        return f"the model's own switch{own}"
    if not blocks.modules:
        raise CheckpointingError(
            "activation_checkpointing=true needs blocks to recompute, and this model has no repeated layers and no "
            f"activation_checkpointing switch: name them with model_blocks=<ClassName> (classes in this model: "
            f"{', '.join(blocks.model_classes)})"
        )
    for block in blocks.modules:
        block.forward = _checkpointed(block, block.forward)
    return blocks.describe()


def is_checkpointed(block: nn.Module) -> bool:
    """Whether enable_checkpointing wrapped this block's forward."""
    return getattr(block.forward, "_parabench_checkpointed", False)


def _checkpointed(block: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not (block.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)  # nothing is saved for a backward that will not come
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    run._parabench_checkpointed = True  # type: ignore[attr-defined]
    return run
