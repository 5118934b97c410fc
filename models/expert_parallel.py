"""Expert parallel as a model-level mechanism, given process groups: each rank of an expert-parallel
group holds E/ep of every MoE layer's experts, tokens travel to the rank of their expert and back by
all-to-all, and the experts' gradients are reduced over the ranks that hold the same experts.

Any stacked experts module (models/routing.py `is_experts`: the zoo's, every transformers 5 MoE
model's) is sharded in place: its (E, ...) parameters become the rank's slice, and its instance's
`forward` is replaced by one that dispatches, runs the module's own forward on the tokens it
received, and combines. The module tree and its parameter names stay as they were; hooks on the
module (the router tally of an `hf:` model) still see the global expert indices.

The ranks of an expert-parallel group read different data: they are data-parallel ranks too
(torchtitan borrows its ep dimension from dp_shard x cp). The gradient of every parameter but the
experts' is the mean over every data-parallel rank, as DDP or FSDP reduce it; an expert's gradient
already sums what every rank of its ep group sent it, so it is summed over the ranks holding the
same experts (the expert-data-parallel group) and divided by the whole data-parallel degree.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from models.moe_config import ExpertParallelError, check_divides_experts
from models.routing import experts_modules

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
    found = experts_modules(model)
    if not found:
        raise ExpertParallelError(
            f"model {type(model).__name__} has no experts to shard (no module with stacked (E, ...) expert weights): "
            "use a mixture-of-experts model such as moe-nano or hf:MixtralConfig"
        )
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    names = []
    for name, experts in found:
        check_divides_experts(experts.num_experts, size)
        local = experts.num_experts // size
        for pname, p in list(experts.named_parameters(recurse=False)):
            if p.dim() == 0 or p.size(0) != experts.num_experts:
                continue  # not per expert: replicated like the rest of the model
            experts.register_parameter(pname, nn.Parameter(p.detach()[rank * local : (rank + 1) * local].clone()))
            names.append(f"{name}.{pname}" if name else pname)
        experts.expert_parallel = ExpertShard(group, experts.num_experts, local, rank * local)
        experts.num_experts = local
        experts.forward = _dispatching(experts, experts.forward)
    return names


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
        done = local_forward(arrived, local_index, torch.ones(local_index.shape, dtype=weights.dtype, device=x.device))
        back = _AllToAll.apply(done, in_splits, from_each.sum(1).tolist(), shard.group)
        out = back * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, tokens, out.to(x.dtype))

    return forward


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


def expert_grad_norm_squared(params: list[nn.Parameter], group: dist.ProcessGroup) -> torch.Tensor:
    """The squared norm of the experts' (reduced) gradients over every expert of the model: each rank's
    own experts, summed over the expert-parallel `group`."""
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    local = sum((g.float().pow(2).sum() for g in grads), torch.zeros((), device=device))
    dist.all_reduce(local, group=group)
    return local


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


def local_experts(state: StateDict, names: list[str], group: dist.ProcessGroup) -> StateDict:
    """`state` (whole experts) with each tensor in `names` cut to this rank's slice."""
    out = dict(state)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    for name in names:
        local = state[name].size(0) // size
        out[name] = state[name][rank * local : (rank + 1) * local]
    return out
