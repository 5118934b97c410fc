"""`dataparallel`: torch.nn.DataParallel, one process driving every visible GPU.

The design the DDP guides tell people to leave, measured beside ddp: each step, one Python
process copies the model from GPU 0 to the others, splits the micro-batch over them, runs the
replicas in threads, gathers their losses onto GPU 0, and sums every replica's gradients
there. Only GPU 0 holds gradients and optimizer state; the other GPUs hold their replica and
its activations for the length of one forward and backward.

It needs two GPUs or more: with one, DataParallel would call the bare model (that is `single`).
Checkpoints are single's "torch" format, as for ddp: the bare model on GPU 0 is the model.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager

from strategies.base import OptimizerFactory, Preset, RunContext, StrategyError
from strategies.plan_model import PlanModel
from strategies.single import SingleDeviceStrategy

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

MIN_GPUS = 2


class DataParallelStrategy(SingleDeviceStrategy):
    description = "torch.nn.DataParallel: one process drives every visible GPU, gradients summed on GPU 0"
    presets = (Preset("dataparallel", description, plan=PlanModel("torch", 0, replicas="threads")),)
    listing_order = 15
    one_process = True
    trains_fp8 = False  # its replicas are copies made each forward, float8 state and all: not checked

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.bare: nn.Module | None = None  # the model itself, on GPU 0; self.model runs it on every GPU
        if getattr(ctx.config, "compile", False):
            # A compiled module's replicas would call the original's compiled forward, on GPU 0's weights.
            raise StrategyError("strategy 'dataparallel' cannot compile its replicas: use compile=false, or ddp")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        import torch

        visible = torch.cuda.device_count()
        if visible < MIN_GPUS:
            return (
                f"torch.nn.DataParallel splits each batch over the GPUs of one process, and {visible} "
                f"GPU{'' if visible == 1 else 's'} {'is' if visible == 1 else 'are'} visible here: "
                f"run it where {MIN_GPUS} or more are"
            )
        return None

    @classmethod
    def unsupported_reason(cls, device_type: str, options: dict[str, Any]) -> str | None:
        if device_type != "cuda":
            return "DataParallel replicates the model over GPUs; on a CPU it would run as single"
        return None

    def devices(self) -> list[torch.device]:
        import torch

        if self.ctx.device.type != "cuda":
            return [self.ctx.device]
        return [torch.device("cuda", index) for index in range(torch.cuda.device_count())]

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        self._require_world_size_one()
        self.bare = model.to(self.ctx.device)  # GPU 0: DataParallel's first device holds the model
        self.optimizer = optimizer_factory(self.bare)
        low_precision = self.ctx.dtype if self.ctx.precision != "fp32" else None
        self.model = mean_loss_over_gpus(self.bare, self.devices(), low_precision)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def autocast(self) -> ContextManager:
        # Each replica's thread enters the run's autocast itself (mean_loss_over_gpus).
        return contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        assert self.model is not None, "setup() first"
        return {name: tensor.detach().cpu() for name, tensor in self.bare.state_dict().items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        assert self.model is not None, "setup() first"
        self.bare.load_state_dict(state, strict=True)

    def teardown(self) -> None:
        self.bare = None
        super().teardown()


def mean_loss_over_gpus(model: nn.Module, devices: list[torch.device], autocast_dtype: torch.dtype | None) -> nn.Module:
    """`model` run by DataParallel over `devices`, returning the mean loss over the whole micro-batch.
    (Its classes are made here, where torch is imported: `runner.py list` reads this file without it.)"""
    import torch
    import torch.nn as nn

    class Replica(nn.Module):
        """What each GPU's thread runs: the model under the run's autocast, which a new thread
        does not inherit (DataParallel passes on only whether autocast is on, and a thread's
        default low-precision type is fp16, not bf16)."""

        def __init__(self, model: nn.Module):
            super().__init__()
            self.model = model

        def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            if autocast_dtype is None:
                loss = self.model(inputs, targets)
            else:
                with torch.autocast(devices[0].type, dtype=autocast_dtype):
                    loss = self.model(inputs, targets)
            # This replica's rows times their mean loss: summed over the replicas and divided by the
            # micro-batch, the mean over every row, also where the rows do not split evenly.
            return (loss * inputs.shape[0]).reshape(1)

    class MeanOverReplicas(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.replicated = nn.DataParallel(Replica(model), device_ids=[d.index for d in devices])

        def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return self.replicated(inputs, targets).sum() / inputs.shape[0]

    return MeanOverReplicas()
