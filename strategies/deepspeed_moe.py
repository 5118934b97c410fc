"""`zero1-ep`, `zero2-ep`: DeepSpeed's own mixture-of-experts layers under ZeRO-1/2.

The MoE layers of the zoo's MoE GPT or of a transformers Mixtral, Qwen3-MoE or OLMoE are swapped for
`deepspeed.moe.layer.MoE` carrying the same router and expert weights and the same gating
(models/deepspeed_moe_layers.py); DeepSpeed shards the experts over its
expert-parallel groups of ep_size consecutive ranks (deepspeed.utils.groups) and reduces their
gradients over the ranks holding the same experts, while ZeRO shards the optimizer state (zero2:
and the gradients) of the rest over every rank. Every rank reads its own micro-batch (dp x ep, both
data dimensions). Named beside zero1 and zero2 as ddp-ep is beside ddp: the ZeRO stage and the
expert parallel in one name, as `runner.py list` shows them. ZeRO-3 is left out: DeepSpeed refuses
its native MoE layers under stage 3.

Checkpoints are DeepSpeed's own (each expert's state in files of its own), resumed at the same world
size and ep_size. Another strategy's consolidated weights load (each rank cutting out its experts);
these checkpoints' own MoE layers are not consolidated back (export, a resume under another strategy).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.base import ModelUnsupported, OptimizerFactory, Preset, RunContext, StrategyError
from strategies.deepspeed import DeepSpeedStrategy
from strategies.mesh_layout import MeshLayout, check_divides
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from strategies.parallel_dims import ModelFacts


DATA_DIM, EXPERT_DIM = "dp", "ep"


def expert_parallel_layout(world_size: int, ep_size: Any) -> MeshLayout:
    """dp x ep, both dimensions reading their own data (the ep ranks are data-parallel ranks too)."""
    ep = check_divides("ep_size", world_size if ep_size is None else ep_size, world_size)
    notes = ["ep 1: no expert parallel, every rank holds every expert"] if ep == 1 else []
    return MeshLayout((world_size // ep, ep), (DATA_DIM, EXPERT_DIM), (DATA_DIM, EXPERT_DIM), tuple(notes))


def _zero_ep(stage: int, what: str) -> Preset:
    return Preset(
        f"zero{stage}-ep",
        f"DeepSpeed's MoE layers, experts sharded over ep_size ranks; ZeRO-{stage} ({what}) over every rank",
        {"stage": stage, "offload_optimizer": False, "offload_params": False},
        PlanModel("deepspeed", stage, "low_precision", expert_parallel=True),
    )


class DeepSpeedMoEStrategy(DeepSpeedStrategy):
    description = "DeepSpeed MoE (expert parallel) under ZeRO"
    presets = (_zero_ep(1, "optimizer state sharded"), _zero_ep(2, "optimizer state and gradients sharded"))
    listing_order = 35

    def __init__(
        self,
        ctx: RunContext,
        *,
        stage: int = 1,
        offload_optimizer: bool = False,
        offload_params: bool = False,
        cpu_adam: bool | None = None,
        ep_size: int | None = None,
    ):
        super().__init__(
            ctx, stage=stage, offload_optimizer=offload_optimizer, offload_params=offload_params, cpu_adam=cpu_adam
        )
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"ep_size": ep_size})
        self.ep_size = self.mesh.shape[1]
        self.checkpoint_format = f"deepspeed-zero{self.stage}-ep{self.ep_size}"
        self.swapped: list[str] = []

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        return expert_parallel_layout(world_size, options.get("ep_size"))

    def check_model(self, model: nn.Module) -> None:
        from models.deepspeed_moe_layers import n_experts, refusal
        from models.expert_parallel import check_divides_experts

        reason = refusal(model)
        if reason:
            raise ModelUnsupported(f"strategy {self.name!r}: {reason}")
        check_divides_experts(n_experts(model), self.ep_size)
        super().check_model(model)

    def compile(self, model: nn.Module) -> str:
        raise StrategyError(f"strategy {self.name!r} does not compile DeepSpeed's MoE layers: use compile=false")

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        from models.deepspeed_moe_layers import to_deepspeed_moe

        self.check_model(model)
        # DeepSpeed's expert-parallel groups are runs of ep_size consecutive ranks: this rank's
        # place in its group says which experts it holds.
        self.swapped = to_deepspeed_moe(model, self.ep_size, self.ctx.rank % self.ep_size)

        def moe_optimizer(module: nn.Module) -> torch.optim.Optimizer:
            from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

            optimizer = optimizer_factory(module)
            # ZeRO reduces and partitions the experts' state over their own groups: it finds them by
            # the groups DeepSpeed marks "moe" (the run's groups otherwise unchanged).
            named = [{**group, "name": f"group{i}"} for i, group in enumerate(optimizer.param_groups)]
            optimizer.param_groups[:] = split_params_into_different_moe_groups_for_optimizer(named)
            return optimizer

        engine, optimizer = super().setup(model, moe_optimizer)
        self._check_expert_groups()
        self.layout = f"zero{self.stage}-ep: {len(self.swapped)} DeepSpeed MoE layers, experts over {self.ep_size}"
        return engine, optimizer

    def _check_expert_groups(self) -> None:
        from deepspeed.utils import groups

        name = f"ep_size_{self.ep_size}"
        rank = groups._get_expert_parallel_rank(name)
        if rank != self.ctx.rank % self.ep_size:
            expected = self.ctx.rank % self.ep_size
            raise StrategyError(
                f"DeepSpeed put rank {self.ctx.rank} at expert-parallel rank {rank}, not {expected}: "
                "its experts would not be the ones copied in"
            )

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        raise StrategyError(
            f"strategy {self.name!r} does not consolidate DeepSpeed's MoE layers into the model's weights: export "
            "from a checkpoint of ddp-ep or single, or resume this strategy's own at the same world size and ep_size"
        )

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """The bare model's weights (a checkpoint of another strategy) into DeepSpeed's layers: each router
        weight as its gate's, this rank's experts cut out of the stacked ones, fp32 masters too."""
        from models.deepspeed_moe_layers import deepspeed_moe_state
        from strategies.deepspeed import load_zero_full_state_dict

        assert self.engine is not None, "setup() first"
        load_zero_full_state_dict(self.engine, deepspeed_moe_state(self.engine.module, state))

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        raise StrategyError(
            "a zero*-ep checkpoint holds DeepSpeed's MoE layers, which parabench does not consolidate: resume it "
            "under the same strategy, world size and ep_size"
        )
