"""What autograd saves for the backward, counted as the planner's memory accounts are checked."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def saved_bytes(run: Callable[[], object], left_out: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves while `run()` runs: each storage once, those of `left_out`
    (parameters, the inputs) not counted."""
    skip = {t.untyped_storage().data_ptr() for t in left_out}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved.values())
