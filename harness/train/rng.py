"""Every random-number generator a rank draws from, captured and restored as one value.

Python's `random`, NumPy's global generator, torch's CPU generator and, where CUDA
is in use, the current device's generator. Each rank keeps its own (dropout masks
differ per rank), so a checkpoint stores one of these per rank. The value holds only
tuples, numbers and tensors, so `torch.load(weights_only=True)` reads it back.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    """The state of every generator in this process."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict[str, Any]) -> None:
    """Put every generator back as `capture()` found it."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(path: Path) -> None:
    torch.save(capture(), path)


def read(path: Path) -> dict[str, Any]:
    """The generators' state saved at `path`, read without restoring it."""
    return torch.load(path, weights_only=True)


def load(path: Path) -> None:
    restore(read(path))
