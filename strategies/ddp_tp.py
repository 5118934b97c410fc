"""`ddp-tp`: Megatron-LM's layout in torch: tensor parallel (with sequence parallel) inside each group
of tp_size ranks (by default one node's, at most 8), data parallel across the groups.

The tensor-parallel part is fsdp-tp's: the model's plan on the mesh's "tp" dimension. Across the
groups runs torch's composable `replicate`, DDP rebuilt on FSDP2's machinery: each block and the root
a unit whose gradients are all-reduced over the "replicate" dimension as its backward ends, every
parameter whole on every data-parallel rank (its tensor-parallel part of it). DistributedDataParallel
takes a sliced device mesh only by turning the DTensor parameters into plain tensors around each
forward (torch.distributed.tensor.parallel.ddp), after which the module no longer lists them as
parameters; replicate keeps them the DTensors the plan made, so clipping, the state-dict helpers and
DCP see them as under fsdp-tp. Like fsdp, replicate computes with a copy of each unit's parameters
(the mixed-precision policy's cast in bf16) from its forward to its backward.

Checkpoints are DCP directories in fsdp's layout (strategies/dcp_layout.py): fsdp, hsdp, fsdp-tp,
ddp-tp and zero1-tp load each other's natively, at any world size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.base import Preset, RunContext
from strategies.fsdp_tp import FSDPTensorParallelStrategy, tensor_parallel_layout
from strategies.mesh_layout import MeshLayout
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh

DATA_DIM = "replicate"


class DDPTensorParallelStrategy(FSDPTensorParallelStrategy):
    description = "tensor parallel inside each group of tp_size ranks, data parallel (replicate) across the groups"
    presets = (
        Preset(
            "ddp-tp",
            "tensor and sequence parallel inside a node, data parallel across nodes (Megatron-LM's layout)",
            plan=PlanModel("torch", 0, "low_precision", reshard_after_forward=False, tensor_parallel=True),
        ),
    )
    listing_order = 23
    without_tp = "ddp"  # what the layout amounts to at tp 1, for the mesh's notes

    def __init__(
        self,
        ctx: RunContext,
        *,
        tp_size: int | None = None,
        sequence_parallel: bool = True,
        sync_each_micro_step: bool = False,
    ):
        # DDP's default under accumulation: the all-reduce skipped until the last micro-step.
        super().__init__(
            ctx,
            tp_size=tp_size,
            sequence_parallel=sequence_parallel,
            reshard_after_forward=False,
            sync_each_micro_step=sync_each_micro_step,
        )

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        return tensor_parallel_layout(
            world_size, local_world_size, options.get("tp_size"), DATA_DIM, "gradients all-reduced", cls.without_tp
        )

    def _wrap(self, module: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, policies: dict) -> None:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(module, mesh=mesh, mp_policy=policies["mp_policy"])

    def _layout_name(self) -> str:
        return f"{self._tp_layout}, then replicate"
