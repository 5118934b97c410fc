"""Top-k routing over experts, shared by the zoo's MoE GPT (models/moe.py), its DeepSpeed form
(models/deepspeed_moe_layers.py) and the Hugging Face MoE models (models/hf.py): the router, the
experts in transformers 5's layout, the load-balancing loss, the capacity limit, and the tally of
what each layer routed that the loop reads at the logging interval.

Experts are held stacked, one (E, ...) tensor per weight (transformers 5's layout: gate_up_proj
(E, 2F, H), down_proj (E, H, F)), not as a ModuleList of E modules: expert parallel then shards
a layer by slicing the leading dimension (models/expert_parallel.py), the same code shards the
zoo's experts and every transformers MoE model's, the state-dict names do not depend on E, and a
grouped matmul can take the stacked weights as they are.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F


class TopKRouter(nn.Module):
    """Softmax over the experts in fp32 (as DeepSpeed's TopKGate and transformers' routers compute
    it), the top k per token, renormalised over those k where `norm_topk_prob`."""

    def __init__(self, hidden: int, n_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and the number of experts, {n_experts}")
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.empty(n_experts, hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, H) -> probabilities (N, E), the chosen experts' weights (N, k) and indices (N, k)."""
        logits = F.linear(x.float(), self.weight.float())
        probs = F.softmax(logits, dim=-1)
        weights, indices = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights, indices


class SwiGLUExperts(nn.Module):
    """E SwiGLU experts, stacked; forward(x, indices, weights) as transformers 5's experts modules
    take it: each token through each of its experts (an index below 0: dropped), weighted, summed."""

    def __init__(self, n_experts: int, hidden: int, expert_hidden: int):
        super().__init__()
        self.num_experts = n_experts
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * expert_hidden, hidden))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden, expert_hidden))

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        k = indices.size(-1)
        flat = indices.reshape(-1)
        # The assignments grouped by expert, in token order within each (a stable sort): each
        # expert's tokens are one contiguous block, and the sums below run in expert order.
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.num_experts + 1, dtype=torch.long, device=x.device)
        counts.scatter_add_(0, flat + 1, torch.ones_like(flat))  # [dropped, expert 0, ...]
        dropped, *per_expert = counts.tolist()  # the block sizes: a host sync, as any dropless MoE has
        order = order[dropped:]
        tokens = order // k
        out = torch.cat([expert_block(self, e, block) for e, block in enumerate(x[tokens].split(per_expert))])
        out = out * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, tokens, out.to(x.dtype))


def expert_block(experts: nn.Module, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert `e` of stacked SwiGLU `experts` on its tokens x (n, H)."""
    gate, up = F.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, experts.down_proj[e])


def balance_loss(probs: torch.Tensor, indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Switch's load-balancing loss, E x sum_e f_e x P_e (f_e: the share of the routed assignments
    that went to expert e, P_e: its mean router probability; 1 when perfectly balanced, whatever k),
    computed for each sequence and averaged over the sequences (DeepSeek-V3's sequence-wise form).
    Per sequence, the loss of a global batch does not depend on how it is split over ranks and
    micro-steps: every layout trains on the loss the single-process reference does.
    probs (B, T, E), indices (B, T, k), as routed before any capacity drop."""
    batch, seq, k = indices.shape
    counts = torch.zeros(batch, n_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(1, indices.reshape(batch, -1), torch.ones_like(indices, dtype=probs.dtype).reshape(batch, -1))
    share = counts / (seq * k)
    return (n_experts * (share * probs.mean(dim=1)).sum(dim=-1)).mean()


def capacity(capacity_factor: float, seq_len: int, top_k: int, n_experts: int) -> int:
    """How many assignments each expert takes from one sequence (GShard's groups, one per sequence)."""
    return math.ceil(capacity_factor * top_k * seq_len / n_experts)


def over_capacity(indices: torch.Tensor, n_experts: int, limit: int) -> torch.Tensor:
    """Which assignments (B, T, k) an expert's capacity drops: in each sequence an expert keeps its
    first `limit` assignments, every token's first choice ahead of any second choice, then by
    position (GShard's order, DeepSpeed's top-2 gate's)."""
    batch, seq, k = indices.shape
    by_choice = F.one_hot(indices.transpose(1, 2).reshape(batch, k * seq), n_experts)
    position = (by_choice.cumsum(dim=1) * by_choice).sum(dim=-1) - 1
    return (position >= limit).view(batch, k, seq).transpose(1, 2)


class RouterTally:
    """What one MoE layer routed since the loop last read it: assignments per expert and those
    dropped over capacity, kept on the device (no host sync) until the logging interval."""

    def __init__(self, n_experts: int, capacity_factor: float | None = None):
        self.n_experts = n_experts
        self.capacity_factor = capacity_factor  # None: dropless
        self.counts: torch.Tensor | None = None
        self.dropped: torch.Tensor | None = None

    def add(self, routed: torch.Tensor, dropped: torch.Tensor | None = None) -> None:
        """routed: the expert indices of every assignment (before capacity); dropped: a mask of those dropped."""
        # Activation checkpointing runs the forward again inside the backward: counted once. A
        # forward without gradients (a pipeline cut's trace) or under tallies_paused is no step.
        if torch._C._current_graph_task_id() != -1 or not torch.is_grad_enabled() or _paused:
            return
        flat = routed.detach().reshape(-1)
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        lost = dropped.sum() if dropped is not None else torch.zeros((), dtype=torch.long, device=flat.device)
        self.counts = counts if self.counts is None else self.counts + counts
        self.dropped = lost if self.dropped is None else self.dropped + lost

    def take(self, device: torch.device) -> torch.Tensor:
        """The tally since the last take, as one tensor [count per expert..., dropped], and reset it."""
        if self.counts is None:
            out = torch.zeros(self.n_experts + 1, dtype=torch.long, device=device)
        else:
            out = torch.cat([self.counts, self.dropped.reshape(1)]).to(device)
        self.counts = self.dropped = None
        return out


_paused = False


@contextlib.contextmanager
def tallies_paused() -> Iterator[None]:
    """No MoE layer counts what it routes inside: a forward that is no training step (a pipeline
    stage's shape inference)."""
    global _paused
    was, _paused = _paused, True
    try:
        yield
    finally:
        _paused = was


def router_tallies(model: nn.Module) -> list[RouterTally]:
    """The tallies of the model's MoE layers, in module order (each once)."""
    return [tally for _, tally in named_router_tallies(model)]


def named_router_tallies(model: nn.Module) -> list[tuple[str, RouterTally]]:
    """The tallies of the model's MoE layers with the name of the module each sits on, in module
    order (each once)."""
    found: dict[int, tuple[str, RouterTally]] = {}
    for name, module in model.named_modules():
        tally = getattr(module, "router_tally", None)
        if isinstance(tally, RouterTally):
            found.setdefault(id(tally), (name, tally))
    return list(found.values())


def is_experts(module: nn.Module) -> bool:
    """A stacked experts module in transformers 5's layout (the zoo's SwiGLUExperts included)."""
    weight = getattr(module, "gate_up_proj", None)
    return (
        isinstance(getattr(module, "num_experts", None), int)
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 3
        and weight.size(0) == module.num_experts
    )


def experts_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every stacked experts module of the model, by name."""
    return [(name, m) for name, m in model.named_modules() if is_experts(m)]
