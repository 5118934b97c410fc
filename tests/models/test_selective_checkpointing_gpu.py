"""activation_checkpointing=selective on CUDA (skipped without a GPU): with the GPU's own attention kernel
(flash, efficient or cuDNN, which the policy keeps) the peak memory of a step sits between full
checkpointing's and none's, and the loss is none's. The CPU tests hold the same with the CPU's kernel
(test_selective_checkpointing.py)."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.activation_checkpointing import enable_checkpointing
from models.blocks import find_blocks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _peak_and_loss(mode: str) -> tuple[int, float]:
    torch.manual_seed(0)
    model = build_model("gpt2-124m", {}).to("cuda", torch.bfloat16)
    if mode != "none":
        enable_checkpointing(model, find_blocks(model, None), selective=mode == "selective")
    model.train()
    inputs, targets = (torch.randint(0, model.vocab_size, (8, 1024), device="cuda") for _ in range(2))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    loss = model(inputs, targets)
    loss.backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), loss.item()


def test_a_selective_step_peaks_between_full_and_none_with_nones_loss():
    peaks, losses = zip(*(_peak_and_loss(mode) for mode in ("none", "selective", "full")), strict=True)
    none, selective, full = peaks
    assert full < selective < none, peaks
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
