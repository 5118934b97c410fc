"""Deliberately wrong strategies, to prove that the compare's loss verdict catches real errors.

Each is a small DDP variant with one mistake a backend could make, registered the way a
third-party plugin is: through the `parabench.strategies` entry-point group
(`entry_points()` below writes the dist-info that declares them). tests/compare/test_verdict.py and
bench/verdict_sensitivity.py use them; they are never installed with parabench.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from strategies.base import OptimizerFactory
from strategies.ddp import DDPStrategy

DIST_NAME = "parabench_wrong_plugins"


class LearningRateOff(DDPStrategy):
    """Sets every learning rate `lr_factor` times the schedule's (an off-by-a-bit scheduler)."""

    description = "wrong on purpose: learning rate scaled by lr_factor"

    def __init__(self, ctx, *, lr_factor: float = 1.1, **ddp_options):
        super().__init__(ctx, **ddp_options)
        self.lr_factor = float(lr_factor)

    def set_lr(self, lr: float) -> None:
        super().set_lr(lr * self.lr_factor)


class GradientsNotReduced(DDPStrategy):
    """Each rank steps on its own gradients: the all-reduce never happens. (DDP decides in the
    forward whether the backward reduces, so its sync flag is switched off for good, rather than
    a no_sync() around backward alone, which would change nothing.)"""

    description = "wrong on purpose: gradients never averaged over ranks"

    def setup(self, model: torch.nn.Module, optimizer_factory: OptimizerFactory):
        wrapped, optimizer = super().setup(model, optimizer_factory)
        assert isinstance(wrapped, DistributedDataParallel)
        wrapped.require_backward_grad_sync = False
        return wrapped, optimizer


class DropsRankOneGradients(DDPStrategy):
    """Rank 1's gradients are zeroed before the all-reduce (a lost contribution), the mean
    still divided by the whole world size."""

    description = "wrong on purpose: rank 1's gradients dropped"

    def setup(self, model: torch.nn.Module, optimizer_factory: OptimizerFactory):
        wrapped, optimizer = super().setup(model, optimizer_factory)

        def drop_then_average(process_group, bucket):
            if dist.get_rank() == 1:
                bucket.buffer().zero_()
            return allreduce_hook(process_group, bucket)

        wrapped.register_comm_hook(None, drop_then_average)
        return wrapped, optimizer


PLUGINS = {
    "lr-off": LearningRateOff,
    "grads-not-reduced": GradientsNotReduced,
    "drops-rank1-grads": DropsRankOneGradients,
}
# Relative learning-rate errors registered as lr-off-<error> (bench/verdict_sensitivity.py).
LR_ERRORS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def lr_error_name(error: float) -> str:
    return f"lr-off-{error:g}"


def register_lr_errors(registry) -> None:
    """An entry point's register function: one name per learning-rate error, its factor preset."""
    for error in LR_ERRORS:
        registry.register(
            lr_error_name(error),
            LearningRateOff,
            f"wrong on purpose: learning rate x {1 + error:g}",
            lr_factor=1 + error,
        )


def entry_points(site: Path) -> Path:
    """Write a dist-info into `site` that declares PLUGINS in the `parabench.strategies` group;
    with `site` and the repository root on PYTHONPATH, parabench finds them as installed plugins."""
    dist_info = site / f"{DIST_NAME}-1.0.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1.0\n")
    lines = [f"{name} = bench.wrong_plugins:{cls.__name__}" for name, cls in PLUGINS.items()]
    lines.append("lr-errors = bench.wrong_plugins:register_lr_errors")
    (dist_info / "entry_points.txt").write_text("[parabench.strategies]\n" + "\n".join(lines) + "\n")
    return site
