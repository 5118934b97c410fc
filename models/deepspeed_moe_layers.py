"""MoE layers as DeepSpeed's (`deepspeed.moe.layer.MoE`), for the zero*-ep strategies
(strategies/deepspeed_moe.py): the zoo MoE GPT's, and those of transformers models whose sparse
block is a top-k router (`gate`) and stacked SwiGLU experts alone (Mixtral, Qwen3-MoE, OLMoE).

Each layer keeps its router module, whose weight becomes DeepSpeed's TopKGate weight (one
parameter in both), and copies this rank's experts out of the stacked weights into DeepSpeed's
per-expert modules. The gating is the router's own: softmax in fp32, top-k, renormalised for
k >= 2, the probability itself at k = 1; no noise, no random token selection, no drops. Where the
router renormalises otherwise (top-1 renormalised to 1, or top-k without renormalising), DeepSpeed's
gate cannot reproduce it, and the model is refused in one line.

The layer calls its router too: for the tally of what it routed, and so that the model's own
load-balancing loss sees the same router outputs it sees without DeepSpeed (a transformers model
records them from the router module; the zoo's layer computes models/routing.py balance_loss per
sequence). DeepSpeed's own l_aux is not used: it pools the rank's whole micro-batch (and at k = 2
counts first choices only), so it would depend on how the global batch is split.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.expert_parallel import ALL_TO_ALL_CLOCK
from models.moe import MoEFeedForward
from models.routing import RouterTally, balance_loss, is_experts

# The sparse block's parts DeepSpeed's MoE carries: the router, the experts, the zoo's shared expert
# (added beside it) and its tally.
CARRIED = ("router", "gate", "experts", "shared_expert")


class DeepSpeedMoEError(ValueError):
    """Routing DeepSpeed's gate cannot reproduce (one line, says what would)."""


class SwiGLUExpert(nn.Module):
    """One expert, the unit DeepSpeed's Experts copies per local expert; takes any leading dimensions."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj)


def sparse_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module holding a stacked experts module as `experts` and its router beside it."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if is_experts(getattr(m, "experts", None) or nn.Module()) and _router(m) is not None
    ]


def _router(block: nn.Module) -> nn.Module | None:
    router = getattr(block, "router", None) or getattr(block, "gate", None)
    weight = getattr(router, "weight", None)
    return router if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def refusal(model: nn.Module) -> str | None:
    """Why DeepSpeed's MoE cannot route `model` as the model itself does, or None."""
    blocks = sparse_blocks(model)
    if not blocks:
        return (
            f"{type(model).__name__} has no MoE layers of a router and stacked experts for DeepSpeed's MoE to replace: "
            "use a model such as moe-nano or hf:MixtralConfig"
        )
    name, block = blocks[0]
    router, experts = _router(block), block.experts
    extra = [n for n, child in block.named_children() if n not in CARRIED and any(True for _ in child.parameters())]
    if extra or (getattr(block, "shared_expert", None) is not None and not isinstance(block, MoEFeedForward)):
        parts = ", ".join(extra) or "shared_expert"
        return f"{name} has parts DeepSpeed's MoE layer does not carry ({parts}): use ddp-ep for this model"
    if getattr(block, "capacity_factor", None) is not None:
        return (
            "DeepSpeed's gate applies a capacity over each rank's whole micro-batch, the zoo's per sequence, so the "
            "drops would differ from the reference's: leave model_kwargs.capacity_factor unset, or use ddp-ep"
        )
    if getattr(block, "jitter_noise", 0):
        return "the router multiplies its input by random jitter, which DeepSpeed's gate does not: set it to 0"
    act = getattr(experts, "act_fn", None)
    if act is not None and type(act).__name__ not in ("SiLU", "SiLUActivation"):
        return f"its experts use {type(act).__name__}, and DeepSpeed's experts here are SwiGLU: use ddp-ep"
    top_k, norm = router.top_k, getattr(router, "norm_topk_prob", True)
    if top_k == 1 and norm:
        return (
            "DeepSpeed's top-1 gate weights the expert by its softmax probability, not renormalised to 1: set "
            "model_kwargs.norm_topk_prob=false, or use ddp-ep"
        )
    if top_k > 1 and not norm:
        return (
            f"DeepSpeed's top-{top_k} gate renormalises the chosen experts' weights: set "
            "model_kwargs.norm_topk_prob=true, or use ddp-ep"
        )
    return None


class DeepSpeedMoELayer(nn.Module):
    """Stands where a sparse block stood: its router, and DeepSpeed's MoE with this rank's experts."""

    def __init__(self, block: nn.Module, ep_size: int, ep_rank: int):
        super().__init__()
        from deepspeed.moe.layer import MoE

        experts, router = block.experts, _router(block)
        # Under the block's own name for it ("router", transformers' "gate"): its state-dict name stays.
        self.router_name = "router" if getattr(block, "router", None) is router else "gate"
        self.add_module(self.router_name, router)
        n_experts, hidden, width = experts.down_proj.shape
        self.n_experts, self.top_k, self.ep_rank = n_experts, router.top_k, ep_rank
        self.moe = MoE(
            hidden_size=hidden,
            expert=SwiGLUExpert(hidden, width),
            num_experts=n_experts,
            ep_size=ep_size,
            k=self.top_k,
            min_capacity=0,
            noisy_gate_policy=None,
            drop_tokens=False,
            use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        self.moe.deepspeed_moe.gate.wg.weight = router.weight  # one parameter, two users
        local = n_experts // ep_size
        with torch.no_grad():
            for j, expert in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
                expert.gate_up_proj.copy_(experts.gate_up_proj[ep_rank * local + j])
                expert.down_proj.copy_(experts.down_proj[ep_rank * local + j])
        self.shared_expert = getattr(block, "shared_expert", None)
        self.router_tally: RouterTally = getattr(block, "router_tally", None) or experts.router_tally
        # The zoo's layer hands its balance loss to the model; a transformers model computes its own.
        self.computes_balance_loss = isinstance(block, MoEFeedForward)
        if self.computes_balance_loss:
            self.aux_loss: torch.Tensor | None = None
        self._timed_ms = 0.0  # DeepSpeed's all-to-all timers add up: what they held at the last timed forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        probs, _, indices = self.get_submodule(self.router_name)(x.reshape(-1, hidden))
        routed = indices.view(batch, seq, self.top_k)
        self.router_tally.add(routed)
        if self.computes_balance_loss:
            self.aux_loss = balance_loss(probs.view(batch, seq, -1), routed, self.n_experts)
        layer = self.moe.deepspeed_moe
        # Not in a recompute (activation checkpointing, inside the backward): DeepSpeed times the forward's
        # all-to-alls, and torch's checkpoint stops a recompute once it has what the backward needs, inside
        # DeepSpeed's forward, leaving its timers running for the next timed forward to trip on.
        layer.wall_clock_breakdown = ALL_TO_ALL_CLOCK.enabled and torch._C._current_graph_task_id() == -1
        out, _, _ = self.moe(x)
        if ALL_TO_ALL_CLOCK.enabled and layer.ep_size > 1:
            # DeepSpeed times its forward all-to-alls only (its timers synchronise the device).
            total = layer.time_falltoall + layer.time_salltoall
            ALL_TO_ALL_CLOCK.add((total - self._timed_ms) / 1e3)
            self._timed_ms = total
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return out

    def local_state(self, whole: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        """This layer's entries of a DeepSpeed-MoE model's state dict (names under `prefix`), taken from
        the whole model's state `whole` (the bare model's names, every expert stacked)."""
        out = {f"{prefix}moe.deepspeed_moe.gate.wg.weight": whole[f"{prefix}{self.router_name}.weight"]}
        local = len(self.moe.deepspeed_moe.experts.deepspeed_experts)
        for j in range(local):
            for weight in ("gate_up_proj", "down_proj"):
                stacked = whole[f"{prefix}experts.{weight}"]
                out[f"{prefix}moe.deepspeed_moe.experts.deepspeed_experts.{j}.{weight}"] = stacked[
                    self.ep_rank * local + j
                ]
        return out


def deepspeed_moe_state(model: nn.Module, whole: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The bare model's consolidated state `whole` under the names of `model`, whose MoE layers are
    DeepSpeed's: each layer's router weight also as its gate's, this rank's experts cut out."""
    layers = {f"{name}.": m for name, m in model.named_modules() if isinstance(m, DeepSpeedMoELayer)}
    out = {key: t for key, t in whole.items() if not any(key.startswith(f"{p}experts.") for p in layers)}
    for prefix, layer in layers.items():
        out.update(layer.local_state(whole, prefix))
    return out


def to_deepspeed_moe(model: nn.Module, ep_size: int, ep_rank: int) -> list[str]:
    """Swap every sparse block of `model` for DeepSpeed's MoE, holding expert-parallel rank `ep_rank`'s
    experts; returns the swapped blocks' names."""
    reason = refusal(model)
    if reason:
        raise DeepSpeedMoEError(reason)
    blocks = sparse_blocks(model)
    for name, block in blocks:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, DeepSpeedMoELayer(block, ep_size, ep_rank))
    return [name for name, _ in blocks]


def n_experts(model: nn.Module) -> int:
    """The experts of each MoE layer (refusal() has found some)."""
    return sparse_blocks(model)[0][1].experts.num_experts
