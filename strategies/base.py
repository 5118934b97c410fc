"""The one training interface every backend implements.

The runner's loop holds a `Strategy` and never asks which one: setup wraps the
model and builds the optimizer, backward/step/no_sync drive accumulation, and
memory_breakdown reports what this rank holds. Checkpoint verbs: save/load/export.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
import torch.nn as nn

from strategies.memory import MemoryBreakdown

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
"""Builds the run's optimizer over a (wrapped or sharded) model's parameters."""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class StrategyError(ValueError):
    """A strategy that cannot run as asked (one line, says what to do)."""


@dataclass(frozen=True)
class RunContext:
    """What a strategy needs to know about the run it serves."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    micro_batch: int
    grad_accum: int
    grad_clip: float  # 0: no clipping
    config: Any = None  # the whole RunConfig, for backends that build their own config from it

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]


class Strategy(ABC):
    """One backend behind the runner's verbs. Subclasses register one or more names."""

    name: str = ""
    description: str = ""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run here (a missing package), or None when it can."""
        return None

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        """Why this backend, with these preset options, cannot run on `device_type`
        ("cpu" or "cuda"), or None when it can. Compare skips such names with the reason."""
        return None

    @abstractmethod
    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Move, wrap or shard `model` and build its optimizer; returns what the loop calls."""

    def autocast(self) -> ContextManager:
        """Context for the forward pass (mixed precision where the backend uses autocast)."""
        return contextlib.nullcontext()

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-step's mean loss; the strategy scales by 1/grad_accum."""

    @abstractmethod
    def step(self) -> None:
        """Clip, optimizer step and zero the gradients, once per global step."""

    def no_sync(self) -> ContextManager:
        """Context for every micro-step but the last: skip the gradient reduction."""
        return contextlib.nullcontext()

    def set_lr(self, lr: float) -> None:
        assert self.optimizer is not None, "setup() first"
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def memory_breakdown(self) -> MemoryBreakdown:
        """Bytes this rank holds in parameters, gradients and optimizer state."""
        assert self.model is not None, "setup() first"
        return MemoryBreakdown.of(self.model, self.optimizer)

    def teardown(self) -> None:
        """Release what setup built (the process group belongs to the runner)."""
        self.model = None
        self.optimizer = None
