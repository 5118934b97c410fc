"""The zoo GPT's sizes, without torch: the model (models/gpt.py) builds from them, and the
planner reads them to plan a preset without building it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64 for fast matmuls
    block_size: int = 1024
    bias: bool = False
    dropout: float = 0.0


PRESETS: dict[str, GPTConfig] = {
    "gpt-nano": GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=128, block_size=256),
    "gpt-micro": GPTConfig(n_layer=4, n_head=4, n_embd=128, vocab_size=512, block_size=256),
    "gpt-mini": GPTConfig(n_layer=6, n_head=6, n_embd=384, vocab_size=4096, block_size=512),
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2-350m": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-774m": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-1.5b": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}
