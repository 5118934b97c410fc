"""`accelerate-fsdp-tp`: Accelerate driving tensor parallel inside each group of tp_size ranks and
FSDP2 across, configured as its users configure it: `ParallelismConfig(dp_shard_size, tp_size)`,
the model split over the mesh's "tp" dimension before prepare() (as `from_pretrained(tp_plan=
"auto", device_mesh=accelerator.torch_device_mesh)` does, here with the model's own plan:
models/tensor_parallel.py), then Accelerate's FSDP2 over the data-parallel dimension. The layout
is fsdp-tp's (strategies/fsdp_tp.py), without sequence parallel, which Hugging Face's plans do not
use.

Accelerate's prepare() of a tensor-parallel model under FSDP2 imports transformers'
ReplicateParallel, which transformers removed (5.x): where that import fails, the name is
unsupported, with that reason, on any device.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from strategies.accelerate.fsdp_mode import AccelerateFSDPStrategy
from strategies.accelerate.hsdp_mode import parallelism_config
from strategies.base import Preset, RunContext, StrategyError
from strategies.fsdp_tp import tensor_parallel_layout
from strategies.mesh_layout import MeshLayout
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch.nn as nn
    from accelerate import ParallelismConfig


class AccelerateFSDPTensorParallelStrategy(AccelerateFSDPStrategy):
    description = "Accelerate driving tensor parallel x FSDP2 (ParallelismConfig dp_shard_size x tp_size)"
    presets = (
        Preset(
            "accelerate-fsdp-tp",
            description,
            plan=PlanModel("torch", 3, "low_precision", via_accelerate=True, tensor_parallel=True),
        ),
    )

    def __init__(self, ctx: RunContext, *, tp_size: int | None = None):
        super().__init__(ctx)
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"tp_size": tp_size})
        self.tp_size = self.mesh.shape[self.mesh.dims.index("tp")]

    @property
    def mode(self) -> str:
        return "fsdp-tp"

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        return tensor_parallel_layout(world_size, local_world_size, options.get("tp_size"))

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        return accelerate_tp_blocker()

    def check_model(self, model: nn.Module) -> None:
        from models.tensor_parallel import plan_of

        plan = plan_of(model, self.tp_size, sequence_parallel=False)
        packed = [pattern for pattern, style in plan.items() if style == "packed_colwise_qkv"]
        if packed:
            # Accelerate's FSDP2 splits every parameter along dimension 0, which the strided split of a
            # fused q;k;v already splits: DTensor cannot put that back together (fsdp-tp splits it along 1).
            raise StrategyError(
                f"accelerate-fsdp-tp cannot shard {packed[0]} (a fused q;k;v split by heads): Accelerate's FSDP2 "
                "would split it again along the same dimension; use fsdp-tp, or a model with separate q, k, v"
            )

    def _parallelism_config(self) -> ParallelismConfig:
        return parallelism_config(self.mesh, dp_shard_size="shard", tp_size="tp")

    def _before_optimizer(self, model: nn.Module) -> None:
        from models.tensor_parallel import parallelize, plan_of

        blocker = accelerate_tp_blocker()
        if blocker:
            raise StrategyError(f"accelerate-fsdp-tp cannot run here: {blocker}")
        tp_mesh = self.accelerator.torch_device_mesh["tp"]
        parallelize(model, tp_mesh, plan_of(model, self.tp_size, sequence_parallel=False))

    def _mode_detail(self) -> str:
        return f"{super()._mode_detail()}, {self.mesh.describe()}"


def accelerate_tp_blocker() -> str | None:
    """Why Accelerate's tensor-parallel prepare() under FSDP2 cannot run with the installed
    packages, or None: it imports ReplicateParallel from transformers' tensor-parallel module."""
    try:
        module = importlib.import_module("transformers.integrations.tensor_parallel")
    except ImportError as exc:
        return f"Accelerate's tensor parallel needs transformers ({exc}): pip install transformers"
    if not hasattr(module, "ReplicateParallel"):
        import accelerate
        import transformers

        return (
            f"Accelerate {accelerate.__version__}'s tensor-parallel prepare() under FSDP2 imports ReplicateParallel "
            f"from transformers, which transformers {transformers.__version__} no longer has: use fsdp-tp, or "
            "versions of the two that agree"
        )
    return None
