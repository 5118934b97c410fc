"""`accelerate-fsdp`: Accelerate driving FSDP2, one unit per block (by class, as Accelerate's
transformer_based_wrap does), with the native fsdp's mixed-precision policy and no autocast."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from strategies.accelerate.driver import AccelerateStrategy
from strategies.accelerate.environment import launched_by_accelerate
from strategies.accelerate.wrap_classes import check_wrap_classes, launched_wrap_classes
from strategies.base import Preset, StrategyError, compile_blocks
from strategies.plan_model import PlanModel

if TYPE_CHECKING:
    import torch.nn as nn
    from accelerate import Accelerator

    from models.blocks import Blocks


class AccelerateFSDPStrategy(AccelerateStrategy):
    description = "Accelerate driving FSDP2 (fully_shard per block)"
    # Accelerate's FSDP2 plugin, given the native fsdp's MixedPrecisionPolicy (gradients reduced in
    # fp32) and no autocast.
    presets = (
        Preset("accelerate-fsdp", description, plan=PlanModel("torch", 3, "low_precision", via_accelerate=True)),
    )
    distributed_type = "FSDP"

    def __init__(self, ctx):
        super().__init__(ctx)
        self._unwrapped_because: str | None = None  # why the blocks were left unwrapped

    @property
    def mode(self) -> str:
        return "fsdp"

    @classmethod
    def recovers_from_oom(cls, options: dict[str, Any]) -> bool:
        return True  # teardown frees the Accelerator and resets its process-wide state

    def check_model(self, model: nn.Module) -> None:
        super().check_model(model)
        blocks = self._block_classes(model)
        if self.file is not None:
            self.file.check_model(model, blocks)
        elif launched_by_accelerate(os.environ):
            names = launched_wrap_classes(os.environ)
            if names:
                where = "accelerate launch (its config file or --fsdp_transformer_layer_cls_to_wrap) sets "
                check_wrap_classes(model, names, where, blocks)

    def _block_classes(self, model: nn.Module) -> list[str]:
        """The classes of the blocks the run finds, to offer where a wrapped class is not the model's."""
        from models.blocks import BlocksError

        try:
            return self.find_blocks(model).classes
        except BlocksError:  # model_blocks= names no class of it: its own line, where the run finds them
            return []

    def compile(self, model: nn.Module) -> str:
        # FSDP hooks each block (gather and release its parameters): per block, as under the native fsdp.
        return compile_blocks(model, self.find_blocks(model))

    def _plugins(self, model: nn.Module) -> dict[str, Any]:
        from accelerate.utils import FullyShardedDataParallelPlugin

        from strategies.fsdp import mixed_precision_policy

        if launched_by_accelerate(os.environ):
            # Every setting from the launcher's FSDP_* environment.
            return {"fsdp_plugin": FullyShardedDataParallelPlugin()}
        blocks = self.find_blocks(model)
        self._unwrapped_because = _why_not_wrapped_by_class(model, blocks)
        if self._unwrapped_because and self.ctx.rank == 0:
            print(
                f"warning: accelerate-fsdp: {self._unwrapped_because}, so the blocks are not sharded one by one and "
                "every parameter is gathered at once for the forward; name the blocks by a class only they have with "
                "model_blocks=<ClassName>, or use strategy=fsdp, which shards the blocks themselves",
                flush=True,
            )
        block_classes = [] if self._unwrapped_because else blocks.classes
        return {
            "fsdp_plugin": FullyShardedDataParallelPlugin(
                fsdp_version=2,
                # The native fsdp's policy: low-precision compute, gradients reduced in fp32, the loss
                # left in fp32 (Accelerate's own would reduce in bf16 and cast the loss to bf16).
                mixed_precision_policy=mixed_precision_policy(self.ctx),
                reshard_after_forward=True,
                # One FSDP unit per block, then the root: as `fsdp` does.
                auto_wrap_policy="transformer_based_wrap" if block_classes else "no_wrap",
                transformer_cls_names_to_wrap=block_classes or None,
                cpu_ram_efficient_loading=False,  # every rank already holds the same seeded weights
            )
        }

    def _handlers(self) -> list[Any]:
        from accelerate.utils import AutocastKwargs

        # FSDP2's MixedPrecisionPolicy casts the parameters, as under the native fsdp and in a
        # hand-written FSDP2 loop; Accelerate would also run the forward under autocast, whose
        # extra casts (layer norms in fp32) neither of those has.
        return [AutocastKwargs(enabled=False)]

    def _after_build(self, accelerator: Accelerator, plugins: dict[str, Any]) -> None:
        if self.ctx.device.type == "cpu":
            self._environment.enable_fsdp_on_cpu(accelerator, plugins["fsdp_plugin"])
            parallelism = self._parallelism_config()
            if parallelism is not None:
                self._environment.attach_parallelism_config(accelerator, parallelism)

    def _check_state_matches_runner(self) -> None:
        super()._check_state_matches_runner()
        if not self.accelerator.is_fsdp2:
            raise StrategyError("accelerate-fsdp runs FSDP2: set fsdp_version: 2 in the accelerate config")

    def _mode_detail(self) -> str:
        return f"{super()._mode_detail()} v{self.accelerator.state.fsdp_plugin.fsdp_version}"

    def _layout(self, blocks: Blocks) -> str | None:
        from strategies.fsdp import fsdp_units

        units = fsdp_units(self.model, blocks)
        return f"fsdp: {units}; {self._unwrapped_because}" if self._unwrapped_because else f"fsdp: {units}"


def _why_not_wrapped_by_class(model: nn.Module, blocks: Blocks) -> str | None:
    """Why Accelerate's transformer_based_wrap cannot shard exactly the blocks, or None. It
    wraps every module of the named classes (isinstance: subclasses too), not the blocks
    themselves, and FSDP2 refuses a block whose parameter is tied to one outside it."""
    from strategies.fsdp import tied_outside

    block_ids = {id(b) for b in blocks.modules}
    block_types = tuple({type(b) for b in blocks.modules})
    for name, m in model.named_modules():
        if (
            m is not model
            and id(m) not in block_ids
            and (isinstance(m, block_types) or type(m).__name__ in blocks.classes)
        ):
            return f"Accelerate wraps by class, and {name} is a {type(m).__name__} outside the blocks"
    tied = tied_outside(model, blocks)
    if tied:
        return f"block {next(iter(tied.values()))} is tied to a parameter outside it"
    return None
