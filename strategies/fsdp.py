"""FSDP2's verbs, which the torch mesh strategies (strategies/torch_mesh.py: fsdp, hsdp, fsdp-tp, ...)
run on: `fully_shard` (or `replicate`) units, each block then the root.

Parameters, gradients and optimizer state are DTensors; mixed precision goes through
`MixedPrecisionPolicy` (compute in bf16/fp16, reduce in fp32) rather than autocast, as FSDP2
intends. Checkpoints are torch.distributed.checkpoint directories: each rank writes its own shards,
and a load reshards to whatever the new world size is.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Iterator

from strategies.base import RunContext, StrategyError, compile_blocks
from strategies.single import SingleDeviceStrategy

if TYPE_CHECKING:
    import torch
    import torch.nn as nn
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
    """The FSDP2 machinery of a strategy that lays the model out itself (setup)."""

    gathers_fp8 = True
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
        self._parameters: list[Any] | None = None

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
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        assert self.model is not None and self.optimizer is not None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.ctx.grad_clip <= 0:
            return
        clipped = [p for p in self._model_parameters() if p.grad is not None]
        counted, across = self._gradient_norm_groups(clipped)
        clipped_by_mesh = _by_mesh(clipped)
        # Per device mesh (under tensor parallel the split layers live on another mesh than the rest):
        # DTensor's foreach kernels take one mesh at a time. Each norm is over every rank's shard.
        norms = []
        for params in (clipped_by_mesh if counted is clipped else _by_mesh(counted)).values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if across is not None:  # each of these ranks holds other parameters: the norm sums over them
            squares = [n.to(self.ctx.device).float().reshape(()) ** 2 for n in norms]
            squared = torch.stack(squares).sum() if squares else torch.zeros((), device=self.ctx.device)
            dist.all_reduce(squared, group=across)
            total = squared.sqrt()
        else:
            total = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else norms[0]
        for params in clipped_by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(params, self.ctx.grad_clip, total, foreach=True)

    def _model_parameters(self) -> list[Any]:
        """The model's parameters, listed once: FSDP2 keeps the same sharded parameter objects from
        setup on (a checkpoint loads into them), and walking the module tree on every step is host
        time that an FSDP step, near host-bound on a fast GPU, pays in full."""
        if self._parameters is None:
            self._parameters = list(self.model.parameters())
        return self._parameters

    def _gradient_norm_groups(self, with_gradients: list[Any]) -> tuple[list[Any], Any]:
        """Of the parameters `with_gradients`, those whose gradients the clipping norm counts, and the
        process group over which their squared norms are summed besides (None: every rank holds a
        share of each already)."""
        return with_gradients, None

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
        # Its metadata read first, as load() does: dcp.load would take an unreadable one for a missing
        # one, log a traceback for each of the two files it tries, and raise an AssertionError.
        dcp.FileSystemReader(path).read_metadata()
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": state}, checkpoint_id=path, no_dist=True)
        return state


def _by_mesh(params: list[Any]) -> dict[Any, list[Any]]:
    """`params` grouped by the device mesh their gradients are DTensors on (plain: None)."""
    groups: dict[Any, list[Any]] = {}
    for p in params:
        groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    return groups


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
