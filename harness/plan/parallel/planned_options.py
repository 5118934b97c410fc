"""The strategy options a plan takes, and what it makes of each: the options `train` takes.

A plan (`runner.py plan`, `plan search=true`) routes `strategy_options` over its strategies by the
rule a compare routes them by (strategies/option_routing.py: a compare-wide option reaches the
strategies that take it, a section its strategy alone), and checks each strategy's as `train`
checks them (StrategyRegistry.check_options: an option its name presets, one it has not, one of
the wrong type). What a strategy takes is read from the registry at run time, so a strategy that
learns an option is planned with it as soon as the planner prices it for that layout. Then:

- a size (tp_size, pp_size, ...) must be a whole number of at least 1, as the strategy's mesh wants it;
- an option the planner prices for this strategy's layout (MODELLED) is planned;
- any other option is planned only at the strategy's own default: another value is one line
  (check_priced's LayoutError: an error where the strategy was asked for, a "not planned" line
  where it was planned by default), never planned as if it were absent;
- the planner's what-ifs (WHAT_IFS) price what no registered strategy runs yet, on the layouts they
  apply to; `train` has no such option, and the plan says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from harness.common.numbers import is_whole
from harness.plan.model.model_shape import PlanError
from harness.plan.parallel.backends import Backend, model_of
from harness.plan.parallel.layout import Layout, LayoutError, is_mesh_preset, pipelines, splits_sequences
from strategies.base import StrategyError
from strategies.option_routing import RoutedOptions, compare_wide, route_options, section


def _ddp(b: Backend) -> bool:
    return b.engine == "torch" and b.stage == 0 and not b.fsdp2_units


# What the planner prices, for which layouts (a strategy taking the option on another layout is refused):
MODELLED: dict[str, Callable[[Backend], bool]] = {
    # layout.py; any name of the torch mesh takes a tp_size (hsdp + tp_size is HSDP x TP)
    "tp_size": lambda b: b.tensor_parallel or is_mesh_preset(b),
    "sequence_parallel": lambda b: b.tensor_parallel or is_mesh_preset(b),  # activations.py, comm.py
    "shard_size": lambda b: b.hybrid_shard,
    "zero_hpz_partition_size": lambda b: b.secondary_partition,
    "pp_size": pipelines,  # pipeline_cost.py, pipeline_context.py
    "schedule": pipelines,
    "microbatches": pipelines,
    "cp_size": splits_sequences,  # context_parallel_cost.py
    "prefetch_blocks": lambda b: b.fsdp2_units and b.stage == 3,  # buffers.py: blocks gathered ahead
    "sync_each_micro_step": lambda b: b.fsdp2_units,  # comm.py, buffers.py: reductions per micro-step
    "bucket_cap_mb": _ddp,  # comm.py: DDP's buckets
    "gradient_as_bucket_view": _ddp,  # buffers.py
    "cpu_adam": lambda b: b.offload_optimizer,  # the host step is DeepSpeed's CPU Adam (true), as on a GPU
    "async_tp": lambda b: b.tensor_parallel,  # async_tp_cost.py
    "cp_attention": splits_sequences,  # context_parallel_cost.py: all-to-all or ring
    # pipeline_cost.py: stages a GPU holds under an interleaved schedule (DeepSpeed's engine runs 1F1B alone)
    "virtual_stages": lambda b: pipelines(b) and not b.pipeline_engine,
    "ep_size": lambda b: b.expert_parallel,  # expert_layout.py: experts over ep_size GPUs, all-to-all between
}
# Values the planner prices of an option it models only at some (others: refused in one line).
PRICED_VALUES: dict[str, tuple[Any, ...]] = {"cpu_adam": (None, True)}
# The planner's what-ifs: taken on the layouts MODELLED prices them for even where no registered
# strategy runs them yet (docs/planner.md: async tensor parallelism, pipeline and context parallelism).
WHAT_IFS = ("async_tp", "cp_attention", "virtual_stages")
# The size each what-if shapes: offered only to a strategy that takes it (no interleaving without stages).
WHAT_IF_SIZES = {"async_tp": "tp_size", "cp_attention": "cp_size", "virtual_stages": "pp_size"}
# Options that count GPUs, stages or micro-batches: whole numbers of at least 1 (None: the strategy's default).
SIZES = (
    "tp_size",
    "pp_size",
    "cp_size",
    "shard_size",
    "zero_hpz_partition_size",
    "microbatches",
    "virtual_stages",
    "ep_size",
)


def _registry():  # noqa: ANN202 - strategies.registry.StrategyRegistry, imported where used
    from strategies.registry import default_registry

    return default_registry()


def takes(name: str) -> set[str]:
    """The options a plan of strategy `name` takes: those `train` takes, and the planner's what-ifs for
    its layout where it takes the size each shapes."""
    model = model_of(name)
    runs = set(_registry().get(name).user_options())
    what_ifs = {key for key in WHAT_IFS if model is not None and MODELLED[key](model) and WHAT_IF_SIZES[key] in runs}
    return runs | what_ifs


def _what_ifs(name: str, given: Collection[str]) -> list[str]:
    """The options of `given` that strategy `name` does not run: the planner's what-ifs."""
    runs = _registry().get(name).user_options()
    return [key for key in given if key in WHAT_IFS and key not in runs]


def options_of(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Strategy `name`'s options in a plan of several: the compare-wide ones it takes, then its own section."""
    if not options:
        return {}
    wide = compare_wide(options, _registry().names())
    mine = takes(name)
    return {**{k: v for k, v in wide.items() if k in mine}, **section(options, name)}


def routed_options(names: Collection[str], options: Mapping[str, Any], verb: str = "plan") -> RoutedOptions:
    """`options` over the planned strategies `names`, each strategy's checked (check_planned);
    one line (PlanError) for an option none of them takes, or one the plan cannot price."""
    registry = _registry()
    try:
        routed = route_options(options, list(names), registry.names(), takes, verb=verb, adjective="planned")
    except StrategyError as exc:
        raise PlanError(str(exc)) from None
    for name, given in routed.by_strategy.items():
        check_planned(name, given)
    return routed


def check_planned(name: str, given: Mapping[str, Any]) -> None:
    """Strategy `name`'s options as `train` checks them, and its sizes whole numbers (one line each)."""
    registry = _registry()
    try:
        registry.check_options(name, {k: v for k, v in given.items() if k not in _what_ifs(name, given)})
    except StrategyError as exc:
        raise PlanError(str(exc)) from None
    for key, value in given.items():
        if key in SIZES and value is not None and not is_whole(value):
            raise PlanError(f"{name}: strategy_options.{key}={value!r} must be a whole number of at least 1")


UNIT_SIZES = ("tp_size", "pp_size", "cp_size", "ep_size")


def check_priced(name: str, given: Mapping[str, Any]) -> None:
    """A LayoutError (one line: an error where `name` was asked for, a listed omission where it was
    planned by default) for an option of `given` the planner does not price for `name`'s layout at a
    value other than the strategy's default: never planned as if it were absent."""
    model = model_of(name)
    if model is None or not given:
        return
    defaults = _registry().get(name).option_values()
    for key, value in given.items():
        priced = key in MODELLED and MODELLED[key](model) and value in PRICED_VALUES.get(key, (value,))
        # A dimension of size 1 is the layout without it, which the strategy's default (None) lays out.
        unsplit = key in UNIT_SIZES and value == 1 and defaults.get(key) is None
        if not priced and not unsplit and value != defaults.get(key):
            default = defaults.get(key)
            instead = f"as {key}={json.dumps(default)}" if default is not None else f"without {key}"
            raise LayoutError(
                f"{name}: the planner does not price strategy_options.{key}={json.dumps(value)} on this layout, and "
                f"would plan it {instead}: drop it to plan {name} (train runs it as given)"
            )


# What each what-if pipelines or interleaves, and the layout size it needs above 1 to have any to.
WHAT_IF_NEEDS = {
    "async_tp": ("pipelines tensor parallel's collectives with their matmuls", "tp", "tp_size"),
    "virtual_stages": ("interleaves a pipeline's stages", "pp", "pp_size"),
}


def check_what_ifs_apply(backend: Backend, layout: Layout) -> None:
    """A LayoutError (one line) for a registered strategy's what-if on a layout without the dimension it
    works on: async_tp=true at tp 1 (fsdp-ep's and ddp-ep's, whose meshes name no tp; fsdp-tp's where the
    heads hold it at 1), virtual_stages above 1 at pp 1. Planned, either would be the plan without it
    said to be priced with it; cp_attention at cp 1 is refused alike, by the runtime's check_options."""
    name = backend.measured_as
    if name not in _registry().names():
        return  # a published run's layout: its tokens are its own (bench/plan_vs_published.py)
    for key in _what_ifs(name, backend.options):
        does, dim, size = WHAT_IF_NEEDS.get(key, ("", "", ""))
        value = backend.options[key]
        asked = value is True or (is_whole(value) and value > 1)  # async_tp=false, virtual_stages=1: nothing asked
        if does and asked and getattr(layout, dim) == 1:
            raise LayoutError(
                f"{backend.name}: strategy_options.{key}={json.dumps(value)} {does}, and this layout has {dim} 1: "
                f"set strategy_options.{size} too, or drop it"
            )


def what_if_lines(routed: RoutedOptions) -> list[str]:
    """A line for each what-if a plan priced: no strategy runs it, so no compare can measure it."""
    used: dict[str, list[str]] = {}
    for name, given in routed.by_strategy.items():
        for key in _what_ifs(name, given):
            used.setdefault(key, []).append(name)
    return [
        f"strategy_options.{key} is a what-if of the planner ({', '.join(names)}): train has no such option, so no "
        "compare can measure it yet."
        for key, names in used.items()
    ]
