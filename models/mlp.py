"""A next-token MLP: embedding, a stack of GELU layers, a tied output head.

Each token is predicted from the one before it only, which is all a first-order
Markov chain needs: on `data=markov` it can reach the data set's entropy floor.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TokenMLP(nn.Module):
    def __init__(self, vocab_size: int = 128, width: int = 256, depth: int = 3):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.embed.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def transformer_blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        for layer in self.layers:
            x = x + F.gelu(layer(x))
        logits = self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def num_params(self, non_embedding: bool = True) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        return 6 * self.num_params()
