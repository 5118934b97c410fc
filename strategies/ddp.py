"""`ddp`: torch DistributedDataParallel, every rank a full replica, gradients all-reduced."""

from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager

from strategies.base import OptimizerFactory, Preset, RunContext, StrategyError
from strategies.plan_model import PlanModel
from strategies.single import SingleDeviceStrategy

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


class DDPStrategy(SingleDeviceStrategy):
    description = "DistributedDataParallel: full replica per rank, bucketed gradient all-reduce"
    presets = (Preset("ddp", description, plan=PlanModel("torch", 0, data_parallel=True)),)
    listing_order = 10

    def __init__(
        self,
        ctx: RunContext,
        *,
        bucket_cap_mb: float = 25.0,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = True,
        static_graph: bool = False,
    ):
        super().__init__(ctx)
        if not float(bucket_cap_mb) > 0:
            raise StrategyError(
                f"strategy_options.bucket_cap_mb={bucket_cap_mb} must be above 0 (MB a bucket, DDP's 25)"
            )
        self.ddp_kwargs = dict(
            bucket_cap_mb=float(bucket_cap_mb),
            find_unused_parameters=bool(find_unused_parameters),
            # Gradients live in the all-reduce buckets: one copy of them, not two.
            gradient_as_bucket_view=bool(gradient_as_bucket_view),
            static_graph=bool(static_graph),
        )
        self._optimize_ddp_before: bool | str | None = None  # dynamo's setting, while compile() changes it

    def compile(self, model: nn.Module) -> str:
        """The whole model, loss included (nanoGPT's order: compiled, then wrapped). Compiled under
        DDP, dynamo's DDPOptimizer splits the graph at DDP's bucket boundaries (gpt2-124m: 14
        graphs at 25 MB) so that each bucket's all-reduce starts while backward goes on. One rank
        has nothing to overlap: there the split only costs fusion and launches, so the model
        compiles to one graph, and DDP reduces after backward, as it would with no overlap."""
        import torch

        super().compile(model)
        if self.ctx.world_size > 1:
            return f"whole model, split at DDP's {self.ddp_kwargs['bucket_cap_mb']:g} MB buckets"
        # Dynamo reads this when it compiles, at the first forward: set until teardown.
        self._optimize_ddp_before = torch._dynamo.config.optimize_ddp
        torch._dynamo.config.optimize_ddp = False
        return "whole model, one graph (one rank: no all-reduce to overlap)"

    def teardown(self) -> None:
        import torch

        if self._optimize_ddp_before is not None:
            torch._dynamo.config.optimize_ddp = self._optimize_ddp_before
            self._optimize_ddp_before = None
        super().teardown()

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel

        model = model.to(self.ctx.device)
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters at construction: every rank starts identical.
        self.model = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        self.optimizer = optimizer_factory(self.model)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def no_sync(self) -> ContextManager:
        return self.model.no_sync()
