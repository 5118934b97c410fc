"""A GPT in the nanoGPT style: pre-norm blocks, SDPA attention, tied embeddings.

The contract every parabench model keeps: `forward(inputs, targets) -> loss`,
plus `num_params()` and `flops_per_token(seq_len)` for MFU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import noop_context_fn

from models.activation_checkpointing import recompute
from models.gpt_config import PRESETS, GPTConfig, check_sizes  # noqa: F401 (PRESETS: the zoo reads it from here)
from models.tensor_parallel import heads_check

if TYPE_CHECKING:
    from models.moe_config import MoEConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd={cfg.n_embd} must be a multiple of n_head={cfg.n_head}")
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # Thirds and -1 heads rather than C and n_head: under tensor parallel this rank's c_attn
        # gives q;k;v of its own heads only (models/tensor_parallel.py, packed_colwise_qkv).
        q, k, v = self.c_attn(x).chunk(3, dim=2)
        q, k, v = (t.view(B, T, -1, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # SDPA picks flash/memory-efficient kernels on GPU: the T x T score matrix is never stored.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm attention, then the feed-forward: a GELU MLP unless `mlp` is given (the
    mixture-of-experts GPT's router and experts)."""

    def __init__(self, cfg: GPTConfig, mlp: nn.Module | None = None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = mlp if mlp is not None else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CausalLM(nn.Module):
    """What parabench's GPT and its mixture-of-experts twin share: token and position embeddings, the
    blocks, the final norm and the head tied to the embedding, and the forward to the cross-entropy."""

    # As transformers' models name theirs: what Accelerate's TRANSFORMER_BASED_WRAP wraps when a config
    # file names no class (fsdp_transformer_layer_cls_to_wrap left out).
    _no_split_modules = ["Block"]

    def _build(self, cfg: GPTConfig | MoEConfig, block: Callable[[int], nn.Module]) -> None:
        """The modules, registered in the order init draws their values: `block(i)` makes the i-th block."""
        self.activation_checkpointing = False
        # What each recomputed block keeps beside its input (models/selective_checkpointing.py); noop: nothing.
        self.checkpoint_context_fn: Callable[[], Any] = noop_context_fn
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(block(i) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def transformer_blocks(self) -> list[nn.Module]:
        """The repeated blocks: the unit that FSDP shards and checkpointing recomputes."""
        return list(self.blocks)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The next-token cross-entropy of the blocks' output, each block recomputed in the backward
        where activation checkpointing is on."""
        T = inputs.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")
        pos = torch.arange(T, device=inputs.device)
        x = self.drop(self.wte(inputs) + self.wpe(pos))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = recompute(block, x, context_fn=self.checkpoint_context_fn)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class GPT(CausalLM):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        check_sizes(cfg)
        self.config = cfg
        self._build(cfg, lambda _: Block(cfg))
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def tensor_parallel_plan(self, tp_size: int, sequence_parallel: bool) -> dict[str, str]:
        """Megatron's split of each block (models/tensor_parallel.py): attention by heads (the fused
        q;k;v column-wise, the output projection row-wise), the MLP column- then row-wise. With
        sequence_parallel the residual stream between them is split along the sequence, so the norms
        and residual adds hold 1/tp_size of the activations, each block gathers its input and
        reduce-scatters its output. The embeddings and the head, tied, stay whole (FSDP shards them)."""
        heads_check("this GPT", {"attention heads": self.config.n_head}, tp_size)
        plan = {
            "blocks.*.attn.c_attn": "packed_colwise_qkv",
            "blocks.*.attn.c_proj": "rowwise",
            "blocks.*.mlp.c_fc": "colwise",
            "blocks.*.mlp.c_proj": "rowwise",
        }
        if sequence_parallel:
            plan.update(
                {
                    "drop": "sequence_scatter",
                    "blocks.*.ln_1": "sequence_parallel",
                    "blocks.*.attn": "sequence_gather",
                    "blocks.*.attn.c_proj": "rowwise_to_sequence",
                    "blocks.*.ln_2": "sequence_parallel",
                    "blocks.*.mlp": "sequence_gather",
                    "blocks.*.mlp.c_proj": "rowwise_to_sequence",
                    "ln_f": "sequence_parallel",
                    "lm_head": "sequence_gather_local",
                }
            )
        return plan

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, counted once though tied; position embeddings left out by default
        (they cost no matmul flops), as nanoGPT and PaLM count N."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12·L·H·Q·T (PaLM appendix B): the matmuls plus attention, forward and backward."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * seq_len
