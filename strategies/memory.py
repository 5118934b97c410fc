"""What a rank holds, measured from the tensors themselves (so it works on CPU).

Bytes are kept per device type ("cpu", "cuda") so that offload shows where the
bytes live, not just how many there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the planner imports CATEGORIES without torch
    import torch

CATEGORIES = ("params", "grads", "optimizer")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly sharded) tensor stored on this rank."""
    to_local = getattr(t, "to_local", None)  # DTensor from FSDP2
    return to_local() if callable(to_local) else t


def bytes_by_device(tensors: Iterable[torch.Tensor | None]) -> dict[str, int]:
    """Sum of numel * element size per device type; a tensor seen twice (tied weights) counts once."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        local = local_tensor(t)
        if local.device.type == "meta":
            continue
        out[local.device.type] = out.get(local.device.type, 0) + local.numel() * local.element_size()
    return out


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    import torch

    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


@dataclass
class MemoryBreakdown:
    """Bytes this rank holds per category, each split by device type."""

    params: dict[str, int] = field(default_factory=dict)
    grads: dict[str, int] = field(default_factory=dict)
    optimizer: dict[str, int] = field(default_factory=dict)

    def total(self, category: str) -> int:
        return sum(getattr(self, category).values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {c: dict(getattr(self, c)) for c in CATEGORIES}

    @classmethod
    def of(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> "MemoryBreakdown":
        """The plain-PyTorch measurement: parameters, their .grad, and the optimizer's state."""
        params = list(model.parameters())
        return cls(
            params=bytes_by_device(params),
            grads=bytes_by_device(p.grad for p in params),
            optimizer=bytes_by_device(optimizer_state_tensors(optimizer)) if optimizer is not None else {},
        )
