"""The optimizer and learning-rate schedule every strategy shares, so that only
the backend differs between runs.

Left unset, the schedule follows the model and the run, as the GPT-2/GPT-3 recipes do: a
peak learning rate by model size (GPT-3's table, which nanoGPT and llm.c use for GPT-2
sizes), a linear warm-up over a tenth of the run, then cosine decay to a tenth of the peak.
A fixed 3e-3 with a 3-step warm-up, right for a 0.1M-parameter model, made gpt2-124m's
loss jump from 10.9 to 11.7 at step 6 on an H100.

Its shape (lr_schedule) is that cosine, or one of DeepSpeed's: `constant` is its WarmupLR and
`linear` its WarmupDecayLR, computed step by step as DeepSpeed computes them under its engine,
so that every strategy of a comparison can train under the schedule a DeepSpeed JSON's
`scheduler` section runs (strategies/deepspeed_file.py), DeepSpeed's own scheduler included.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from configs.schema import DEEPSPEED_MIN_WARMUP, DEEPSPEED_SCHEDULERS
from harness.train.noise import RoundingNoise
from strategies.memory import local_tensor


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's split: matrices and embeddings decay, biases and norms do not. Each is split again
    by device mesh where the parameters live on several (fsdp-tp: the tensor-parallel layers on the
    2D mesh, the rest on FSDP's): AdamW's foreach kernels take the tensors of one mesh at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for decays, decay in ((True, weight_decay), (False, 0.0)):
        chosen = [p for p in params if (p.dim() >= 2) == decays]
        groups += [{"params": same_mesh, "weight_decay": decay} for same_mesh in _by_device_mesh(chosen)]
    return groups


def _by_device_mesh(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """`params` grouped by the device mesh they are DTensors on (plain tensors: none), in order of
    first appearance; one group (perhaps empty) when they share one."""
    by_mesh: dict[Any, list[nn.Parameter]] = {}
    for p in params:
        by_mesh.setdefault(getattr(p, "device_mesh", None), []).append(p)
    return list(by_mesh.values()) or [[]]


def adamw_factory(
    lr: float, betas: tuple[float, float], weight_decay: float, noise: RoundingNoise | None = None
) -> Callable[[nn.Module], torch.optim.Optimizer]:
    """The run's AdamW; with `noise`, its gradients are nudged before every step (a noise run)."""

    def build(model: nn.Module) -> torch.optim.Optimizer:
        groups = param_groups(model, weight_decay)
        on_cuda = all(local_tensor(p).is_cuda for g in groups for p in g["params"])
        # The fused kernel is one launch per step on CUDA; foreach (the default) elsewhere.
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True if on_cuda else None)
        return noise.attach(optimizer) if noise else optimizer

    return build


def lr_at(
    step: int,
    *,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    total_steps: int,
    shape: str = "cosine",
    warmup_type: str = "linear",
) -> float:
    """The learning rate of step `step` (from 0) of `total_steps`, of the schedule's shape:

    cosine: linear warm-up, then cosine decay to min_lr at the last step (nanoGPT's get_lr);
    constant, linear: DeepSpeed's WarmupLR and WarmupDecayLR with warmup_min_lr=min_lr,
        warmup_max_lr=lr, warmup_num_steps=warmup_steps, total_num_steps=total_steps (deepspeed_lr).
    """
    if shape in DEEPSPEED_SCHEDULERS:
        return deepspeed_lr(
            step,
            lr=lr,
            min_lr=min_lr,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            decays=shape == "linear",
            warmup_type=warmup_type,
        )
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if total_steps <= warmup_steps + 1:
        return lr
    progress = (step - warmup_steps) / (total_steps - 1 - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (lr - min_lr)


def deepspeed_lr(
    step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int, decays: bool, warmup_type: str
) -> float:
    """The learning rate DeepSpeed's WarmupLR (decays=False) or WarmupDecayLR trains step `step`
    with, in DeepSpeed's own arithmetic. The engine builds the scheduler at iteration -1, where it
    holds warmup_min_lr, and steps it after each optimizer step: step k runs at iteration k - 1, so
    the first two steps both run at min_lr. The warm-up (log: log(i + 1) / log(W); linear: i / W)
    lasts W = max(2, warmup_steps) iterations; WarmupDecayLR then falls linearly to min_lr at
    iteration total_steps."""
    iteration = step - 1
    if iteration < 0:
        return min_lr
    warmup = max(DEEPSPEED_MIN_WARMUP, warmup_steps)
    if iteration < warmup:
        if warmup_type == "log":
            gamma = (1.0 / math.log(warmup)) * math.log(iteration + 1)
        else:
            gamma = iteration / warmup
    elif decays:
        gamma = max(0.0, float(total_steps - iteration) / float(max(1.0, total_steps - warmup)))
    else:
        gamma = 1.0
    return min_lr + ((lr - min_lr) * gamma)


# GPT-3's peak learning rates by parameter count (Brown et al. 2020, table 2.1).
GPT3_LEARNING_RATES = (
    (125e6, 6.0e-4),
    (350e6, 3.0e-4),
    (760e6, 2.5e-4),
    (1.3e9, 2.0e-4),
    (2.7e9, 1.6e-4),
    (6.7e9, 1.2e-4),
    (13e9, 1.0e-4),
    (175e9, 0.6e-4),
)
# Below the table the first segment's slope is carried on, capped here: the rate that trains the
# CPU-sized presets (gpt-nano, gpt-micro) smoothly on the Markov data.
SMALL_MODEL_MAX_LR = 3e-3
WARMUP_FRACTION = 0.1  # of the run's steps, when warmup_steps is unset
MIN_LR_FRACTION = 0.1  # of the peak, when min_lr is unset (nanoGPT's and Chinchilla's choice)


def lr_for_model_size(params: int) -> float:
    """GPT-3's peak learning rate for a model of `params` parameters, interpolated log-log."""
    sizes = [math.log(n) for n, _ in GPT3_LEARNING_RATES]
    rates = [math.log(lr) for _, lr in GPT3_LEARNING_RATES]
    x = math.log(max(params, 1))
    if x >= sizes[-1]:
        return GPT3_LEARNING_RATES[-1][1]
    i = max(1, bisect.bisect_right(sizes, x))  # the segment holding x (the first one below the table)
    slope = (rates[i] - rates[i - 1]) / (sizes[i] - sizes[i - 1])
    return min(SMALL_MODEL_MAX_LR, math.exp(rates[i - 1] + slope * (x - sizes[i - 1])))


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule of one run, with what was set and what was derived."""

    lr: float
    min_lr: float
    warmup_steps: int
    derived: tuple[str, ...] = ()  # the keys left unset, filled here
    shape: str = "cosine"  # configs/schema.py LR_SCHEDULES
    warmup_type: str = "linear"  # configs/schema.py WARMUP_TYPES: log under DeepSpeed's shapes only

    def at(self, step: int, total_steps: int) -> float:
        return lr_at(
            step,
            lr=self.lr,
            min_lr=self.min_lr,
            warmup_steps=self.warmup_steps,
            total_steps=total_steps,
            shape=self.shape,
            warmup_type=self.warmup_type,
        )

    def describe(self) -> str:
        how = " (" + ", ".join(self.derived) + " from the model and the run)" if self.derived else ""
        if self.shape == "cosine":
            steps = f"{self.warmup_steps} step" + ("s" if self.warmup_steps != 1 else "")
            return f"lr {self.lr:.1e} -> {self.min_lr:.1e}, warm-up {steps}{how}"
        then = "constant" if self.shape == "constant" else f"linear to {self.min_lr:.1e}"
        return (
            f"lr {self.min_lr:.1e} -> {self.lr:.1e} over a {self.warmup_type} warm-up of "
            f"{max(DEEPSPEED_MIN_WARMUP, self.warmup_steps)} steps, then {then} "
            f"(DeepSpeed's {DEEPSPEED_SCHEDULERS[self.shape]}){how}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "lr": self.lr,
            "min_lr": self.min_lr,
            "warmup_steps": self.warmup_steps,
            "shape": self.shape,
            "warmup_type": self.warmup_type,
            "derived": list(self.derived),
        }


def resolve_schedule(
    lr: float | None,
    min_lr: float | None,
    warmup_steps: int | None,
    *,
    params: int,
    steps: int,
    shape: str | None = None,
    warmup_type: str | None = None,
) -> Schedule:
    """The run's schedule: what the config sets, the rest from the model's size and the run's length.
    Unset, min_lr is a tenth of the peak under the cosine, and 0 under DeepSpeed's shapes (their
    warmup_min_lr's default, which Hugging Face's Trainer fills "auto" with)."""
    derived = tuple(k for k, v in (("lr", lr), ("min_lr", min_lr), ("warmup_steps", warmup_steps)) if v is None)
    shape = shape or "cosine"
    peak = lr if lr is not None else lr_for_model_size(params)
    floor = MIN_LR_FRACTION * peak if shape == "cosine" else 0.0
    return Schedule(
        lr=peak,
        min_lr=min_lr if min_lr is not None else floor,
        warmup_steps=warmup_steps if warmup_steps is not None else max(1, round(WARMUP_FRACTION * steps)),
        derived=derived,
        shape=shape,
        warmup_type=warmup_type or "linear",
    )
