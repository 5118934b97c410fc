"""Rounding noise: the compare's yardstick for "the same training, computed differently".

Two backends that train the same model on the same data never round the same way: they
reduce in another order, cast in other places, pick other kernels. Their loss curves part
by however much the training amplifies rounding-sized differences, which depends on the
model, the precision, the learning rate and the step. A noise run measures exactly that:
the reference run again, with every gradient nudged before each optimizer step, from its
own seed: each element moves by a random amount of up to one rounding step (the precision's
unit roundoff) of its tensor's typical magnitude (its RMS). That is how rounding errs inside
the sums a backward pass computes: by the size of the terms, not of the result, so a small
gradient element can change sign, and Adam's first steps, nearly sign updates, carry it
(on gpt-mini in bf16 a nudge of each element's own size stayed 10x under what the
DeepSpeed and FSDP policies differ by at step 4; this one matched it). On a GPU the
nondeterministic kernels add their own differences on top. How far the noise runs stray
from the reference is the spread a correct backend may show.
"""

from __future__ import annotations

import torch

from harness.train.roundoff import UNIT_ROUNDOFF
from strategies.base import compute_precision
from strategies.memory import local_tensor


class RoundingNoise:
    """Moves each gradient element by up to u x its tensor's RMS before every optimizer step."""

    def __init__(self, precision: str, seed: int, rank: int):
        self.size = UNIT_ROUNDOFF[compute_precision(precision)]
        # One stream per rank: the ranks' shards get independent nudges, as their roundings are.
        self.seed = seed * 1_000_003 + rank
        self._generators: dict[torch.device, torch.Generator] = {}

    def attach(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.nudge(opt))
        return optimizer

    @torch.no_grad()
    def nudge(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = local_tensor(param.grad)
                if grad.numel() == 0:
                    continue
                scale = grad.float().pow(2).mean().sqrt() * self.size
                noise = torch.rand(grad.shape, generator=self._generator(grad.device), device=grad.device)
                grad.add_(noise.mul_(2).sub_(1).mul_(scale).to(grad.dtype))

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]
