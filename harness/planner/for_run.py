"""The plan's prediction for one training run, recorded in its summary beside what it measured
(the compare report shows predicted, measured and the error)."""
from __future__ import annotations

from typing import Any

import torch

from harness import hardware
from harness.planner.backends import known_backends
from harness.planner.calibration import default_factors
from harness.planner.comm import INTER_NODE, INTERCONNECTS, Topology
from harness.planner.model_shape import shape_of_spec
from harness.planner.predict import Question, plan_strategy
from harness.planner.speed import SpeedFactors
from strategies.memory import CATEGORIES


def question_for_run(cfg: Any, world_size: int, nodes: int, gpu_mem_bytes: float,
                     spec: hardware.GPUSpec | None = None) -> Question:
    """The planning question a run (a RunConfig) answers; without a known GPU `spec`, memory only."""
    micro_batch, grad_accum = cfg.world_batch(world_size)
    return Question(
        shape=shape_of_spec(cfg.model, cfg.model_kwargs, cfg.model_blocks), gpus=world_size, nodes=nodes,
        gpu_mem_bytes=gpu_mem_bytes, micro_batch=micro_batch, grad_accum=grad_accum, seq_len=cfg.seq_len,
        precision=cfg.precision, checkpointing=cfg.activation_checkpointing,
        topology=Topology(world_size, nodes, INTERCONNECTS["nvlink"], INTER_NODE["infiniband"]),
        peak_flops=spec.peak_flops[cfg.precision] if spec else None,
        hbm_bytes_per_s=spec.hbm_bytes_per_s if spec else None,
        factors=default_factors() if spec else SpeedFactors(),  # no speed is predicted off a known GPU
        strategy_options=dict(cfg.strategy_options), compiled=cfg.compile,
    )


def prediction_for_run(cfg: Any, world_size: int, nodes: int, device: torch.device) -> dict[str, Any]:
    """Predicted bytes per rank (params, grads, optimizer, as memory_breakdown counts them),
    peak allocated on the GPU and tokens/s; None for what is not predicted here (peak and
    speed on a CPU, everything for a strategy the planner has no model of)."""
    keys = [f"mem_{c}_bytes" for c in CATEGORIES] + ["peak_mem_allocated_bytes", "tokens_per_s"]
    if cfg.strategy not in known_backends():
        return {**dict.fromkeys(keys), "note": f"the planner has no model of strategy {cfg.strategy!r}"}
    on_gpu = device.type == "cuda"
    spec = hardware.gpu_spec(hardware.device_name(device)) if on_gpu else None
    memory = torch.cuda.get_device_properties(device).total_memory if on_gpu else float("inf")
    q = question_for_run(cfg, world_size, nodes, memory, spec)
    plan = plan_strategy(cfg.strategy, q)
    return {
        **{f"mem_{c}_bytes": plan.states.total(c) for c in CATEGORIES},
        "peak_mem_allocated_bytes": plan.peak_bytes if on_gpu else None,
        "tokens_per_s": plan.time.tokens_per_s if plan.time else None,
        "assumed": (f"speed factors {q.factors.basis}; nvlink inside a node, infiniband between"
                    if plan.time else None),
    }
