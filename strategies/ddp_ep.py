"""`ddp-ep`: expert parallel inside each group of ep_size ranks, DDP for everything else.

A 2D mesh dp x ep, every rank a data-parallel rank (each reads its own micro-batch): each MoE layer's
experts are sharded over the ep ranks (models/expert_parallel.py: tokens sent to their expert's rank
by all-to-all and back), every other parameter is whole on every rank and all-reduced by DDP over all
of them. DDP leaves the experts' weights out; their gradients are reduced in step() over the ranks
holding the same experts (the dp dimension), once per step whatever the accumulation. Clipping
takes the norm over the whole model: the dense gradients (the same on every rank) and every rank's
experts.

Checkpoints: rank 0 writes the whole model (the experts gathered), so single, ddp and export read it;
the first rank of each expert group writes its optimizer state, so this strategy at the same ep_size
resumes exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.base import OptimizerFactory, Preset, RunContext
from strategies.ddp import DDPStrategy
from strategies.mesh_layout import MeshLayout, check_divides
from strategies.plan_model import PlanModel
from strategies.single import MODEL_FILE

if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh

    from strategies.parallel_dims import ModelFacts

DATA_DIM, EXPERT_DIM = "dp", "ep"


def expert_parallel_layout(world_size: int, ep_size: Any) -> MeshLayout:
    """dp x ep, both dimensions reading their own data (the ep ranks are data-parallel ranks too)."""
    ep = check_divides("ep_size", world_size if ep_size is None else ep_size, world_size)
    notes = ["ep 1: no expert parallel, the layout of ddp"] if ep == 1 else []
    return MeshLayout((world_size // ep, ep), (DATA_DIM, EXPERT_DIM), (DATA_DIM, EXPERT_DIM), tuple(notes))


class DDPExpertParallelStrategy(DDPStrategy):
    description = "expert parallel over ep_size ranks (experts sharded, tokens by all-to-all), DDP for the rest"
    presets = (
        Preset(
            "ddp-ep",
            "experts sharded over each group of ep_size ranks (all-to-all dispatch), the rest replicated by DDP",
            plan=PlanModel("torch", 0, data_parallel=True, expert_parallel=True),
        ),
    )
    listing_order = 27
    checkpoint_reshards = False

    def __init__(
        self,
        ctx: RunContext,
        *,
        ep_size: int | None = None,
        bucket_cap_mb: float = 25.0,
        static_graph: bool = False,
    ):
        super().__init__(ctx, bucket_cap_mb=bucket_cap_mb, static_graph=static_graph)
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"ep_size": ep_size})
        self.ep_size = self.mesh.shape[1]
        # The optimizer state of a rank's experts loads only into the same experts.
        self.checkpoint_format = f"torch-ep{self.ep_size}"
        self.device_mesh: DeviceMesh | None = None
        self.sharded: list[str] = []  # the names of the sharded expert parameters

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        return expert_parallel_layout(world_size, options.get("ep_size"))

    def check_model(self, model: nn.Module) -> None:
        from models.expert_parallel import check_divides_experts
        from models.routing import experts_modules

        found = experts_modules(model)
        if not found:
            raise self._no_experts(model)
        for _, experts in found:
            check_divides_experts(experts.num_experts, self.ep_size)

    def _no_experts(self, model: nn.Module) -> Exception:
        from strategies.base import ModelUnsupported

        return ModelUnsupported(
            f"strategy {self.name!r} shards a mixture-of-experts model's experts, and {type(model).__name__} has none: "
            "use a model such as moe-nano or hf:MixtralConfig, or ddp for this one"
        )

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.nn.parallel import DistributedDataParallel

        from models.expert_parallel import shard_experts

        self.check_model(model)
        self.device_mesh = init_device_mesh(self.ctx.device.type, self.mesh.shape, mesh_dim_names=self.mesh.dims)
        model = model.to(self.ctx.device)
        self.sharded = shard_experts(model, self.device_mesh.get_group(EXPERT_DIM))
        # DDP reduces over every rank; the experts are reduced over their own group in step().
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, self.sharded)
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)
        self.optimizer = optimizer_factory(self.model)
        self.scaler = self._make_scaler()
        self.layout = (
            f"ddp-ep: {len(self.sharded)} expert weights sharded over {self.ep_size} ranks, "
            f"reduced over {self.mesh.shape[0]}; the rest replicated by DDP"
        )
        return self.model, self.optimizer

    def _make_scaler(self) -> torch.amp.GradScaler | None:
        if self.ctx.precision != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        # The ranks hold different experts: an overflow in one rank's must skip the step on every rank.
        return ShardedGradScaler(self.ctx.device.type)

    def _expert_params(self) -> list[nn.Parameter]:
        from models.expert_parallel import expert_parameters

        return expert_parameters(self.model)

    def step(self) -> None:
        from models.expert_parallel import reduce_expert_gradients

        assert self.device_mesh is not None, "setup() first"
        reduce_expert_gradients(self._expert_params(), self.device_mesh.get_group(DATA_DIM), self.ctx.world_size)
        super().step()

    def clip_gradients(self) -> None:
        import torch

        from models.expert_parallel import expert_grad_norm_squared

        assert self.model is not None and self.optimizer is not None and self.device_mesh is not None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.ctx.grad_clip <= 0:
            return
        experts = self._expert_params()
        expert_ids = set(map(id, experts))
        dense = [p.grad for p in self.model.parameters() if p.grad is not None and id(p) not in expert_ids]
        squared = torch.nn.utils.get_total_norm(dense, foreach=True).pow(2) if dense else 0.0
        squared = squared + expert_grad_norm_squared(experts, self.device_mesh.get_group(EXPERT_DIM))
        params = [p for p in self.model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(params, self.ctx.grad_clip, squared.sqrt(), foreach=True)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from models.expert_parallel import gather_experts

        assert self.model is not None and self.device_mesh is not None, "setup() first"
        local = {name: t.detach().cpu() for name, t in self.model.module.state_dict().items()}
        whole = gather_experts(local, self.sharded, self.device_mesh.get_group(EXPERT_DIM))
        return whole if self.ctx.rank == 0 else {}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from models.expert_parallel import local_experts

        assert self.model is not None and self.device_mesh is not None, "setup() first"
        mine = local_experts(state, self.sharded, self.device_mesh.get_group(EXPERT_DIM))
        self.model.module.load_state_dict(mine, strict=True)

    def _optimizer_file(self) -> str:
        assert self.device_mesh is not None
        return f"optimizer_ep{self.device_mesh.get_local_rank(EXPERT_DIM)}.pt"

    def save(self, path: Path) -> None:
        import torch

        assert self.optimizer is not None and self.device_mesh is not None, "setup() first"
        model = self.full_state_dict()
        if self.ctx.rank == 0:
            torch.save(model, path / MODEL_FILE)
        # The ranks of a dp group hold the same experts and the same optimizer state: the first writes it.
        if self.device_mesh.get_local_rank(DATA_DIM) == 0:
            state = {"optimizer": self.optimizer.state_dict(), "scaler": self._scaler_state()}
            torch.save(state, path / self._optimizer_file())

    def load(self, path: Path) -> None:
        import torch

        assert self.optimizer is not None, "setup() first"
        self.load_full_state_dict(torch.load(path / MODEL_FILE, map_location="cpu", weights_only=True))
        rest = torch.load(path / self._optimizer_file(), map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(rest["optimizer"])
        self._load_scaler_state(rest["scaler"])
