"""The plan's prediction for one training run, beside what it measured: the compare records
it in results.json and its report shows predicted, measured and the error."""

from __future__ import annotations

from typing import Any

from configs.schema import checkpointing_mode
from harness.common import hardware
from harness.plan.model.model_shape import shape_of_spec
from harness.plan.network.fabric import FABRICS, IntraNode, Topology, default_fabric, topology_of
from harness.plan.parallel.backends import model_of
from harness.plan.parallel.layout import LayoutError
from harness.plan.predict import Question, plan_strategy, storage_precision
from harness.plan.speed.attention import sdpa_kernel
from harness.plan.speed.calibration import default_factors
from harness.plan.speed.step_time import SpeedFactors, for_card
from strategies.memory import CATEGORIES


def question_for_run(
    cfg: Any,
    world_size: int,
    nodes: int,
    gpu_mem_bytes: float,
    spec: hardware.GPUSpec | None = None,
    split: tuple[int, int] | None = None,
) -> Question:
    """The planning question a run (a RunConfig) answers; without a known GPU `spec`, memory only.
    split: the (micro-batch, accumulation) the run followed, where its data-parallel ranks are fewer
    than its processes (tensor parallelism); default, the batch split over every process."""
    micro_batch, grad_accum = split or cfg.world_batch(world_size)
    if spec is not None:
        topology = topology_of(spec, world_size, nodes, default_fabric(spec, spec.gpus_per_host))
    else:  # memory only: no link is priced
        topology = Topology(world_size, nodes, IntraNode("nvlink", 0.0), FABRICS["ndr"], True)
    return Question(
        shape=shape_of_spec(cfg.model, cfg.model_kwargs, cfg.model_blocks),
        topology=topology,
        capacity_bytes=gpu_mem_bytes,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        seq_len=cfg.seq_len,
        precision=cfg.precision,
        gpu=spec,
        factors=for_card(default_factors(), spec.name) if spec else SpeedFactors(),  # no speed off a known GPU
        checkpointing=checkpointing_mode(cfg.activation_checkpointing, getattr(cfg, "selective_checkpointing", False)),
        compiled=cfg.compile,
        strategy_options=dict(cfg.strategy_options),
        attention=sdpa_kernel(spec),  # parabench's models call torch's SDPA
    )


def prediction_for_run(cfg: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """For the run `cfg` (a RunConfig) that wrote `summary`: predicted bytes per rank (params,
    grads, optimizer, as memory_breakdown counts them), peak allocated on the GPU and tokens/s;
    None for what is not predicted (peak and speed on a CPU, everything for a strategy the
    planner has no model of)."""
    keys = [f"mem_{c}_bytes" for c in CATEGORIES] + ["peak_mem_allocated_bytes", "tokens_per_s"]
    if model_of(cfg.strategy) is None:
        return {**dict.fromkeys(keys), "note": f"the planner has no model of strategy {cfg.strategy!r}"}
    memory = summary.get("device_memory_bytes")
    on_gpu = summary.get("device_type") == "cuda" and memory is not None
    spec = hardware.gpu_spec(summary.get("device") or "") if on_gpu else None
    if spec is not None and storage_precision(cfg.precision) not in spec.peak_flops:
        spec = None  # a precision the card has no tensor cores for (bf16 on a V100): memory only
    followed = (summary.get("micro_batch"), summary.get("grad_accum"))
    split = followed if None not in followed else None
    q = question_for_run(
        cfg, summary["world_size"], summary.get("nodes", 1), memory if on_gpu else float("inf"), spec, split
    )
    plan = plan_strategy(cfg.strategy, q)
    return {
        **{f"mem_{c}_bytes": plan.states.total(c) for c in CATEGORIES},
        "peak_mem_allocated_bytes": plan.peak_bytes if on_gpu else None,
        "tokens_per_s": plan.time.tokens_per_s if plan.time else None,
        "assumed": (f"speed factors {q.factors.basis}; {q.topology.describe()}" if plan.time else None),
    }


def peak_for_run(cfg: Any, world_size: int, split: tuple[int, int]) -> int | None:
    """The peak one process of the run `cfg` (a RunConfig) allocates on its device at this (micro-batch,
    accumulation), by the planner's memory model; None where the planner has no model of its strategy
    or cannot lay the run out (a split its pipeline's micro-batches do not divide)."""
    if model_of(cfg.strategy) is None:
        return None
    q = question_for_run(cfg, world_size, 1, float("inf"), None, split)
    try:
        return plan_strategy(cfg.strategy, q).peak_bytes
    except LayoutError:
        return None
