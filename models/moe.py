"""A mixture-of-experts GPT: parabench's GPT with each block's MLP (or every moe_every-th) replaced
by a top-k router over E SwiGLU experts (models/routing.py), optionally beside a shared expert.

The contract of every parabench model holds: `forward(inputs, targets) -> loss`, where the loss is
the cross-entropy plus aux_loss_coef x the load-balancing loss summed over the MoE layers;
`num_params()` and `flops_per_token()` count the active parameters (a token's top-k experts, not
all E); `transformer_blocks()`. Routing is dropless unless `capacity_factor` is set. It is not a
subclass of GPT: context parallel splits parabench's GPT alone and refuses this one, whose
per-sequence balance loss needs whole sequences.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.gpt import MLP, Block, CausalLM, GPTConfig
from models.gpt_config import check_sizes
from models.moe_config import MoEConfig
from models.routing import RouterTally, SwiGLUExperts, TopKRouter, balance_loss, capacity, over_capacity
from models.tensor_parallel import heads_check


class SwiGLU(nn.Module):
    """One dense SwiGLU MLP: the shared expert."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MoEFeedForward(nn.Module):
    """Router, experts, the shared expert if any; keeps its load-balancing loss in `aux_loss` after
    each forward and counts what it routed in `router_tally`."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.capacity_factor = cfg.capacity_factor
        self.router = TopKRouter(cfg.n_embd, cfg.n_experts, cfg.top_k, cfg.norm_topk_prob)
        self.experts = SwiGLUExperts(cfg.n_experts, cfg.n_embd, cfg.expert_hidden)
        self.shared_expert = SwiGLU(cfg.n_embd, cfg.shared_expert_hidden) if cfg.shared_expert_hidden else None
        self.router_tally = RouterTally(cfg.n_experts, cfg.capacity_factor)
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        flat = x.reshape(-1, hidden)
        probs, weights, indices = self.router(flat)
        routed = indices.view(batch, seq, self.top_k)
        self.aux_loss = balance_loss(probs.view(batch, seq, -1), routed, self.n_experts)
        dropped = None
        if self.capacity_factor is not None:
            limit = capacity(self.capacity_factor, seq, self.top_k, self.n_experts)
            dropped = over_capacity(routed, self.n_experts, limit)
            indices = indices.masked_fill(dropped.reshape(indices.shape), -1)
        self.router_tally.add(routed, dropped)
        out = self.experts(flat, indices, weights)
        if self.shared_expert is not None:
            out = out + self.shared_expert(flat)
        return out.view(batch, seq, hidden)


class MoEGPT(CausalLM):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        check_config(cfg)
        self.config = cfg
        dense = GPTConfig(cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.bias, cfg.dropout)
        # Experts in every moe_every-th block, the dense MLP elsewhere.
        self._build(cfg, lambda i: Block(dense, MoEFeedForward(cfg) if (i + 1) % cfg.moe_every == 0 else None))
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's: N(0, 0.02), the residual projections (attention's, each MLP's and each expert's
        # down projection) scaled by 1/sqrt(2 L).
        residual = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith(".weight") else nn.init.zeros_(p)
            elif name.endswith(("c_proj.weight", "down_proj", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=residual)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def moe_layers(self) -> list[nn.Module]:
        """The blocks' MoE layers (whatever a strategy swapped in: each keeps an aux_loss)."""
        return [block.mlp for block in self.blocks if hasattr(block.mlp, "aux_loss")]

    def tensor_parallel_plan(self, tp_size: int, sequence_parallel: bool) -> dict[str, str]:
        """The GPT's split of the attention by heads and of each dense MLP (models/gpt.py); each MoE
        layer, router and experts, stays whole on every rank of a tensor-parallel group, which runs it
        on the same tokens: its experts are split by expert parallel (ep_size) instead. No sequence
        parallel: the MoE layer routes whole sequences (its balance loss is per sequence)."""
        heads_check("this MoE GPT", {"attention heads": self.config.n_head}, tp_size)
        plan = {"blocks.*.attn.c_attn": "packed_colwise_qkv", "blocks.*.attn.c_proj": "rowwise"}
        for i, block in enumerate(self.blocks):
            if isinstance(block.mlp, MLP):
                plan.update({f"blocks.{i}.mlp.c_fc": "colwise", f"blocks.{i}.mlp.c_proj": "rowwise"})
        return plan

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = super().forward(inputs, targets)
        if not self.adds_balance_loss:  # nothing read across blocks: a pipeline can cut it
            return loss
        aux = sum(layer.aux_loss for layer in self.moe_layers())
        return loss + self.config.aux_loss_coef * aux

    @property
    def adds_balance_loss(self) -> bool:
        """Whether the loss includes the routers' load-balancing loss (aux_loss_coef above 0)."""
        return self.config.aux_loss_coef > 0

    def num_params(self, non_embedding: bool = True) -> int:
        """Active parameters: every parameter but the routed experts a token does not go through
        (E - k of each MoE layer's); tied weights once, position embeddings left out by default."""
        n = sum(p.numel() for p in self.parameters())
        c = self.config
        per_expert = 3 * c.n_embd * c.expert_hidden
        n -= len(self.moe_layers()) * (c.n_experts - c.top_k) * per_expert
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12·L·H·Q·T (PaLM appendix B) with N the active parameters."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * seq_len


def check_config(cfg: MoEConfig) -> None:
    """One line for a size or routing option the model cannot take."""
    check_sizes(cfg)
    if not 1 <= cfg.top_k <= cfg.n_experts:
        raise ValueError(f"top_k={cfg.top_k} must be between 1 and n_experts={cfg.n_experts}")
    if not 1 <= cfg.moe_every <= cfg.n_layer:
        raise ValueError(f"moe_every={cfg.moe_every} must be between 1 and n_layer={cfg.n_layer}")
    if cfg.capacity_factor is not None and not cfg.capacity_factor > 0:
        raise ValueError(f"capacity_factor={cfg.capacity_factor} must be above 0 (leave it unset for dropless routing)")
    if cfg.aux_loss_coef < 0:
        raise ValueError(f"aux_loss_coef={cfg.aux_loss_coef} must be 0 or more")
