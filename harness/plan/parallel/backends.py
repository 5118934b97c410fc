"""What each strategy does, in the planner's terms: what it shards, where it keeps bytes, how
it runs mixed precision, which buffers it allocates and when it communicates.

Every registered strategy with a PlanModel (strategies/plan_model.py) is planned from it, a
plugin's as a built-in's: the planner never asks for a strategy by name. A config file given as a
strategy (`accelerate:mine.yaml`) is planned, under its own name, as the built-in it runs as. The buffer sizes and
the layout's sizes (tp_size, shard_size, zero_hpz_partition_size) come from the strategy's own
option defaults, overlaid by the user's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from harness.common.numbers import is_whole
from harness.plan.model.model_shape import ModelShape, PlanError
from strategies.parallel_dims import syncs_each_micro_step
from strategies.plan_model import PlanModel

# DeepSpeed 0.19's ZeRO defaults (deepspeed/runtime/zero/config.py), which the plugins leave alone.
DEEPSPEED_DEFAULTS = {
    "reduce_bucket_size": 5e8,  # elements per gradient reduction bucket
    "allgather_bucket_size": 5e8,
    "contiguous_gradients": True,  # gradients copied into a flat buffer as they are produced
    "stage3_prefetch_bucket_size": 5e7,  # elements fetched ahead of use
    "stage3_param_persistence_threshold": 1e5,  # smaller parameters stay gathered on every rank
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,  # a released parameter recurring within this many elements is kept
    "sub_group_size": 1e9,  # elements per optimizer sub-group (one flat fp32 tensor each)
}


# What a size option left to the strategy reads as (unset, 0 or "auto"): the strategy's default applies.
UNSET_SIZES = (None, 0, "auto")


@dataclass(frozen=True)
class Backend(PlanModel):
    """A registered strategy as the planner models it: its PlanModel (declared by the strategy's
    class, strategies/plan_model.py), its name, and its bucket sizes and knobs filled in."""

    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # bucket sizes and other knobs, defaults filled in
    single_process: bool = False  # the strategy's class runs one process whatever the GPU count
    runs_as: str | None = None  # a config file given as a strategy: the built-in it runs as

    @property
    def measured_as(self) -> str:
        """The name a calibration's measurements of this strategy are kept under."""
        return self.runs_as or self.name

    @property
    def replicated(self) -> bool:
        return self.stage == 0

    @property
    def one_process(self) -> bool:
        """Runs on one GPU only (`single`): its class runs one process, and that process drives one GPU."""
        return self.single_process and self.replicas == "processes"

    def ddp_wrapped(self, world: int) -> bool:
        """Whether the model runs inside DistributedDataParallel: ddp always, even on one rank;
        Accelerate only with more than one process (for one it prepares the bare model)."""
        return self.data_parallel and (world > 1 or not self.via_accelerate)

    def option(self, key: str) -> Any:
        return self.options[key]

    def size_given(self, option: str) -> bool:
        """Whether size `option` (tp_size, ep_size, ...) was given, not left to the strategy's default."""
        return self.options.get(option) not in UNSET_SIZES

    @property
    def fsdp2_units(self) -> bool:
        """Runs on FSDP2's machinery (fully_shard; replicate under ddp-tp and zero1-tp): every block
        and the root a unit whose parameters are copied for compute (gathered, cast) from its
        forward on, and whose gradients are reduced as its backward ends."""
        return self.engine == "torch" and self.mixed_precision == "low_precision"

    @property
    def sharded_grads_every_micro_step(self) -> bool:
        """Stage 3 under accumulation: gradients reduce-scattered on every micro-step (DeepSpeed's
        ZeRO-3 always, parabench's fsdp by default), or kept unsharded until the last
        (FSDP2 with gradient sync off: Accelerate's FSDP, fsdp with sync_each_micro_step=false)."""
        given = self.options.get("sync_each_micro_step")
        if "engine" in self.options:  # a torch mesh preset: its engine's way unless the run says
            return syncs_each_micro_step(self.options["engine"], given)
        return self.engine == "deepspeed" or bool(given)


# The registry's entries the models were last built from, and the models: every plan asks for them,
# and a plugin registered later replaces an entry, so the entries are compared by identity (hashing
# each entry's PlanModel on every call cost more than the plans it served).
_MODELS: list[tuple[list, dict[str, Backend]]] = []


def planner_models() -> dict[str, Backend]:
    """Every registered strategy the planner has a model of, by name, in the registry's order."""
    from strategies.registry import default_registry

    entries = [entry for entry in default_registry().entries() if entry.plan is not None]
    built = _MODELS[0][0] if _MODELS else []
    if len(built) != len(entries) or any(a is not b for a, b in zip(built, entries, strict=True)):
        _MODELS[:] = [
            (
                entries,
                {
                    entry.name: Backend(
                        **{f.name: getattr(entry.plan, f.name) for f in fields(PlanModel)},
                        name=entry.name,
                        single_process=entry.one_process,
                    )
                    for entry in entries
                },
            )
        ]
    return dict(_MODELS[0][1])


# DDP's own default bucket (torch.nn.parallel.DistributedDataParallel), used where a plugin sets none.
DDP_BUCKET_CAP_MB = 25.0
# Megatron-core's own FSDP (megatron/core/distributed/fsdp): its units and buffers (memory/buffers.py).
MEGATRON_FSDP = "megatron_fsdp"


def counterpart(backend: Backend, *, offload: bool, via_accelerate: bool) -> str | None:
    """The strategy with the same engine, stage and resharding, but with (or without) offload and
    Accelerate as asked: zero3 for zero3-offload, fsdp for accelerate-fsdp."""
    same = [
        f.name for f in fields(PlanModel) if f.name not in ("offload_optimizer", "offload_params", "via_accelerate")
    ]
    return next(
        (
            b.name
            for b in planner_models().values()
            if all(getattr(b, key) == getattr(backend, key) for key in same)
            and b.offload_optimizer == offload
            and b.via_accelerate == via_accelerate
        ),
        None,
    )


def known_backends() -> list[str]:
    return list(planner_models())


def model_of(name: str) -> Backend | None:
    """The planner's model of strategy `name` (None: it has none): a registered strategy's, or for a
    config file given as a strategy, the model of the built-in the registry resolves it to."""
    models = planner_models()
    if name in models or ":" not in name:
        return models.get(name)
    from strategies.registry import default_registry

    try:
        entry = default_registry().get(name)
    except ValueError as exc:  # no such file, or one no built-in runs: the registry's one line
        raise PlanError(str(exc)) from None
    if entry.plan is None:
        return None
    fields_of = {f.name: getattr(entry.plan, f.name) for f in fields(PlanModel)}
    return Backend(**fields_of, name=name, single_process=entry.one_process, runs_as=entry.resolves_to)


def planned_as(name: str) -> str | None:
    """The built-in a config file given as a strategy is planned as; None for a registered name."""
    if ":" not in name or name in planner_models():
        return None
    from strategies.registry import default_registry

    return default_registry().get(name).resolves_to


def _plugin_defaults(name: str) -> dict[str, Any]:
    """Keyword defaults of the registered plugin class, overlaid by the name's preset options."""
    from strategies.registry import default_registry

    registry = default_registry()
    return registry.get(name).option_values() if name in registry.names() or ":" in name else {}


def _held_params(backend: Backend, shape: ModelShape, world: int, options: dict[str, Any]) -> int:
    """The parameters of the module a rank hands DeepSpeed, which sizes its buckets by them
    (strategies/deepspeed.py: model_size of the module): a mixture's dense part (shape.params) and
    every routed expert, or under DeepSpeed's MoE layers (zero1-ep, zero2-ep) the E / ep of each block
    this rank keeps, ep_size defaulting to every rank as theirs does (deepspeed_moe.py)."""
    moe = shape.dims.moe if shape.dims is not None else None
    if moe is None:
        return shape.params
    given = options.get("ep_size")
    ep = (given if is_whole(given) else world) if backend.expert_parallel else 1
    return shape.params + moe.routed_params(shape.dims.width) // ep


def _deepspeed_sizing(backend: Backend, shape: ModelShape, world: int, options: dict[str, Any]) -> dict[str, Any]:
    """The bucket sizes both DeepSpeed plugins (direct and through Accelerate) give this model."""
    from strategies.deepspeed_config import ModelSize, sizing_config

    size = ModelSize(_held_params(backend, shape, world, options), shape.matrix_width())
    return sizing_config(size, backend.stage, world).get("zero_optimization", {})


def backend_for(
    name: str, shape: ModelShape, precision: str, world: int, user_options: dict[str, Any] | None = None
) -> Backend:
    """The planner's model of strategy `name` for this model on `world` GPUs, with its bucket
    sizes and knobs filled in."""
    model = model_of(name)
    if model is None:
        raise PlanError(f"no planner model for strategy {name!r}: the planner knows {', '.join(planner_models())}")
    defaults = _plugin_defaults(name)
    user = dict(user_options or {})
    if "mesh_dims" in defaults:  # a torch mesh preset: the sizes it takes, as a run's (tp_size not on fsdp)
        user = {k: v for k, v in user.items() if not k.endswith("_size") or k in defaults}
    return filled_in(model, shape, precision, world, {**defaults, **user})


def backend_of(plan: PlanModel, name: str, options: dict[str, Any] | None = None) -> Backend:
    """A Backend for a PlanModel no registered strategy declares (a published run's layout)."""
    return Backend(**{f.name: getattr(plan, f.name) for f in fields(PlanModel)}, name=name, options=dict(options or {}))


def filled_in(backend: Backend, shape: ModelShape, precision: str, world: int, options: dict[str, Any]) -> Backend:
    """`backend` with `options` over DeepSpeed's or torch's defaults for this model and world size."""
    if backend.engine == "deepspeed":
        options = {**DEEPSPEED_DEFAULTS, **_deepspeed_sizing(backend, shape, world, options), **options}
        options.setdefault("overlap_comm", backend.stage == 3)  # DeepSpeed's own default
        # Both DeepSpeed plugins leave DeepSpeed's default: gradients reduced in the model's dtype.
        options.setdefault("communication_data_type", precision)
    else:
        options.setdefault("bucket_cap_mb", DDP_BUCKET_CAP_MB)
        # Both the ddp plugin and accelerate-ddp (given DDP kwargs) turn it on; torch's default is off.
        options.setdefault("gradient_as_bucket_view", True)
    # A strategy's sequence_parallel option says what its tensor parallel runs; else its PlanModel does.
    sequence_parallel = options.get("sequence_parallel", backend.sequence_parallel)
    return replace(backend, options=options, sequence_parallel=sequence_parallel)
