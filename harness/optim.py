"""The optimizer and learning-rate schedule every strategy shares, so that only
the backend differs between runs."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from strategies.memory import local_tensor


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's split: matrices and embeddings decay, biases and norms do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw_factory(lr: float, betas: tuple[float, float], weight_decay: float) -> Callable[[nn.Module], torch.optim.Optimizer]:
    def build(model: nn.Module) -> torch.optim.Optimizer:
        groups = param_groups(model, weight_decay)
        on_cuda = all(local_tensor(p).is_cuda for g in groups for p in g["params"])
        # The fused kernel is one launch per step on CUDA; foreach (the default) elsewhere.
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True if on_cuda else None)

    return build


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup, then cosine decay to min_lr at the last step (nanoGPT's get_lr)."""
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if total_steps <= warmup_steps + 1:
        return lr
    progress = (step - warmup_steps) / (total_steps - 1 - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (lr - min_lr)
