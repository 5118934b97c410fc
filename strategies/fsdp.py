"""`fsdp`, `fsdp-grad-op`, `fsdp-offload`: FSDP2 (`fully_shard`), each block then the root.

Parameters, gradients and optimizer state are sharded over the ranks as DTensors;
mixed precision goes through `MixedPrecisionPolicy` (compute in bf16/fp16, reduce
in fp32) rather than autocast, as FSDP2 intends. Checkpoints are
torch.distributed.checkpoint directories: each rank writes its own shards, and a
load reshards to whatever the new world size is.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Iterator

from strategies.base import OptimizerFactory, Preset, RunContext, StrategyError, compile_blocks
from strategies.plan_model import PlanModel
from strategies.single import SingleDeviceStrategy

if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from models.blocks import Blocks


def mixed_precision_policy(ctx: RunContext) -> MixedPrecisionPolicy:
    """Compute in the run's low precision, reduce gradients in fp32 (torchtitan's choice); none in fp32."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if ctx.precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=ctx.dtype, reduce_dtype=torch.float32)


class FSDPStrategy(SingleDeviceStrategy):
    description = "FSDP2 fully_shard: parameters, gradients and optimizer state sharded"
    gathers_fp8 = True
    # Each name fixes both options that tell the variants apart.
    presets = (
        Preset(
            "fsdp",
            "FSDP2 full shard (ZeRO-3 analogue)",
            {"reshard_after_forward": True, "cpu_offload": False},
            PlanModel("torch", 3, "low_precision"),
        ),
        Preset(
            "fsdp-grad-op",
            "FSDP2 without resharding after forward (ZeRO-2 analogue)",
            {"reshard_after_forward": False, "cpu_offload": False},
            PlanModel("torch", 3, "low_precision", reshard_after_forward=False),
        ),
        Preset(
            "fsdp-offload",
            "FSDP2 full shard, parameters and optimizer on CPU",
            {"reshard_after_forward": True, "cpu_offload": True},
            PlanModel("torch", 3, "low_precision", offload_optimizer=True, offload_params=True),
        ),
    )
    listing_order = 20
    backend_modules = ("torch.distributed.fsdp", "torch.distributed.checkpoint")
    checkpoint_format = "dcp"

    def __init__(
        self,
        ctx: RunContext,
        *,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        prefetch_blocks: int = 0,
        sync_each_micro_step: bool = True,
    ):
        super().__init__(ctx)
        self.reshard_after_forward = bool(reshard_after_forward)
        self.cpu_offload = bool(cpu_offload)
        if not isinstance(sync_each_micro_step, bool):
            raise StrategyError(f"strategy_options.sync_each_micro_step={sync_each_micro_step} must be true or false")
        # True: reduce-scatter on every micro-step and accumulate sharded gradients, as torchtitan
        # and DeepSpeed ZeRO-3 do. False: skip it until the last micro-step (less communication,
        # but each rank keeps the whole unsharded gradient while accumulating).
        self.sync_each_micro_step = sync_each_micro_step
        if not isinstance(prefetch_blocks, int) or prefetch_blocks < 0:
            raise StrategyError(
                f"strategy_options.prefetch_blocks={prefetch_blocks} must be a whole number >= 0 "
                "(0: FSDP2's own one-block prefetch)"
            )
        self.prefetch_blocks = prefetch_blocks

    def _policies(self) -> dict:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        mp = mixed_precision_policy(self.ctx)
        offload: OffloadPolicy = OffloadPolicy()
        if self.cpu_offload:
            # Pinned host memory only helps (and only exists) with an accelerator to copy to.
            offload = CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")
        return {"mp_policy": mp, "offload_policy": offload}

    def compile(self, model: nn.Module) -> str:
        # Each block before it is sharded: FSDP's hooks stay between the graphs.
        return compile_blocks(model, self.find_blocks(model))

    def _fsdp_mesh(self) -> DeviceMesh:
        """The mesh FSDP shards over: every rank, one dimension."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))

    def _before_sharding(self, model: nn.Module) -> None:
        """Anything to do to the model on the device before FSDP shards it (fsdp-tp: tensor parallel)."""

    def _wrap(self, module: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, policies: dict) -> None:
        """Make `module` one unit over `mesh`: its parameters sharded, gathered for its forward and backward."""
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, **policies)

    def setup(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        mesh = self._fsdp_mesh()
        policies = self._policies()
        if not self.cpu_offload:
            model = model.to(self.ctx.device)
        self._before_sharding(model)
        found = self.find_blocks(model)
        tied = tied_outside(model, found)
        blocks = [block for block in found.modules if id(block) not in tied]
        for block in blocks:
            self._wrap(block, mesh, self.reshard_after_forward, policies)
        self._set_explicit_prefetch(blocks)
        # The root holds what no block does (embeddings, final norm, head); it is
        # gathered again for backward at once, so resharding it after forward buys nothing.
        self._wrap(model, mesh, self.reshard_after_forward and not blocks, policies)
        self.layout = f"{self._layout_name()}: {fsdp_units(model, found)}"
        if tied:
            self.layout += f" ({', '.join(tied.values())}: tied to a parameter outside, kept in the root's unit)"
        self.model = model
        self.optimizer = optimizer_factory(model)
        self.scaler = self._make_scaler()
        return self.model, self.optimizer

    def _layout_name(self) -> str:
        return "fsdp"

    def _set_explicit_prefetch(self, blocks: list[nn.Module]) -> None:
        """Issue the all-gathers of the next `prefetch_blocks` blocks early (forward and
        backward), trading memory for overlap as torchtitan's explicit prefetching does."""
        n = self.prefetch_blocks
        if not n:
            return
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + n])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - n) : i][::-1])

    def _make_scaler(self) -> torch.amp.GradScaler | None:
        if self.ctx.precision != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        # Sharded gradients: the inf/nan check must agree across ranks.
        return ShardedGradScaler(self.ctx.device.type)

    def autocast(self) -> ContextManager:
        return contextlib.nullcontext()  # MixedPrecisionPolicy casts parameters instead

    def clip_gradients(self) -> None:
        import torch
        from torch.distributed.tensor import DTensor

        assert self.model is not None and self.optimizer is not None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.ctx.grad_clip <= 0:
            return
        # Per device mesh (under tensor parallel the split layers live on the 2D mesh, the rest on
        # FSDP's): DTensor's foreach kernels take one mesh at a time. Each norm is over every rank's
        # shard, not this rank's.
        by_mesh: dict[Any, list[torch.Tensor]] = {}
        for p in self.model.parameters():
            if p.grad is not None:
                by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
        norms = []
        for params in by_mesh.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        total = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else norms[0]
        for params in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(params, self.ctx.grad_clip, total, foreach=True)

    @contextlib.contextmanager
    def _gradient_sync_off(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def no_sync(self) -> ContextManager:
        return contextlib.nullcontext() if self.sync_each_micro_step else self._gradient_sync_off()

    def _sharded_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        # Keyed by parameter name, not by position, and sharded as the model is: what DCP
        # needs to write each rank's part and to reshard it on load.
        state: dict[str, Any] = {"model": get_model_state_dict(self.model), "optimizer": self._optimizer_state()}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        return state

    def _optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state keyed by parameter name, its tensors sharded as the parameters are."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        # On a fresh optimizer this takes one zero-lr step to create the state DCP loads into.
        return get_optimizer_state_dict(self.model, self.optimizer)

    def _load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Put `state` (as _optimizer_state gives it, filled by a checkpoint) into the optimizer."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state)

    def save(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp

        from strategies.dcp_layout import storable

        assert self.model is not None and self.optimizer is not None, "setup() first"
        dcp.save(storable(self._sharded_state()), checkpoint_id=path)

    def load(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        from strategies.dcp_layout import restore_layout, storable

        assert self.model is not None and self.optimizer is not None, "setup() first"
        live = self._sharded_state()
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        if not any(key.startswith("scaler.") for key in saved):
            live.pop("scaler", None)  # saved in another precision: the scaler starts afresh
        state = storable(live)
        dcp.load(state, checkpoint_id=path)
        state = restore_layout(state, live)
        set_model_state_dict(self.model, state["model"])
        self._load_optimizer_state(state["optimizer"])
        self._load_scaler_state(state.get("scaler"))

    @classmethod
    def read_full_state_dict(cls, path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
        import torch.distributed.checkpoint as dcp

        # Read only the model's entries into the bare model's tensors: DCP stitches the shards
        # together whatever the world size that wrote them.
        state = {name: t.detach().clone() for name, t in model.state_dict().items()}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": state}, checkpoint_id=path, no_dist=True)
        return state


def tied_outside(model: nn.Module, blocks: Blocks) -> dict[int, str]:
    """The blocks (id -> name) that share a parameter with a module outside them, as a head
    tied to the embedding does: FSDP2 refuses a parameter in two units, so such a block
    stays in the root's unit."""
    owners: dict[int, set[int]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(id(module))
    names = {id(m): name for name, m in model.named_modules()}
    tied = {}
    for block in blocks.modules:
        inside = {id(m) for m in block.modules()}
        if any(owners[id(p)] - inside for p in block.parameters()):
            tied[id(block)] = names[id(block)]
    return tied


def fsdp_units(model: nn.Module, blocks: Blocks) -> str:
    """The FSDP units `model` has once sharded, as the run reports them: '6 units of
    DecoderLayer + root', plus any unit outside the blocks by its class ('+ 1 LayerNorm')."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    block_ids = {id(b) for b in blocks.modules}
    in_blocks = Counter(_unwrapped_class(m) for m in units if id(m) in block_ids)
    others = Counter(_unwrapped_class(m) for m in units if id(m) not in block_ids)
    parts = []
    if in_blocks:
        n = sum(in_blocks.values())
        what = f"of {next(iter(in_blocks))}" if len(in_blocks) == 1 else f"({_counted(in_blocks)})"
        parts.append(f"{n} unit{'s' if n != 1 else ''} {what}")
    if others:
        parts.append(_counted(others))
    return " + ".join(parts + ["root"]) if parts else "1 unit (the root)"


def _counted(classes: Counter) -> str:
    return " + ".join(f"{n} {name}" for name, n in classes.items())


def _unwrapped_class(module: nn.Module) -> str:
    """The class fully_shard derived the module's class from (FSDPLayerNorm -> LayerNorm)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule)).__name__
