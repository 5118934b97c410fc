"""What each strategy name does, in the planner's terms: what it shards, where it keeps
bytes, how it runs mixed precision, which buffers it allocates and when it communicates.

The planner keys on registered strategy names (a plugin whose name is not here gets no
prediction, and says so); the buffer sizes come from the same defaults the plugins use.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.planner.model_shape import ModelShape, PlanError

# DeepSpeed 0.19's ZeRO defaults (deepspeed/runtime/zero/config.py), which the plugins leave alone.
DEEPSPEED_DEFAULTS = {
    "reduce_bucket_size": 5e8,  # elements per gradient reduction bucket
    "allgather_bucket_size": 5e8,
    "contiguous_gradients": True,  # gradients copied into a flat buffer as they are produced
    "stage3_prefetch_bucket_size": 5e7,  # elements fetched ahead of use
    "stage3_param_persistence_threshold": 1e5,  # smaller parameters stay gathered on every rank
    "stage3_max_live_parameters": 1e9,
    "sub_group_size": 1e9,  # elements per optimizer sub-group (one flat fp32 tensor each)
}


@dataclass(frozen=True)
class Backend:
    """A strategy as the planner models it."""

    name: str
    engine: str  # "torch": fp32 parameters, autocast or FSDP's policy; "deepspeed": the model cast to bf16/fp16
    stage: int  # what is sharded, in ZeRO's terms: 0 nothing, 1 optimizer, 2 + gradients, 3 + parameters
    # The low-precision forward: "autocast" casts weights per matmul and keeps an fp32 residual
    # stream; "low_precision" runs the whole model in bf16/fp16 (FSDP's policy, DeepSpeed's cast).
    mixed_precision: str = "autocast"
    reshard_after_forward: bool = True  # stage 3 only: False keeps the gathered parameters until backward
    offload_optimizer: bool = False  # optimizer state (and the fp32 master) in CPU memory
    offload_params: bool = False  # the parameter shards in CPU memory
    reduce_in_fp32: bool = True  # torch engine under bf16: gradients reduced in fp32 (FSDP reduce_dtype, DDP's fp32 grads)
    via_accelerate: bool = False
    data_parallel: bool = False  # stage 0 run through DistributedDataParallel (ddp, accelerate-ddp)
    options: dict[str, Any] = field(default_factory=dict)  # bucket sizes and other knobs, defaults filled in

    @property
    def replicated(self) -> bool:
        return self.stage == 0

    def ddp_wrapped(self, world: int) -> bool:
        """Whether the model runs inside DistributedDataParallel: ddp always, even on one rank;
        Accelerate only with more than one process (for one it prepares the bare model)."""
        return self.data_parallel and (world > 1 or not self.via_accelerate)

    def option(self, key: str) -> Any:
        return self.options[key]

    @property
    def sharded_grads_every_micro_step(self) -> bool:
        """Stage 3 under accumulation: gradients reduce-scattered on every micro-step (DeepSpeed's
        ZeRO-3 always, parabench's fsdp by default), or kept unsharded until the last
        (FSDP2 with gradient sync off: Accelerate's FSDP, fsdp with sync_each_micro_step=false)."""
        return self.engine == "deepspeed" or bool(self.options.get("sync_each_micro_step", False))


_TORCH = {
    "single": Backend("single", "torch", 0),
    "ddp": Backend("ddp", "torch", 0, data_parallel=True),
    "fsdp": Backend("fsdp", "torch", 3, "low_precision"),
    "fsdp-grad-op": Backend("fsdp-grad-op", "torch", 3, "low_precision", reshard_after_forward=False),
    "fsdp-offload": Backend("fsdp-offload", "torch", 3, "low_precision", offload_optimizer=True, offload_params=True),
    "accelerate-ddp": Backend("accelerate-ddp", "torch", 0, via_accelerate=True, data_parallel=True),
    # Accelerate's FSDP2 plugin, given the native fsdp's MixedPrecisionPolicy (gradients reduced in fp32)
    # and no autocast (strategies/accelerate.py).
    "accelerate-fsdp": Backend("accelerate-fsdp", "torch", 3, "low_precision", via_accelerate=True),
}
_DEEPSPEED = {
    "zero1": Backend("zero1", "deepspeed", 1, "low_precision"),
    "zero2": Backend("zero2", "deepspeed", 2, "low_precision"),
    "zero3": Backend("zero3", "deepspeed", 3, "low_precision"),
    "zero2-offload": Backend("zero2-offload", "deepspeed", 2, "low_precision", offload_optimizer=True),
    "zero3-offload": Backend("zero3-offload", "deepspeed", 3, "low_precision", offload_optimizer=True, offload_params=True),
    "accelerate-zero1": Backend("accelerate-zero1", "deepspeed", 1, "low_precision", via_accelerate=True),
    "accelerate-zero2": Backend("accelerate-zero2", "deepspeed", 2, "low_precision", via_accelerate=True),
    "accelerate-zero3": Backend("accelerate-zero3", "deepspeed", 3, "low_precision", via_accelerate=True),
}
BACKENDS: dict[str, Backend] = {**_TORCH, **_DEEPSPEED}

# DDP's own default bucket (torch.nn.parallel.DistributedDataParallel), used where a plugin sets none.
DDP_BUCKET_CAP_MB = 25.0


def counterpart(backend: Backend, *, offload: bool, via_accelerate: bool) -> str | None:
    """The strategy with the same engine, stage and resharding, but with (or without) offload and
    Accelerate as asked: zero3 for zero3-offload, fsdp for accelerate-fsdp."""
    same = ("engine", "stage", "reshard_after_forward", "data_parallel")
    return next((b.name for b in BACKENDS.values()
                 if all(getattr(b, key) == getattr(backend, key) for key in same)
                 and b.offload_optimizer == offload and b.via_accelerate == via_accelerate), None)


def known_backends() -> list[str]:
    return list(BACKENDS)


def _plugin_defaults(name: str) -> dict[str, Any]:
    """Keyword defaults of the registered plugin class, overlaid by the name's preset options."""
    from strategies.registry import default_registry

    registry = default_registry()
    return registry.get(name).option_values() if name in registry.names() else {}


def _deepspeed_sizing(backend: Backend, shape: ModelShape, world: int) -> dict[str, Any]:
    """The bucket sizes both DeepSpeed plugins (direct and through Accelerate) give this model."""
    from strategies.deepspeed_config import ModelSize, sizing_config

    size = ModelSize(shape.params, shape.matrix_width())
    return sizing_config(size, backend.stage, world).get("zero_optimization", {})


def backend_for(name: str, shape: ModelShape, precision: str, world: int,
                user_options: dict[str, Any] | None = None) -> Backend:
    """The planner's model of strategy `name` for this model on `world` GPUs, with its bucket
    sizes and knobs filled in."""
    if name not in BACKENDS:
        raise PlanError(f"no planner model for strategy {name!r}: the planner knows {', '.join(BACKENDS)}")
    backend = BACKENDS[name]
    options = {**_plugin_defaults(name), **(user_options or {})}
    if backend.engine == "deepspeed":
        options = {**DEEPSPEED_DEFAULTS, **_deepspeed_sizing(backend, shape, world), **options}
        options.setdefault("overlap_comm", backend.stage == 3)  # DeepSpeed's own default
        # Both DeepSpeed plugins leave DeepSpeed's default: gradients reduced in the model's dtype.
        options.setdefault("communication_data_type", precision)
    else:
        options.setdefault("bucket_cap_mb", DDP_BUCKET_CAP_MB)
        # Both the ddp plugin and accelerate-ddp (given DDP kwargs) turn it on; torch's default is off.
        options.setdefault("gradient_as_bucket_view", True)
    return replace(backend, options=options)
