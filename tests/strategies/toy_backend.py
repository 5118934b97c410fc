"""A backend added as one file, as a user would add one: data parallel written by hand (every
rank a full replica, each gradient all-reduced and averaged once per step, before clipping).

Loaded through PARABENCH_PLUGINS=tests.strategies.toy_backend, it must appear in `runner.py
list`, run in `runner.py compare` beside `single`, be planned by `runner.py plan` (its PlanModel)
and appear in the report: tests/strategies/test_toy_backend.py checks each. Like the built-in
backends it imports no torch at module level, so that `list` and `plan` read it without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.base import OptimizerFactory, Preset, RunContext, Strategy, StrategyError
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

NAME = "toy-allreduce"


class ToyAllReduceStrategy(Strategy):
    description = "hand-written data parallel: gradients all-reduced once per step (a test plugin)"
    presets = (Preset(NAME, description, plan=PlanModel("torch", 0)),)

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        if ctx.precision != "fp32":
            raise StrategyError(f"strategy {NAME!r} trains in fp32 only: use precision=fp32")

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        import torch.distributed as dist

        self.model = model.to(self.ctx.device)
        if self.ctx.world_size > 1:
            for tensor in self.model.state_dict().values():
                dist.broadcast(tensor, src=0)  # every rank starts from rank 0's weights
        self.optimizer = optimizer_factory(self.model)
        return self.model, self.optimizer

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.ctx.grad_accum if self.ctx.grad_accum > 1 else loss).backward()

    def step(self) -> None:
        import torch
        import torch.distributed as dist

        assert self.model is not None and self.optimizer is not None, "setup() first"
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.ctx.world_size > 1:
            for grad in grads:
                dist.all_reduce(grad)
                grad.div_(self.ctx.world_size)
        if self.ctx.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
