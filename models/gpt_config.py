"""The zoo GPT's sizes, without torch: the model (models/gpt.py) builds from them, and the
planner reads them to plan a preset without building it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


SIZES = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")


def check_sizes(cfg: Any) -> None:
    """One line for a size, bias or dropout the model cannot be built with (a GPTConfig's or an
    MoEConfig's fields, as model_kwargs may set them)."""
    for name in SIZES:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a whole number of at least 1")
    bias = cfg.bias
    if not isinstance(bias, bool):
        raise ValueError(f"bias={bias!r} must be true or false")
    dropout = cfg.dropout
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"dropout={dropout!r} must be at least 0 and below 1")


def beyond_positions(model: str, seq_len: int, key: str, positions: int) -> str:
    """The line for a seq_len longer than a model's learned positions (`positions` of them, sized by
    its model_kwargs.`key`): past them a token has no position embedding. Train and plan say it alike."""
    return (
        f"seq_len={seq_len} exceeds {model}'s {key}={positions} (its positions): give seq_len<={positions} "
        f"or model_kwargs.{key}={seq_len}"
    )
