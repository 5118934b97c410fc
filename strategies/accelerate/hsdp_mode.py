"""`accelerate-hsdp`: Accelerate driving FSDP2 hybrid sharding, configured as its users configure
it: `ParallelismConfig(dp_replicate_size, dp_shard_size)` beside the FSDP2 plugin of
accelerate-fsdp. Accelerate builds the (dp_replicate, dp_shard) device mesh and shards each block
over it; the layout is hsdp's (strategies/hsdp.py), shard_size ranks (by default one node's) per
shard group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.accelerate.environment import launched_parallelism
from strategies.accelerate.fsdp_mode import AccelerateFSDPStrategy
from strategies.base import Preset, RunContext, StrategyError
from strategies.mesh_layout import MeshLayout
from strategies.parallel_dims import ModelFacts, mesh_layout
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    from accelerate import ParallelismConfig


class AccelerateHSDPStrategy(AccelerateFSDPStrategy):
    description = "Accelerate driving FSDP2 hybrid shard (ParallelismConfig dp_replicate_size x dp_shard_size)"
    presets = (
        Preset(
            "accelerate-hsdp",
            description,
            plan=PlanModel("torch", 3, "low_precision", via_accelerate=True, hybrid_shard=True),
        ),
    )

    def __init__(self, ctx: RunContext, *, shard_size: int | None = None):
        super().__init__(ctx)
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"shard_size": shard_size})

    @property
    def mode(self) -> str:
        return "hsdp"

    @classmethod
    def mesh_layout(
        cls, world_size: int, local_world_size: int, options: dict[str, Any], model: ModelFacts | None = None
    ) -> MeshLayout:
        """hsdp's layout (strategies/parallel_dims.py), its sizes defaulting as hsdp's do."""
        return mesh_layout("fsdp", "replicate x shard", options, world_size, local_world_size, model)

    def _parallelism_config(self) -> ParallelismConfig:
        return parallelism_config(self.mesh, dp_replicate_size="replicate", dp_shard_size="shard")

    def _mode_detail(self) -> str:
        return f"{super()._mode_detail()}, {self.mesh.describe()}"


def parallelism_config(mesh: MeshLayout, **sizes: str) -> ParallelismConfig:
    """Accelerate's ParallelismConfig with each of `sizes` (dp_replicate_size="replicate", ...) the
    size of that dimension of `mesh`; under `accelerate launch`, what its config says must agree."""
    from accelerate import ParallelismConfig

    wanted = {key: mesh.shape[mesh.dims.index(dim)] for key, dim in sizes.items()}
    launched = launched_parallelism()
    if launched is not None:
        differing = {k: v for k, v in launched.items() if wanted.get(k, 1) != v}
        if differing:
            key, value = next(iter(differing.items()))
            raise StrategyError(
                f"accelerate launch set parallelism_config_{key}={value} but this run's {mesh.describe()} needs "
                f"{wanted.get(key, 1)}: launch with --parallelism_config_{key} {wanted.get(key, 1)}, or set the "
                "strategy's size option to match"
            )
    return ParallelismConfig(**wanted)
