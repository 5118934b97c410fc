"""`fsdp-tp`: tensor parallel inside each group of tp_size ranks (by default one node's, at most
8), FSDP2 across the groups: torchtitan's 2D layout (apply_tp, then apply_fsdp on the other
dimension of the mesh).

The model's own plan splits it (models/tensor_parallel.py: parabench's GPT its own, `hf:` models
their Hugging Face plan), with DTensor's parallel styles on the mesh's "tp" dimension; then each
block and the root are sharded with fully_shard on its "shard" dimension. The ranks of a
tensor-parallel group read the same micro-batch: the data-parallel degree is the number of
groups. Checkpoints are DCP directories holding every tensor whole, as `fsdp` and `hsdp` write
them: any of the three loads the others' natively, at any world size.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from strategies.base import Preset, RunContext, StrategyError
from strategies.fsdp import FSDPStrategy
from strategies.mesh_layout import MeshLayout, check_divides
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh

MAX_DEFAULT_TP = 8  # tensor parallel pays inside a node's NVLink domain, rarely past 8 GPUs


class FSDPTensorParallelStrategy(FSDPStrategy):
    description = "tensor parallel inside each group of tp_size ranks, FSDP2 across the groups"
    presets = (
        Preset(
            "fsdp-tp",
            "tensor parallel inside a node (attention and MLP column/row-wise), FSDP2 across nodes",
            {"reshard_after_forward": True, "cpu_offload": False},
            PlanModel("torch", 3, "low_precision", tensor_parallel=True),
        ),
    )
    listing_order = 22
    backend_modules = (*FSDPStrategy.backend_modules, "torch.distributed.tensor.parallel")

    def __init__(
        self,
        ctx: RunContext,
        *,
        tp_size: int | None = None,
        sequence_parallel: bool = True,
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
        if not isinstance(sequence_parallel, bool):
            raise StrategyError(f"strategy_options.sequence_parallel={sequence_parallel} must be true or false")
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"tp_size": tp_size})
        self.tp_size = self.mesh.shape[self.mesh.dims.index("tp")]
        # Asked for; the model's plan may have no sequence split (Hugging Face plans have none).
        self.sequence_parallel = sequence_parallel
        self._mesh_2d: DeviceMesh | None = None
        self._tp_layout = ""  # what the plan split, for the run's header (set at setup)

    @classmethod
    def fp8_refusal(cls, options: dict[str, Any]) -> str | None:
        return (
            "does not train in fp8: float8 under tensor parallel takes torchao's own parallel styles, which "
            "parabench does not apply yet; compare it with precision=bf16"
        )

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        return tensor_parallel_layout(world_size, local_world_size, options.get("tp_size"))

    def check_model(self, model: nn.Module) -> None:
        from models.tensor_parallel import plan_of, uses_sequence_parallel

        plan = plan_of(model, self.tp_size, self.sequence_parallel)
        seq_len = getattr(self.ctx.config, "seq_len", None)
        if uses_sequence_parallel(plan) and seq_len is not None and seq_len % self.tp_size:
            raise StrategyError(
                f"seq_len={seq_len} does not split over tp_size={self.tp_size} for sequence parallel: use a seq_len "
                f"that {self.tp_size} divides, or strategy_options.sequence_parallel=false"
            )

    def _fsdp_mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        self._mesh_2d = init_device_mesh(self.ctx.device.type, self.mesh.shape, mesh_dim_names=self.mesh.dims)
        return self._mesh_2d[self.mesh.data_dims[0]]

    def _before_sharding(self, model: nn.Module) -> None:
        from models.tensor_parallel import describe, parallelize, plan_of, uses_sequence_parallel

        assert self._mesh_2d is not None
        # The gradient norm of the 2D parameters is reduced over one mesh dimension, then the other:
        # DTensor warns that one collective would be quicker; for a scalar once a step it is not.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        plan = plan_of(model, self.tp_size, self.sequence_parallel)
        parallelize(model, self._mesh_2d["tp"], plan)
        if uses_sequence_parallel(plan):
            sequence = "sequence parallel"
        elif self.sequence_parallel:
            sequence = "no sequence parallel (the model's plan splits no sequence)"
        else:
            sequence = "no sequence parallel (sequence_parallel=false)"
        self._tp_layout = f"tensor parallel over {self.tp_size} ({describe(plan)}; {sequence})"

    def _policies(self) -> dict:
        return {**super()._policies(), "shard_placement_fn": _fsdp_shard_dim}

    def _layout_name(self) -> str:
        return f"{self._tp_layout}, then fsdp"


def _fsdp_shard_dim(param: Any) -> Any:
    """Where FSDP splits a parameter: dimension 0 as always, but dimension 1 for one tensor parallel
    split by a strided shard (a fused q;k;v), whose FSDP split of the same dimension would nest two
    strided shards that DTensor cannot put back together."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(param, DTensor) and any(isinstance(p, _StridedShard) for p in param.placements):
        return Shard(1)
    return None


def tensor_parallel_layout(
    world_size: int,
    local_world_size: int,
    tp_size: int | None,
    data_dim: str = "shard",
    across: str = "FSDP shards",
    without_tp: str = "fsdp",
) -> MeshLayout:
    """data x tp: groups of tp_size ranks (by default one node's, at most 8) split each layer, the
    data-parallel layout (`across`: FSDP by default) runs across the groups along `data_dim`, the
    one dimension that reads different data; `without_tp` names what tp 1 leaves."""
    tp = check_divides("tp_size", min(MAX_DEFAULT_TP, local_world_size) if tp_size is None else tp_size, world_size)
    groups = world_size // tp
    notes = []
    if groups == 1:
        notes.append(f"one data-parallel rank: tensor parallel alone, {across} over one rank")
    if tp == 1:
        notes.append(f"tp 1: no tensor parallel, the layout of {without_tp}")
    return MeshLayout((groups, tp), (data_dim, "tp"), (data_dim,), tuple(notes))
