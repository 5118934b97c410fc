"""`fsdp-cp`: context parallel over groups of cp_size ranks, FSDP2 over every rank: each sequence is
split over the ranks of a group, as torchtitan and DeepSpeed-Ulysses split long sequences.

The ranks of a context-parallel group read the same micro-batch and each computes on its share of
every sequence (models/context_parallel.py): embeddings at the share's positions, norms and MLPs on
its tokens alone, and the attention over the whole sequence, by strategy_options.cp_attention:
- all-to-all (the default): two all-to-alls a layer (scatter the heads and gather the sequence,
  then back), which gloo runs on the CPU as NCCL does on GPUs; cp_size must share out the heads;
- ring: torch's ring attention, keys and values passed around the group; CUDA only (the CPU's SDPA
  has no sharding strategy in torch's ring), any number of heads.
Activations per rank fall by cp_size; the parameters are not split by it. FSDP2 shards the
parameters, gradients and optimizer state over all the ranks (data parallel x context parallel),
and its gradient average over all of them is the global batch's mean, each rank's loss being its
own tokens' mean.

Models: parabench's GPT and Hugging Face causal LMs (model=hf:...); any other is refused, its
attention being unknown.

Checkpoints are fsdp's: the model keeps its names and FSDP shards it over all the ranks, so fsdp,
hsdp, fsdp-tp and fsdp-cp load each other's natively.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strategies.base import ModelUnsupported, Preset, RunContext, StrategyError
from strategies.fsdp import FSDPStrategy
from strategies.mesh_layout import MeshLayout, check_divides
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch.nn as nn

CP_DIM = "cp"
MAX_DEFAULT_CP = 8  # the all-to-alls of every layer stay inside a node's NVLink domain
DATA_DIM = "shard"


class FSDPContextParallelStrategy(FSDPStrategy):
    description = "context parallel (sequences split over cp_size ranks, all-to-all or ring attention), FSDP2 over all"
    presets = (
        Preset(
            "fsdp-cp",
            "context parallel: each sequence split over cp_size ranks (all-to-all or ring attention), FSDP2 over all",
            {"reshard_after_forward": True, "cpu_offload": False},
            PlanModel("torch", 3, "low_precision"),
        ),
    )
    listing_order = 26

    def __init__(
        self,
        ctx: RunContext,
        *,
        cp_size: int | None = None,
        cp_attention: str = "all-to-all",
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
        self.mesh = ctx.mesh or self.mesh_layout(ctx.world_size, ctx.world_size, {"cp_size": cp_size})
        self.cp_size = self.mesh.shape[self.mesh.dims.index(CP_DIM)]
        self.cp_attention = _checked_attention(cp_attention)

    @classmethod
    def mesh_layout(cls, world_size: int, local_world_size: int, options: dict[str, Any]) -> MeshLayout:
        """shard x cp: by default the ranks of one node (at most 8) split each sequence, where the
        two all-to-alls of every layer run over the node's links."""
        cp_size = options.get("cp_size")
        cp = check_divides("cp_size", min(MAX_DEFAULT_CP, local_world_size) if cp_size is None else cp_size, world_size)
        notes = []
        if cp == world_size:
            notes.append("one data-parallel rank: context parallel alone")
        if cp == 1:
            notes.append("cp 1: no context parallel, the layout of fsdp")
        return MeshLayout((world_size // cp, cp), (DATA_DIM, CP_DIM), (DATA_DIM,), tuple(notes))

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        if options.get("cp_attention") == "ring" and device_type != "cuda":
            return (
                "cp_attention=ring runs torch's ring attention, whose SDPA has no sharding strategy on the CPU: "
                "use cp_attention=all-to-all here, ring on GPUs"
            )
        return None

    def check_model(self, model: nn.Module) -> None:
        from models.context_parallel import ContextParallelError, UnsplittableModel, check_context_parallel

        seq_len = getattr(self.ctx.config, "seq_len", None)
        try:
            check_context_parallel(model, self.cp_size, seq_len, attention=self.cp_attention)
        except UnsplittableModel as exc:  # a compare skips fsdp-cp for this model and runs the rest
            raise ModelUnsupported(f"fsdp-cp: {exc}") from None
        except ContextParallelError as exc:
            raise StrategyError(f"fsdp-cp: {exc}") from None

    def _before_sharding(self, model: nn.Module) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from models.context_parallel import split_sequences

        self.check_model(model)
        mesh = init_device_mesh(self.ctx.device.type, self.mesh.shape, mesh_dim_names=self.mesh.dims)
        split_sequences(model, mesh[CP_DIM], self.cp_attention)

    def _layout_name(self) -> str:
        return f"context parallel over {self.cp_size} ({self.cp_attention} attention), then fsdp over all ranks"


def _checked_attention(attention: str) -> str:
    from models.context_parallel import CP_ATTENTIONS

    if attention not in CP_ATTENTIONS:
        choices = " or ".join(CP_ATTENTIONS)
        raise StrategyError(f"fsdp-cp: strategy_options.cp_attention={attention!r}: use {choices}")
    return attention
