"""The parameters a model shares between modules (a head tied to its embedding), and the check that
Accelerate's prepare() kept them shared: a path that rebuilds the model's parameters (a move to the
meta device and back, as its CPU-RAM-efficient loading does) re-ties them only where the model has
transformers' tie_weights(), and a model trained with them untied is another model than `single`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.base import StrategyError

if TYPE_CHECKING:
    import torch.nn as nn


def shared_parameters(model: nn.Module) -> list[tuple[str, ...]]:
    """Each group of names under which one parameter is reached, sorted, for groups of two or more."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return sorted(tuple(group) for group in names.values() if len(group) > 1)


def check_still_shared(before: list[tuple[str, ...]], model: nn.Module, mode: str) -> None:
    """Refuse, in one line, a prepared `model` (unwrapped) whose parameters are no longer shared as
    the bare model's were (`before`: its shared_parameters())."""
    after = {name: group for group in shared_parameters(model) for name in group}
    for group in before:
        if after.get(group[0]) != group:
            raise StrategyError(
                f"accelerate-{mode}: Accelerate's prepare() made {' and '.join(group)} separate parameters, which the "
                "model shares, so it would train another model than the other strategies; set "
                "fsdp_cpu_ram_efficient_loading: false in the accelerate config, or give the model a tie_weights() "
                "that ties them again"
            )
