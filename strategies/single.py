"""`single`: one process, no parallelism: the reference every other strategy is held to.

Also the home of the plain-PyTorch precision handling (autocast, GradScaler for
fp16, clipping) and of the "torch" checkpoint format that `ddp` and `fsdp` inherit.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager

from strategies.base import OptimizerFactory, Preset, RunContext, Strategy, StrategyError
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


MODEL_FILE = "model.pt"  # the consolidated weights, plain parameter names
OPTIMIZER_FILE = "optimizer.pt"  # optimizer and gradient-scaler state


def started_more_than_one(name: str, processes: int) -> StrategyError:
    """The refusal of a one-process strategy (Strategy.one_process) started as several."""
    return StrategyError(
        f"strategy {name!r} runs in one process but {processes} were started: use nproc=1 "
        "or a multi-process strategy such as ddp"
    )


class SingleDeviceStrategy(Strategy):
    description = "one process, no parallelism (the reference)"
    presets = (Preset("single", description, plan=PlanModel("torch", 0)),)
    listing_order = 0
    one_process = True
    trains_fp8 = True  # and ddp and the FSDP2 strategies, which reuse these verbs
    # Every rank holds the whole model and the same optimizer state: rank 0's copy is the
    # checkpoint, readable at any world size, by single and ddp alike.
    checkpoint_format = "torch"

    @classmethod
    def recovers_from_oom(cls, options: dict[str, Any]) -> bool:
        return True  # plain torch objects, as ddp's and fsdp's (which inherit this): dropped, they are freed

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.scaler: torch.amp.GradScaler | None = None

    def _require_world_size_one(self) -> None:
        if self.ctx.world_size != 1:
            raise started_more_than_one(self.name, self.ctx.world_size)

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        self._require_world_size_one()
        self.model = model.to(self.ctx.device)
        self.optimizer = optimizer_factory(self.model)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def _make_scaler(self) -> torch.amp.GradScaler | None:
        import torch

        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        return torch.amp.GradScaler(self.ctx.device.type) if self.ctx.precision == "fp16" else None

    def autocast(self) -> ContextManager:
        import torch

        if self.ctx.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.ctx.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.ctx.grad_accum > 1:  # a division by 1 would still cost an operator and its backward
            loss = loss / self.ctx.grad_accum
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def clip_gradients(self) -> None:
        import torch

        assert self.model is not None and self.optimizer is not None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.ctx.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.grad_clip)

    def step(self) -> None:
        assert self.optimizer is not None
        self.clip_gradients()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        # The state-dict utilities strip wrapper prefixes ("module.", "_orig_mod.") and gather
        # sharded parameters, so one call serves a plain, DDP or FSDP model.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        assert self.model is not None, "setup() first"
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        assert self.model is not None, "setup() first"
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=True))

    def save(self, path: Path) -> None:
        import torch

        assert self.optimizer is not None, "setup() first"
        model = self.full_state_dict()
        if self.ctx.rank == 0:
            torch.save(model, path / MODEL_FILE)
            torch.save(
                {"optimizer": self.optimizer.state_dict(), "scaler": self._scaler_state()}, path / OPTIMIZER_FILE
            )

    def load(self, path: Path) -> None:
        import torch

        assert self.optimizer is not None, "setup() first"
        # Every rank reads rank 0's copy: the same bytes wherever the checkpoint came from.
        self.load_full_state_dict(torch.load(path / MODEL_FILE, map_location="cpu", weights_only=True))
        rest = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(rest["optimizer"])
        self._load_scaler_state(rest["scaler"])

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        import torch

        return torch.load(path / MODEL_FILE, map_location="cpu", weights_only=True)

    def _scaler_state(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler else None

    def _load_scaler_state(self, state: dict | None) -> None:
        # A checkpoint from another precision carries no scaler (or one this run has no use for):
        # the scaler then starts afresh, as it would at step 0.
        if self.scaler and state:
            self.scaler.load_state_dict(state)
