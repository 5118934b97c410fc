"""`zero1-tp`: ddp-tp with the optimizer state sharded over the data-parallel ranks (ZeRO-1), by
torch's ZeroRedundancyOptimizer over the data-parallel process group.

Gradients are all-reduced as under ddp-tp; then each data-parallel rank steps the parameters it
owns (whole tensors, assigned greedily by size) and broadcasts them to the others, so it keeps
AdamW's state of those alone. DeepSpeed's ZeRO-1 has no DTensor path (it flattens plain tensors
into its buckets; its own tensor parallel, AutoTP, replaces the layers instead).
ZeroRedundancyOptimizer broadcasts plain tensors only (c10d's broadcast has no DTensor rule), so it
steps each rank's local part of the parameters: views of the DTensors' local tensors, given the
DTensors' local gradients before each step. The ranks of a data-parallel group hold the same
tensor-parallel part, so they agree on the partition.

Checkpoints are DCP directories in the layout of ddp-tp and fsdp-tp: each rank writes the state of
the parameters it owns, every rank the parameter groups whole, so that each loads the others'.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from strategies.base import OptimizerFactory, Preset
from strategies.ddp_tp import DDPTensorParallelStrategy
from strategies.memory import MemoryBreakdown
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    from torch.distributed.optim import ZeroRedundancyOptimizer

PARAMS = "params"


class ZeRO1TensorParallelStrategy(DDPTensorParallelStrategy):
    description = "ddp-tp with the optimizer state sharded over the data-parallel ranks (ZeroRedundancyOptimizer)"
    presets = (
        Preset(
            "zero1-tp",
            "ddp-tp with the optimizer state sharded over the data-parallel ranks (ZeRO-1, torch's "
            "ZeroRedundancyOptimizer)",
            plan=PlanModel("torch", 1, "low_precision", reshard_after_forward=False, tensor_parallel=True),
        ),
    )
    listing_order = 24
    without_tp = "ddp with ZeroRedundancyOptimizer"

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        return super().setup(model, lambda wrapped: self._sharded(wrapped, optimizer_factory(wrapped)))

    def _sharded(self, model: nn.Module, built: torch.optim.Optimizer) -> ZeroRedundancyOptimizer:
        """The run's optimizer (its class, groups and settings) as a ZeroRedundancyOptimizer over the
        data-parallel group, stepping the local part of each parameter."""
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer

        assert self._mesh_2d is not None
        names = {id(p): name for name, p in model.named_parameters()}
        # (name, DTensor parameter, its local view): the view shares the local tensor's storage.
        self._locals: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for group in built.param_groups:
                self._locals += [(names[id(p)], p, p.to_local()) for p in group[PARAMS]]
        local_of = {id(p): local for _, p, local in self._locals}
        groups = [{**group, PARAMS: [local_of[id(p)] for p in group[PARAMS]]} for group in built.param_groups]
        # Every group carries the settings; the constructor takes those of its own signature.
        accepted = inspect.signature(type(built).__init__).parameters
        defaults = {key: value for key, value in built.defaults.items() if key in accepted}
        return ZeroRedundancyOptimizer(
            groups, type(built), process_group=self._mesh_2d[self.mesh.data_dims[0]].get_group(), **defaults
        )

    def step(self) -> None:
        import torch

        assert self.model is not None
        with torch.no_grad():
            for _, param, local in self._locals:
                local.grad = None if param.grad is None else param.grad.to_local()
        # Clipping scales the DTensor gradients in place, which the local views share.
        super().step()
        self.model.zero_grad(set_to_none=True)

    def memory_breakdown(self) -> MemoryBreakdown:
        assert self.model is not None and self.optimizer is not None, "setup() first"
        return MemoryBreakdown.of(self.model, self.optimizer.optim)  # the state this rank owns

    def _optimizer_state(self) -> dict[str, Any]:
        """The state this rank owns, keyed by parameter name, each tensor shaped as its parameter a
        DTensor laid out as the parameter is; the parameter groups whole, by name."""
        owned = self.optimizer.optim
        _create_state(owned)
        by_local = {id(local): (name, param) for name, param, local in self._locals}
        state = {}
        for local, held in owned.state.items():
            name, param = by_local[id(local)]
            state[name] = {key: _laid_out_as(param, local, value) for key, value in held.items()}
        groups = self.optimizer.param_groups
        named = [{**group, PARAMS: [by_local[id(local)][0] for local in group[PARAMS]]} for group in groups]
        return {"state": state, "param_groups": named}

    def _load_optimizer_state(self, state: dict[str, Any]) -> None:
        import torch
        from torch.distributed.tensor import DTensor

        owned = self.optimizer.optim
        names = {id(local): name for name, _, local in self._locals}
        with torch.no_grad():
            for local, held in owned.state.items():
                loaded = state["state"][names[id(local)]]
                for key, value in held.items():
                    new = loaded[key].to_local() if isinstance(loaded[key], DTensor) else loaded[key]
                    if isinstance(value, torch.Tensor):
                        value.copy_(new)
                    else:
                        held[key] = new
        # The groups come in the live order (dcp_layout.restore_layout): ZeroRedundancyOptimizer
        # passes their settings on to the optimizer it wraps at its next step.
        for group, loaded_group in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
            group.update({key: value for key, value in loaded_group.items() if key != PARAMS})

    def _layout_name(self) -> str:
        return f"{super()._layout_name()} with ZeroRedundancyOptimizer"


def _laid_out_as(param: torch.Tensor, local: torch.Tensor, value: Any) -> Any:
    """`value` of the optimizer's state (a moment, or the scalar `step`) as a DTensor laid out as
    `param` where it is shaped as the parameter's local part."""
    import torch
    from torch.distributed.tensor import DTensor

    if not isinstance(value, torch.Tensor) or not value.dim() or value.shape != local.shape:
        return value
    mesh, placements = param.device_mesh, param.placements
    return DTensor.from_local(value, mesh, placements, run_check=False, shape=param.shape, stride=param.stride())


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer the state a checkpoint loads into: one step at lr 0 over zero
    gradients, as torch's state-dict helpers do for the optimizers they are given."""
    import torch

    if optimizer.state:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group[PARAMS]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
        for p in group[PARAMS]:
            p.grad = None
