"""`fsdp`, `fsdp-grad-op`, `fsdp-offload`: FSDP2 (`fully_shard`), each block then the root.

Parameters, gradients and optimizer state are sharded over the ranks as DTensors;
mixed precision goes through `MixedPrecisionPolicy` (compute in bf16/fp16, reduce
in fp32) rather than autocast, as FSDP2 intends. Checkpoints are
torch.distributed.checkpoint directories: each rank writes its own shards, and a
load reshards to whatever the new world size is.
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, ContextManager, Iterator

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from strategies.base import OptimizerFactory, RunContext, StrategyError, compile_blocks
from strategies.single import SingleDeviceStrategy


def mixed_precision_policy(ctx: RunContext) -> MixedPrecisionPolicy:
    """Compute in the run's low precision, reduce gradients in fp32 (torchtitan's choice); none in fp32."""
    if ctx.precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=ctx.dtype, reduce_dtype=torch.float32)


class FSDPStrategy(SingleDeviceStrategy):
    description = "FSDP2 fully_shard: parameters, gradients and optimizer state sharded"
    checkpoint_format = "dcp"

    def __init__(self, ctx: RunContext, *, reshard_after_forward: bool = True, cpu_offload: bool = False,
                 prefetch_blocks: int = 0, sync_each_micro_step: bool = True):
        super().__init__(ctx)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.cpu_offload = bool(cpu_offload)
        if not isinstance(sync_each_micro_step, bool):
            raise StrategyError(f"strategy_options.sync_each_micro_step={sync_each_micro_step} must be true or false")
        # True: reduce-scatter on every micro-step and accumulate sharded gradients, as torchtitan
        # and DeepSpeed ZeRO-3 do. False: skip it until the last micro-step (less communication,
        # but each rank keeps the whole unsharded gradient while accumulating).
        self.sync_each_micro_step = sync_each_micro_step
        if not isinstance(prefetch_blocks, int) or prefetch_blocks < 0:
            raise StrategyError(f"strategy_options.prefetch_blocks={prefetch_blocks} must be a whole number >= 0 "
                                "(0: FSDP2's own one-block prefetch)")
        self.prefetch_blocks = prefetch_blocks

    def _policies(self) -> dict:
        mp = mixed_precision_policy(self.ctx)
        offload: OffloadPolicy = OffloadPolicy()
        if self.cpu_offload:
            # Pinned host memory only helps (and only exists) with an accelerator to copy to.
            offload = CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")
        return {"mp_policy": mp, "offload_policy": offload}

    def compile(self, model: nn.Module) -> str:
        return compile_blocks(model)  # each block before it is sharded: FSDP's hooks stay between the graphs

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        policies = self._policies()
        if not self.cpu_offload:
            model = model.to(self.ctx.device)
        blocks = model.transformer_blocks() if hasattr(model, "transformer_blocks") else []
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward, **policies)
        self._set_explicit_prefetch(blocks)
        # The root holds what no block does (embeddings, final norm, head); it is
        # gathered again for backward at once, so resharding it after forward buys nothing.
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward and not blocks, **policies)
        self.model = model
        self.optimizer = optimizer_factory(model)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def _set_explicit_prefetch(self, blocks: list[nn.Module]) -> None:
        """Issue the all-gathers of the next `prefetch_blocks` blocks early (forward and
        backward), trading memory for overlap as torchtitan's explicit prefetching does."""
        n = self.prefetch_blocks
        if not n:
            return
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + n])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - n) : i][::-1])

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
        return contextlib.nullcontext() if self.sync_each_micro_step else self._gradient_sync_off()

    def _sharded_state(self) -> dict[str, Any]:
        # Keyed by parameter name, not by position, and sharded as the model is: what DCP
        # needs to write each rank's part and to reshard it on load.
        state: dict[str, Any] = {
            "model": get_model_state_dict(self.model),
            # On a fresh optimizer this takes one zero-lr step to create the state DCP loads into.
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer),
        }
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        return state

    def save(self, path: Path) -> None:
        assert self.model is not None and self.optimizer is not None, "setup() first"
        dcp.save(self._sharded_state(), checkpoint_id=path)

    def load(self, path: Path) -> None:
        assert self.model is not None and self.optimizer is not None, "setup() first"
        state = self._sharded_state()
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        if not any(key.startswith("scaler.") for key in saved):
            state.pop("scaler", None)  # saved in another precision: the scaler starts afresh
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self._load_scaler_state(state.get("scaler"))

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        # Read only the model's entries into the bare model's tensors: DCP stitches the shards
        # together whatever the world size that wrote them.
        state = {name: t.detach().clone() for name, t in model.state_dict().items()}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": state}, checkpoint_id=path, no_dist=True)
        return state


def register_strategies(registry) -> None:
    # Each name presets (and so fixes) both options that tell the variants apart.
    registry.register("fsdp", FSDPStrategy, "FSDP2 full shard (ZeRO-3 analogue)",
                      reshard_after_forward=True, cpu_offload=False)
    registry.register("fsdp-grad-op", FSDPStrategy, "FSDP2 without resharding after forward (ZeRO-2 analogue)",
                      reshard_after_forward=False, cpu_offload=False)
    registry.register("fsdp-offload", FSDPStrategy, "FSDP2 full shard, parameters and optimizer on CPU",
                      reshard_after_forward=True, cpu_offload=True)
