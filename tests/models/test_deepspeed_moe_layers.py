"""DeepSpeed's MoE layers in the zoo's MoE GPT (models/deepspeed_moe_layers.py), in one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from models.deepspeed_moe_layers import to_deepspeed_moe
from models.expert_parallel import ALL_TO_ALL_CLOCK
from models.selective_checkpointing import selective_context
from models.zoo import build_model


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("selective", [False, True])
def test_timed_steps_under_activation_checkpointing_run_twice(one_rank, selective, monkeypatch):
    # torch's checkpoint stops a recompute inside DeepSpeed's forward once the backward has what it needs:
    # a timed recompute left DeepSpeed's timer running, and the next timed forward asserted on it.
    model = build_model("moe-nano")
    to_deepspeed_moe(model, ep_size=1, ep_rank=0)
    model.activation_checkpointing = True
    if selective:
        model.checkpoint_context_fn = selective_context
    monkeypatch.setattr(ALL_TO_ALL_CLOCK, "enabled", True)
    tokens = torch.randint(0, 128, (2, 17))
    for _ in range(2):
        model(tokens[:, :-1], tokens[:, 1:]).backward()
