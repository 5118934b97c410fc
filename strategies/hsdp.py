"""`hsdp`: FSDP2 on a 2D mesh, replicate x shard (hybrid sharding).

Parameters, gradients and optimizer state are sharded inside each group of shard_size ranks
(by default one node) and replicated across the groups: the all-gathers and reduce-scatters
stay on a node's links, and only one all-reduce of a shard's gradients crosses nodes per step.
Every rank is a data-parallel rank (replicate x shard). Checkpoints are DCP directories, the
format `fsdp` writes: either loads the other's, at any world size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.base import Preset, RunContext
from strategies.fsdp import FSDPStrategy
from strategies.mesh_layout import MeshLayout, check_divides
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class HSDPStrategy(FSDPStrategy):
    description = "FSDP2 hybrid shard: sharded inside each group of shard_size ranks, replicated across"
    presets = (
        Preset(
            "hsdp",
            "FSDP2 hybrid shard (replicate x shard): sharded inside a node, replicated across nodes",
            {"reshard_after_forward": True, "cpu_offload": False},
            PlanModel("torch", 3, "low_precision", hybrid_shard=True),
        ),
    )
    listing_order = 21

    def __init__(
        self,
        ctx: RunContext,
        *,
        shard_size: int | None = None,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        prefetch_blocks: int = 0,
        sync_each_micro_step: bool = True,
    ):
        super().__init__(
            ctx,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
            prefetch_blocks=prefetch_blocks,
            sync_each_micro_step=sync_each_micro_step,
        )
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"shard_size": shard_size})

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        return hybrid_layout(world_size, local_world_size, options.get("shard_size"))

    def _fsdp_mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        # A 2D mesh makes fully_shard hybrid: shard along the last dimension, replicate along the first.
        return init_device_mesh(self.ctx.device.type, self.mesh.shape, mesh_dim_names=self.mesh.dims)

    def _layout_name(self) -> str:
        return "hsdp"


def hybrid_layout(world_size: int, local_world_size: int, shard_size: int | None) -> MeshLayout:
    """replicate x shard: shard_size ranks (by default one node's) hold one copy of the model between them."""
    shard = check_divides("shard_size", local_world_size if shard_size is None else shard_size, world_size)
    replicate = world_size // shard
    notes = []
    if replicate == 1:
        notes.append("one replica: the layout of fsdp")
    if shard == 1:
        notes.append("shards of one rank: every rank holds the whole model, as under ddp")
    return MeshLayout((replicate, shard), ("replicate", "shard"), ("replicate", "shard"), tuple(notes))
