"""`fsdp`, `fsdp-grad-op`, `fsdp-offload`: FSDP2 (`fully_shard`), each block then the root.

Parameters, gradients and optimizer state are sharded over the ranks as DTensors;
mixed precision goes through `MixedPrecisionPolicy` (compute in bf16/fp16, reduce
in fp32) rather than autocast, as FSDP2 intends.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from strategies.base import OptimizerFactory, RunContext
from strategies.single import SingleDeviceStrategy


class FSDPStrategy(SingleDeviceStrategy):
    description = "FSDP2 fully_shard: parameters, gradients and optimizer state sharded"

    def __init__(self, ctx: RunContext, *, reshard_after_forward: bool = True, cpu_offload: bool = False):
        super().__init__(ctx)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.cpu_offload = bool(cpu_offload)

    def _policies(self) -> dict:
        mp = MixedPrecisionPolicy()
        if self.ctx.precision != "fp32":
            mp = MixedPrecisionPolicy(param_dtype=self.ctx.dtype, reduce_dtype=torch.float32)
        offload: OffloadPolicy = OffloadPolicy()
        if self.cpu_offload:
            # Pinned host memory only helps (and only exists) with an accelerator to copy to.
            offload = CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")
        return {"mp_policy": mp, "offload_policy": offload}

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        policies = self._policies()
        if not self.cpu_offload:
            model = model.to(self.ctx.device)
        blocks = model.transformer_blocks() if hasattr(model, "transformer_blocks") else []
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward, **policies)
        # The root holds what no block does (embeddings, final norm, head); it is
        # gathered again for backward at once, so resharding it after forward buys nothing.
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward and not blocks, **policies)
        self.model = model
        self.optimizer = optimizer_factory(model)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def _make_scaler(self) -> torch.amp.GradScaler | None:
        if self.ctx.precision != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        # Sharded gradients: the inf/nan check must agree across ranks.
        return ShardedGradScaler(self.ctx.device.type)

    def autocast(self) -> ContextManager:
        return contextlib.nullcontext()  # MixedPrecisionPolicy casts parameters instead

    def clip_gradients(self) -> None:
        assert self.model is not None and self.optimizer is not None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.ctx.grad_clip <= 0:
            return
        params = [p for p in self.model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        if isinstance(total, DTensor):
            total = total.full_tensor()  # the norm over every rank's shard, not this rank's
        torch.nn.utils.clip_grads_with_norm_(params, self.ctx.grad_clip, total, foreach=True)

    @contextlib.contextmanager
    def _gradient_sync_off(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def no_sync(self) -> ContextManager:
        return self._gradient_sync_off()


def register_strategies(registry) -> None:
    registry.register("fsdp", FSDPStrategy, "FSDP2 full shard (ZeRO-3 analogue)")
    registry.register(
        "fsdp-grad-op", FSDPStrategy, "FSDP2 without resharding after forward (ZeRO-2 analogue)",
        reshard_after_forward=False,
    )
    registry.register("fsdp-offload", FSDPStrategy, "FSDP2 full shard, parameters and optimizer on CPU", cpu_offload=True)
