"""`single`: one process, no parallelism: the reference every other strategy is held to.

Also the home of the plain-PyTorch precision handling (autocast, GradScaler for
fp16, clipping) that `ddp` and `fsdp` inherit.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
import torch.nn as nn

from strategies.base import OptimizerFactory, RunContext, Strategy, StrategyError


class SingleDeviceStrategy(Strategy):
    description = "one process, no parallelism (the reference)"

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.scaler: torch.amp.GradScaler | None = None

    def _require_world_size_one(self) -> None:
        if self.ctx.world_size != 1:
            raise StrategyError(
                f"strategy 'single' runs in one process but {self.ctx.world_size} were started: use nproc=1 "
                "or a parallel strategy such as ddp"
            )

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        self._require_world_size_one()
        self.model = model.to(self.ctx.device)
        self.optimizer = optimizer_factory(self.model)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def _make_scaler(self) -> torch.amp.GradScaler | None:
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        return torch.amp.GradScaler(self.ctx.device.type) if self.ctx.precision == "fp16" else None

    def autocast(self) -> ContextManager:
        if self.ctx.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.ctx.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.ctx.grad_accum
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def clip_gradients(self) -> None:
        assert self.model is not None and self.optimizer is not None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.ctx.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.grad_clip)

    def step(self) -> None:
        assert self.optimizer is not None
        self.clip_gradients()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def register_strategies(registry) -> None:
    registry.register("single", SingleDeviceStrategy)
