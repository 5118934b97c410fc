"""`accelerate-fsdp-tp`: Accelerate driving tensor parallel inside each group of tp_size ranks and
FSDP2 across, configured as its users configure it: `ParallelismConfig(dp_shard_size, tp_size)`,
the model split over the mesh's "tp" dimension before prepare() (as `from_pretrained(tp_plan=
"auto", device_mesh=accelerator.torch_device_mesh)` does, here with the model's own plan:
models/tensor_parallel.py), then Accelerate's FSDP2 over the data-parallel dimension. The layout
is fsdp-tp's (strategies/fsdp_tp.py), without sequence parallel, which Hugging Face's plans do not
use.

Accelerate's prepare() of a tensor-parallel model under FSDP2 imports transformers'
ReplicateParallel, which transformers 5.0.0 is the last release to have: the dev extra pins
that pair (pyproject.toml); with a later transformers the name is unavailable, with that reason
and the release to install.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from strategies.accelerate.fsdp_mode import AccelerateFSDPStrategy
from strategies.accelerate.hsdp_mode import parallelism_config
from strategies.base import ModelUnsupported, Preset, RunContext, missing_package_reason
from strategies.mesh_layout import MeshError, MeshLayout
from strategies.parallel_dims import ModelFacts, mesh_layout
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch.nn as nn
    from accelerate import ParallelismConfig

# The dev extra pins it beside Accelerate 1.15 (pyproject.toml).
LAST_WITH_REPLICATE_PARALLEL = "5.0.0"


class AccelerateFSDPTensorParallelStrategy(AccelerateFSDPStrategy):
    description = "Accelerate driving tensor parallel x FSDP2 (ParallelismConfig dp_shard_size x tp_size)"
    presets = (
        Preset(
            "accelerate-fsdp-tp",
            description,
            plan=PlanModel(
                "torch", 3, "low_precision", via_accelerate=True, tensor_parallel=True, sequence_parallel=False
            ),
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
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        """fsdp-tp's layout (strategies/parallel_dims.py), tp_size defaulting as fsdp-tp's does where that
        leaves FSDP ranks to shard over, else the largest below it that does."""
        layout = mesh_layout("fsdp", "shard x tp", options, world_size, local_world_size, model)
        tp = layout.shape[layout.dims.index("tp")] if "tp" in layout.dims else 1
        if shard_ranks_left(tp, world_size):
            return layout
        if options.get("tp_size") is not None:
            raise MeshError(no_shard_ranks(tp, world_size))
        fewer = {**options, "tp_size": accelerate_tp(tp, world_size)}
        return mesh_layout("fsdp", "shard x tp", fewer, world_size, local_world_size, model)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return super().unavailable_reason() or accelerate_tp_blocker()

    def check_model(self, model: nn.Module) -> None:
        super().check_model(model)  # the classes a launch or a file wraps
        from models.tensor_parallel import plan_of

        plan = plan_of(model, self.tp_size, sequence_parallel=False)
        packed = [pattern for pattern, style in plan.items() if style == "packed_colwise_qkv"]
        if packed and self.tp_size > 1:  # at tp 1 nothing is split before FSDP2's own split
            # Accelerate's FSDP2 splits every parameter along dimension 0, which the strided split of a
            # fused q;k;v already splits: DTensor cannot put that back together (fsdp-tp splits it along 1).
            raise ModelUnsupported(
                f"accelerate-fsdp-tp cannot shard {packed[0]} (a fused q;k;v split by heads): Accelerate's FSDP2 "
                "would split it again along the same dimension; use fsdp-tp, or a model with separate q, k, v"
            )

    def _parallelism_config(self) -> ParallelismConfig:
        return parallelism_config(self.mesh, dp_shard_size="shard", tp_size="tp")

    def _before_optimizer(self, model: nn.Module) -> None:
        from models.tensor_parallel import parallelize, plan_of

        if self.tp_size == 1:  # Accelerate's mesh has no "tp" dimension then: FSDP2 alone, as planned
            return
        tp_mesh = self.accelerator.torch_device_mesh["tp"]
        parallelize(model, tp_mesh, plan_of(model, self.tp_size, sequence_parallel=False))

    def _mode_detail(self) -> str:
        return f"{super()._mode_detail()}, {self.mesh.describe()}"


# Accelerate's ParallelismConfig refuses FSDP with no dimension to shard over (dp_shard_size and cp_size
# both 1: accelerate/parallelism_config.py, whose comment says prepare() would otherwise fail on the mesh
# dimension it lacks), so tensor parallel must leave it two or more ranks of the world.
MIN_SHARD_RANKS = 2


def shard_ranks_left(tp: int, world_size: int) -> bool:
    """Whether tp leaves Accelerate's FSDP2 ranks to shard over (one process alone has no mesh to lay out)."""
    return world_size < MIN_SHARD_RANKS or world_size // tp >= MIN_SHARD_RANKS


def accelerate_tp(tp: int, world_size: int) -> int:
    """The largest tp, halving from `tp`, that leaves Accelerate's FSDP2 ranks to shard over: a default
    tp that took the whole world would be refused by Accelerate."""
    while tp > 1 and not shard_ranks_left(tp, world_size):
        tp //= 2
    return tp


def accelerate_tp_reason(tp: int, world_size: int) -> str:
    """Why accelerate-fsdp-tp runs at `tp` where the heads would take more: in words, for the plan."""
    return (
        f"twice that would leave Accelerate's FSDP2 fewer than {MIN_SHARD_RANKS} of the {world_size} GPUs to shard "
        "over, which its ParallelismConfig refuses, so its run sizes it so; strategy_options.tp_size= sets another."
    )


def no_shard_ranks(tp: int, world_size: int) -> str:
    return (
        f"accelerate-fsdp-tp: tp_size={tp} takes all {world_size} ranks and leaves Accelerate's FSDP2 none to shard "
        f"over (its ParallelismConfig needs dp_shard_size of {MIN_SHARD_RANKS} or more): give a tp_size of at most "
        f"{world_size // MIN_SHARD_RANKS}, more GPUs, or fsdp-tp"
    )


def accelerate_tp_blocker() -> str | None:
    """Why Accelerate's tensor-parallel prepare() under FSDP2 cannot run with the installed
    packages, or None: it imports ReplicateParallel from transformers' tensor-parallel module,
    which no release after 5.0.0 has. Read from the packages' versions: importing transformers
    would cost `runner.py list` a second."""
    install = f"pip install 'transformers=={LAST_WITH_REPLICATE_PARALLEL}'"
    missing = missing_package_reason("transformers", f"Accelerate's tensor parallel needs it: {install}")
    if missing:
        return missing
    installed = version("transformers")
    if Version(installed) > Version(LAST_WITH_REPLICATE_PARALLEL):
        return (
            f"Accelerate {version('accelerate')}'s tensor-parallel prepare() under FSDP2 imports ReplicateParallel "
            f"from transformers, which transformers {installed} no longer has: {install} (the last release with "
            "it, the one parabench's tests pin), or use fsdp-tp"
        )
    return None
