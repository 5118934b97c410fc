"""The torch mesh applied to a model, one small function per dimension, in torchtitan's order: the
pipeline cut first (strategies/torch_mesh.py), then on each part tensor parallel, context parallel,
and the data-parallel engine over the data dimensions.

The device meshes are built once from the ParallelDims: a root mesh pp x replicate x shard_cp x tp,
where shard_cp is FSDP's dimension (shard x cp: FSDP shards over the context-parallel ranks too, as
torchtitan's `dp_shard_cp`). The context-parallel group is shard_cp unflattened; the engine's mesh
is sliced from the root (replicate x shard_cp for hybrid sharding) or flattened from it (replicate
and zero1 reduce over replicate x cp as one group). torch 2.13 warns when a flattened dimension is
sliced from the root, so none is: each mesh is kept as built.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strategies.parallel_dims import CONTEXT, PIPELINE, REPLICATE, SHARD, TENSOR, ParallelDims

if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.optim import ZeroRedundancyOptimizer

SHARD_CP = "shard_cp"
PARAMS = "params"
# The data dimension ep is borrowed from, unflattened: the ranks outside ep (torchtitan's efsdp), ep.
EXPERT_SHARD, EXPERT_REPLICATE = "efsdp", "ereplicate"


@dataclass
class Meshes:
    root: DeviceMesh
    data: DeviceMesh  # what the engine shards or reduces over
    tp: DeviceMesh | None
    cp: DeviceMesh | None
    pp: DeviceMesh | None
    ep: DeviceMesh | None = None
    expert_data: DeviceMesh | None = None  # what the engine shards or reduces the experts over


def build_meshes(dims: ParallelDims, engine: str, device_type: str) -> Meshes:
    from torch.distributed.device_mesh import init_device_mesh

    shape = (dims.pp, dims.dp_replicate, dims.dp_shard * dims.cp, dims.tp)
    root = init_device_mesh(device_type, shape, mesh_dim_names=(PIPELINE, REPLICATE, SHARD_CP, TENSOR))
    if engine == "fsdp":
        # Two dimensions make fully_shard hybrid: shard along the last, replicate along the first.
        data = root[REPLICATE, SHARD_CP] if dims.dp_replicate > 1 else root[SHARD_CP]
    elif dims.dp_replicate > 1 and dims.cp > 1:
        data = root[REPLICATE, SHARD_CP]._flatten("replicate_cp")
    else:
        data = root[SHARD_CP] if dims.cp > 1 else root[REPLICATE]
    cp = None
    if dims.cp > 1:
        cp = root[SHARD_CP]._unflatten(0, (dims.dp_shard, dims.cp), (SHARD, CONTEXT))[CONTEXT]
    ep, expert_data = _expert_meshes(root, dims, engine) if dims.ep > 1 else (None, None)
    return Meshes(
        root,
        data,
        root[TENSOR] if dims.tp > 1 else None,
        cp,
        root[PIPELINE] if dims.pp > 1 else None,
        ep,
        expert_data,
    )


def _expert_meshes(root: DeviceMesh, dims: ParallelDims, engine: str) -> tuple[DeviceMesh, DeviceMesh]:
    """The expert-parallel mesh, and the ranks holding the same experts that the engine shards or
    reduces them over: the data dimension ep is borrowed from (shard under fsdp, replicate else)
    unflattened into (the ranks outside ep, ep), ep varying fastest, as torchtitan's (efsdp, ep);
    hsdp's replicas hold the same experts too. (No context parallel beside it: dims_for refuses.)"""
    if engine == "fsdp":
        sparse = root._unflatten(SHARD_CP, (dims.dp_shard // dims.ep, dims.ep), (EXPERT_SHARD, "ep"))
        same = sparse[REPLICATE, EXPERT_SHARD] if dims.dp_replicate > 1 else sparse[EXPERT_SHARD]
        return sparse["ep"], same
    sparse = root._unflatten(REPLICATE, (dims.dp_replicate // dims.ep, dims.ep), (EXPERT_REPLICATE, "ep"))
    return sparse["ep"], sparse[EXPERT_REPLICATE]


def apply_tp(part: nn.Module, mesh: DeviceMesh, plan: dict[str, str], split: set[int] | None = None) -> None:
    """Split `part` (the model, or a pipeline stage of it under the model's names) by the model's
    plan, pattern by pattern on the modules the part holds: a stage's stand-ins for other stages'
    modules (models/stages.py) are left alone.

    `split` holds the ids of the modules already split on this rank, and gains those split here.
    A rank's stages (two under the interleaved schedules) share the modules without weights, which
    run on every stage (models/stages.py): the GPT's dropout, whose sequence_scatter hook, put on
    twice, would cut the sequence twice. Each module is split once, by the first stage to hold it."""
    from models.stages import SUBSTITUTES
    from models.tensor_parallel import parallelize, pattern_matches

    # The gradient norm of the 2D parameters is reduced over one mesh dimension, then the other:
    # DTensor warns that one collective would be quicker; for a scalar once a step it is not.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    done = set() if split is None else split
    held = {
        name: module
        for name, module in part.named_modules()
        if not isinstance(module, SUBSTITUTES) and id(module) not in done
    }
    mine = {name: style for pattern, style in plan.items() for name in held if pattern_matches(pattern, name)}
    if mine:
        parallelize(part, mesh, mine)
        done.update(id(held[name]) for name in mine)


def fsdp_shard_dim(param: Any) -> Any:
    """Where FSDP splits a parameter: dimension 0 as always, but dimension 1 for one tensor parallel
    split by a strided shard (a fused q;k;v), whose FSDP split of the same dimension would nest two
    strided shards that DTensor cannot put back together."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(param, DTensor) and any(isinstance(p, _StridedShard) for p in param.placements):
        return Shard(1)
    return None


def apply_engine(
    blocks: list[nn.Module], root: nn.Module, mesh: DeviceMesh, engine: str, reshard: bool, policies: dict
) -> None:
    """Each block, then `root` (what no block holds: embeddings, final norm, head), a unit of the
    engine over `mesh`: fully_shard under fsdp, torch's composable `replicate` (DDP on FSDP2's
    machinery, which keeps tensor-parallel parameters the DTensors the plan made) otherwise."""
    if engine == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, **policies)
        # The root is gathered again for backward at once: resharding it after forward buys nothing.
        fully_shard(root, mesh=mesh, reshard_after_forward=reshard and not blocks, **policies)
        return
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for module in (*blocks, root):
        replicate(module, mesh=mesh, mp_policy=policies["mp_policy"])


def apply_engine_to_experts(
    part: nn.Module, meshes: Meshes, engine: str, reshard: bool, policies: dict, divide_by: int
) -> int:
    """Each stacked experts module of `part`, its weights distributed over ep, a unit of the engine
    of its own over the ranks holding the same experts, before the blocks' units take the rest (as
    torchtitan's MoE parallelize does). Its gradients are summed over those ranks and divided by
    `divide_by`, the ranks the rest of the model is averaged over: each rank's expert gradient
    already sums what every rank of its ep group sent it. Returns the units made."""
    from torch.distributed.tensor import Shard

    from models.routing import experts_modules

    assert meshes.ep is not None and meshes.expert_data is not None
    units = 0
    for _, experts in experts_modules(part):
        if getattr(experts, "expert_parallel", None) is None:
            continue
        if engine == "fsdp":
            from torch.distributed.fsdp import fully_shard

            # FSDP splits the experts this rank holds (dimension 0 under ep) where there are as
            # many as its ranks, else along their width, as torchtitan does, rather than pad.
            held = experts.num_experts // meshes.ep.size()
            dim = 0 if held >= _shard_ranks(meshes.expert_data) else 1
            unit = fully_shard(
                experts,
                mesh=meshes.expert_data,
                reshard_after_forward=reshard,
                **{**policies, "shard_placement_fn": lambda _, dim=dim: Shard(dim)},
            )
        else:
            from torch.distributed._composable.replicate_with_fsdp import replicate

            unit = replicate(experts, mesh=meshes.expert_data, mp_policy=policies["mp_policy"])
        unit.set_gradient_divide_factor(float(divide_by))
        # A custom factor reduce-scatters by PREMUL_SUM, which gloo lacks: sum, then divide. Where
        # nothing is reduce-scattered (replicate, or one rank per shard) FSDP2 divides by the factor
        # before the all-reduce itself, and a forced sum would divide a second time (torch 2.13).
        scattered = engine == "fsdp" and _shard_ranks(meshes.expert_data) > 1
        if scattered and meshes.expert_data.device_type != "cuda":
            unit.set_force_sum_reduction_for_comms(True)
        units += 1
    return units


def _shard_ranks(mesh: DeviceMesh) -> int:
    """The ranks FSDP2 shards over on `mesh`: its last dimension (the first of two replicates)."""
    return mesh.size(mesh.ndim - 1)


class Zero1:
    """The run's optimizer as torch's ZeroRedundancyOptimizer over the data-parallel group: each rank
    steps the whole tensors it owns (dealt out greedily by size) and broadcasts them. Its broadcast
    takes plain tensors, so it steps each parameter's local part (a view of the DTensor's local
    tensor), given the DTensor's local gradient before each step. Its state is kept by parameter
    name, each tensor a DTensor laid out as its parameter, for DCP."""

    def __init__(self, model: nn.Module, built: torch.optim.Optimizer, group: Any):
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer

        names = {id(p): name for name, p in model.named_parameters()}
        # (name, DTensor parameter, its local view): the view shares the local tensor's storage.
        self.locals: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for group_ in built.param_groups:
                self.locals += [(names[id(p)], p, p.to_local()) for p in group_[PARAMS]]
        local_of = {id(p): local for _, p, local in self.locals}
        groups = [{**g, PARAMS: [local_of[id(p)] for p in g[PARAMS]]} for g in built.param_groups]
        # Every group carries the settings; the constructor takes those of its own signature.
        accepted = inspect.signature(type(built).__init__).parameters
        defaults = {key: value for key, value in built.defaults.items() if key in accepted}
        self.optimizer: ZeroRedundancyOptimizer = ZeroRedundancyOptimizer(
            groups, type(built), process_group=group, **defaults
        )

    def take_gradients(self) -> None:
        """Each local view's gradient: its DTensor's local one (clipping scales those in place)."""
        import torch

        with torch.no_grad():
            for _, param, local in self.locals:
                local.grad = None if param.grad is None else param.grad.to_local()

    def state(self) -> dict[str, Any]:
        """The state this rank owns, keyed by parameter name; the parameter groups whole, by name."""
        owned = self.optimizer.optim
        _create_state(owned)
        by_local = {id(local): (name, param) for name, param, local in self.locals}
        state = {}
        for local, held in owned.state.items():
            name, param = by_local[id(local)]
            state[name] = {key: _laid_out_as(param, local, value) for key, value in held.items()}
        groups = self.optimizer.param_groups
        named = [{**g, PARAMS: [by_local[id(local)][0] for local in g[PARAMS]]} for g in groups]
        return {"state": state, "param_groups": named}

    def load(self, state: dict[str, Any]) -> None:
        import torch
        from torch.distributed.tensor import DTensor

        owned = self.optimizer.optim
        names = {id(local): name for name, _, local in self.locals}
        with torch.no_grad():
            for local, held in owned.state.items():
                loaded = state["state"][names[id(local)]]
                for key, value in held.items():
                    new = loaded[key].to_local() if isinstance(loaded[key], DTensor) else loaded[key]
                    if isinstance(value, torch.Tensor):
                        value.copy_(new)
                    else:
                        held[key] = new
        # The groups come in the live order (dcp_layout.restore_layout): ZeroRedundancyOptimizer
        # passes their settings on to the optimizer it wraps at its next step.
        for group, loaded_group in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
            group.update({key: value for key, value in loaded_group.items() if key != PARAMS})


def _laid_out_as(param: torch.Tensor, local: torch.Tensor, value: Any) -> Any:
    """`value` of the optimizer's state (a moment, or the scalar `step`) as a DTensor laid out as
    `param` where it is shaped as the parameter's local part."""
    import torch
    from torch.distributed.tensor import DTensor

    if not isinstance(value, torch.Tensor) or not value.dim() or value.shape != local.shape:
        return value
    mesh, placements = param.device_mesh, param.placements
    return DTensor.from_local(value, mesh, placements, run_check=False, shape=param.shape, stride=param.stride())


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer the state a checkpoint loads into: one step at lr 0 over zero
    gradients, as torch's state-dict helpers do for the optimizers they are given."""
    import torch

    if optimizer.state:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group[PARAMS]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
        for p in group[PARAMS]:
            p.grad = None
