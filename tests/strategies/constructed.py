"""A registered strategy constructed (not set up) as rank 0 of a CPU fp32 run constructs it, its
mesh laid out as the run's: what its constructor refuses, and what it derives from its options."""

from __future__ import annotations

from typing import Any

import torch

from strategies.base import RunContext, Strategy
from strategies.registry import default_registry


def constructed(name: str, world_size: int, micro_batch: int = 4, config: Any = None, **options: Any) -> Strategy:
    ctx = RunContext(
        rank=0,
        world_size=world_size,
        local_rank=0,
        device=torch.device("cpu"),
        precision="fp32",
        micro_batch=micro_batch,
        grad_accum=1,
        grad_clip=1.0,
        config=config,
        mesh=default_registry().mesh_layout(name, world_size, world_size, **options),
    )
    return default_registry().create(name, ctx, **options)
