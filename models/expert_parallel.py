"""Expert parallel as a model-level mechanism, given process groups: each rank of an expert-parallel
group holds E/ep of every MoE layer's experts, tokens travel to the rank of their expert and back by
all-to-all, and the experts' gradients are reduced over the ranks that hold the same experts.

Any stacked experts module (models/routing.py `is_experts`: the zoo's, every transformers 5 MoE
model's) is sharded in place, and its instance's `forward` is replaced by one that dispatches, runs
the module's own forward on the tokens it received, and combines. `distribute_experts` (the torch
mesh's) makes its (E, ...) parameters DTensors split over an expert-parallel mesh, whole in shape
and name, for a data-parallel engine to shard further and a checkpoint to hold whole;
`shard_experts` (a loop of one's own over process groups) makes them plain tensors, the rank's
slice. The module tree and its parameter names stay as they were; hooks on the module (the router
tally of an `hf:` model) still see the global expert indices.

The ranks of an expert-parallel group read different data: they are data-parallel ranks too
(torchtitan borrows its ep dimension from dp_shard x cp). The gradient of every parameter but the
experts' is the mean over every data-parallel rank, as DDP or FSDP reduce it; an expert's gradient
already sums what every rank of its ep group sent it, so it is summed over the ranks holding the
same experts (the expert-data-parallel group) and divided by the whole data-parallel degree.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from models.moe_config import ExpertParallelError, check_divides_experts
from models.routing import experts_modules

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

StateDict = dict[str, torch.Tensor]


class CollectiveClock:
    """Wall time spent in the dispatch and combine all-to-alls, forward and backward, on the steps it
    is switched on for (the device synchronised on either side of each, so only those steps pay)."""

    def __init__(self) -> None:
        self.enabled = False
        self.seconds = 0.0
        self.steps = 0
        self.calls = 0

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1

    def take(self) -> tuple[float, int, int]:
        """(seconds, timed steps, timed all-to-alls) since the last take, and reset."""
        out = (self.seconds, self.steps, self.calls)
        self.seconds, self.steps, self.calls = 0.0, 0, 0
        return out


ALL_TO_ALL_CLOCK = CollectiveClock()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    timed = ALL_TO_ALL_CLOCK.enabled
    if timed:
        _synchronize(x.device)
        started = time.perf_counter()
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    if timed:
        _synchronize(x.device)
        ALL_TO_ALL_CLOCK.add(time.perf_counter() - started)
    return out


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with variable splits; its backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def shard_experts(model: nn.Module, group: dist.ProcessGroup) -> list[str]:
    """Shard every stacked experts module of `model` over the expert-parallel `group`: this rank
    keeps experts [r E/ep, (r+1) E/ep). Returns the names of the sharded parameters."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    names = []
    for name, experts in _experts_of(model):
        local = experts.num_experts // size
        for pname, _, mine in _this_ranks_experts(experts, size, rank):
            experts.register_parameter(pname, nn.Parameter(mine))
            names.append(f"{name}.{pname}" if name else pname)
        experts.expert_parallel = ExpertShard(group, experts.num_experts, local, rank * local)
        experts.num_experts = local
        experts.forward = _dispatching(experts, experts.forward)
    return names


def _this_ranks_experts(experts: nn.Module, size: int, rank: int) -> Iterator[tuple[str, nn.Parameter, torch.Tensor]]:
    """Each per-expert parameter of a stacked experts module with a copy of this rank's E/size of
    its experts, [r E/size, (r+1) E/size); parameters not per expert are left out (replicated like
    the rest of the model). `size` must divide the experts (one line that says what would)."""
    check_divides_experts(experts.num_experts, size)
    local = experts.num_experts // size
    for pname, p in list(experts.named_parameters(recurse=False)):
        if p.dim() == 0 or p.size(0) != experts.num_experts:
            continue
        yield pname, p, p.detach()[rank * local : (rank + 1) * local].clone()


def distribute_experts(model: nn.Module, mesh: DeviceMesh) -> list[str]:
    """Shard every stacked experts module of `model` over the 1-D expert-parallel `mesh`, each
    per-expert weight a DTensor split along its experts (Shard(0)): this rank computes experts
    [r E/ep, (r+1) E/ep), and the weights keep their whole (E, ...) shape, their names and the
    module's num_experts, so that a data-parallel engine can shard them further (FSDP2 over the
    ranks that hold the same experts) and a checkpoint holds every expert under the model's names
    whatever ep. Returns the names of the sharded parameters (none where `model`, a pipeline stage
    say, holds no experts)."""
    from torch.distributed.tensor import DTensor, Shard

    size, rank = mesh.size(), mesh.get_local_rank()
    names = []
    for name, experts in experts_modules(model):
        local = experts.num_experts // size
        for pname, p, mine in _this_ranks_experts(experts, size, rank):
            whole = DTensor.from_local(mine, mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride())
            experts.register_parameter(pname, nn.Parameter(whole, requires_grad=p.requires_grad))
            names.append(f"{name}.{pname}" if name else pname)
        experts.expert_parallel = ExpertShard(mesh.get_group(), experts.num_experts, local, rank * local)
        experts.forward = _dispatching(experts, experts.forward)
    return names


def _experts_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    found = experts_modules(model)
    if not found:
        raise ExpertParallelError(
            f"model {type(model).__name__} has no experts to shard (no module with stacked (E, ...) expert weights): "
            "use a mixture-of-experts model such as moe-nano or hf:MixtralConfig"
        )
    return found


class ExpertShard:
    """Which experts of a layer this rank holds, and the group that holds the rest."""

    def __init__(self, group: dist.ProcessGroup, total: int, local: int, first: int):
        self.group, self.total, self.local, self.first = group, total, local, first
        self.size = dist.get_world_size(group)


def _dispatching(experts: nn.Module, local_forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    shard: ExpertShard = experts.expert_parallel

    def forward(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        k = indices.size(-1)
        flat = indices.reshape(-1)
        # Assignments grouped by global expert (so by destination rank), dropped ones (-1) first.
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(shard.total + 1, dtype=torch.long, device=x.device)
        counts.scatter_add_(0, flat + 1, torch.ones_like(flat))
        send = counts[1:]
        # Each rank learns how many tokens of each of its experts every other rank sends.
        received = _exchange(send, [shard.local] * shard.size, [shard.local] * shard.size, shard.group)
        sizes = torch.cat([counts[:1], send.view(shard.size, shard.local).sum(1), received]).tolist()
        dropped, in_splits = sizes[0], sizes[1 : 1 + shard.size]
        from_each = torch.tensor(sizes[1 + shard.size :]).view(shard.size, shard.local)
        order = order[dropped:]
        tokens = order // k
        arrived = _AllToAll.apply(x[tokens], from_each.sum(1).tolist(), in_splits, shard.group)
        local_index = torch.repeat_interleave(torch.arange(shard.local).repeat(shard.size), from_each.reshape(-1))
        local_index = local_index.to(x.device).unsqueeze(-1)
        ones = torch.ones(local_index.shape, dtype=weights.dtype, device=x.device)
        with _local_weights(experts, shard.local):
            done = local_forward(arrived, local_index, ones)
        back = _AllToAll.apply(done, in_splits, from_each.sum(1).tolist(), shard.group)
        out = back * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, tokens, out.to(x.dtype))

    return forward


@contextlib.contextmanager
def _local_weights(experts: nn.Module, local: int) -> Iterator[None]:
    """The module's own forward run on this rank's experts: each DTensor weight (distribute_experts,
    as the engine hands it over for forward) swapped for its local part, by which autograd carries
    the gradient back to the DTensor, and num_experts for the local count. Plain weights
    (shard_experts) are the local part already."""
    from torch.distributed.tensor import DTensor

    held = {name: p for name, p in experts._parameters.items() if isinstance(p, DTensor)}
    total = experts.num_experts
    # Straight into the parameter table: nn.Module's setattr would refuse a plain tensor there, and
    # a deleted and re-registered parameter would change the module's parameter order.
    experts._parameters.update({name: p.to_local() for name, p in held.items()})
    experts.num_experts = local
    try:
        yield
    finally:
        experts._parameters.update(held)
        experts.num_experts = total


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The sharded expert parameters of `model` (after shard_experts)."""
    out = []
    for _, experts in experts_modules(model):
        if getattr(experts, "expert_parallel", None) is None:
            continue
        out += [p for p in experts.parameters(recurse=False) if p.dim() and p.size(0) == experts.num_experts]
    return out


def reduce_expert_gradients(params: list[nn.Parameter], group: dist.ProcessGroup, data_parallel_size: int) -> None:
    """Sum the experts' gradients over `group` (the ranks holding the same experts) and divide by the
    data-parallel degree: the mean over every data-parallel rank of the loss's gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dist.get_world_size(group) > 1:
        dist.all_reduce(flat, group=group)
    flat.div_(data_parallel_size)
    for g, reduced in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(reduced.view_as(g))


def gather_experts(state: StateDict, names: list[str], group: dist.ProcessGroup) -> StateDict:
    """`state` with each sharded expert tensor in `names` all-gathered over `group` into the whole
    (E, ...) tensor (collective: every rank of the group calls it with the same names)."""
    out = dict(state)
    size = dist.get_world_size(group)
    for name in names:
        local = state[name].contiguous()
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local, group=group)
        out[name] = torch.cat(parts)
    return out
