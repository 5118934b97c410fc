"""Step time, tokens/s and scaling efficiency: the micro-steps' compute (compute.py) times a
compute scale, the communication no compute hides (Amdahl's law with overlap), what the backend
itself costs per unit of its own work, and offload's optimizer step on the host.

Communication: each micro-step's compute splits 1:2 between forward and backward (2N and 4N
flops per parameter and token; with activation checkpointing backward also re-runs the
forward, 1:3). A collective whose window is a phase hides behind that phase's compute; what
exceeds the window, plus the part that can never overlap (DDP's last bucket, the first block's
gather, the last block's reduce-scatter), adds to the step. Collectives with no window
(ZeRO-1/2's parameter gather after the step, host copies of offload) add in full.

Backend overhead: what a backend does beside the model's own compute, counted in the unit its
mechanism scales with (overhead_units) and priced per unit by SpeedFactors.overhead_s, which
calibration.py measures (or takes from a reference machine, said as assumed):
  FSDP (torch stage 3)   per collective call: each unit (block or root) is gathered for forward,
                         again for backward when it reshards, and reduce-scattered;
  DeepSpeed ZeRO-3       per parameter fetch: its hooks gather every module that holds
                         parameters for forward and again for backward;
  DeepSpeed ZeRO-1/2     per parameter: flat-buffer copies and the fp32 master's cast back;
  DDP, single            none beyond the model (DDP's all-reduce is communication).
Offload's host optimizer step costs SpeedFactors.host_s_per_param per parameter a node steps.
Efficiency is compute time over step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.plan.backends import Backend, counterpart
from harness.plan.comm import Collective, Topology
from harness.plan.compute import ComputeWork, compute_work
from harness.plan.model_shape import ModelShape

HOST_ADAM_S_PER_PARAM = 1e-9  # DeepSpeed CPUAdam on one node's CPUs (AVX-512), where nothing is measured
# ZeRO-3's parameter-holding modules per block where a model's modules are unknown (GPT-2's six:
# two norms, the attention's two matmuls, the MLP's two) and at its root (embeddings, final norm).
GPT_MODULES_PER_BLOCK, GPT_ROOT_MODULES = 6, 3


@dataclass(frozen=True)
class SpeedFactors:
    """What the speed model takes from a measurement: the compute scale, each strategy's price per
    overhead unit and host rate, and the peak memory the memory model misses, per parameter."""

    compute_scale: float = 1.0
    overhead_s: dict[str, float] = field(default_factory=dict)  # strategy -> seconds per overhead unit
    host_s_per_param: dict[str, float] = field(default_factory=dict)  # offload strategies
    memory_per_param: dict[str, float] = field(default_factory=dict)  # strategy -> bytes per parameter
    basis: str = "assumed"  # where the figures come from, said beside every prediction
    measured: bool = False  # True: measured on the machine being planned for (plan calibrate=)
    fixed_mfu: float | None = None  # plan's mfu=: compute at this MFU instead of the compute model


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    exposed_comm_s: float
    offload_step_s: float  # the optimizer step on the host, for optimizer offload
    overhead_s: float  # the backend's own work beside the model (overhead_units priced per unit)
    wire_bytes: float  # bytes each GPU sends over the interconnect per step
    comm_s: float  # all the interconnect's busy time, hidden or not
    tokens_per_s: float  # the whole job's
    overhead_units: float = 0.0
    overhead_what: str = ""
    work: ComputeWork | None = None  # the unscaled parts of the compute (None with a fixed MFU)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.offload_step_s + self.overhead_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s


def _exposed(
    collectives: list[Collective], topology: Topology, forward_s: float, backward_s: float, grad_accum: int
) -> float:
    """Seconds of communication per step that no compute hides."""
    windows = {"forward": forward_s, "backward": backward_s}
    exposed = 0.0
    for window in ("forward", "backward"):
        in_window = [c for c in collectives if c.window == window]
        every_micro = sum(c.seconds(topology) for c in in_window if c.per_micro_step)
        last_micro = sum(c.seconds(topology) for c in in_window if not c.per_micro_step)
        tails = sum(c.seconds(topology, tail=True) for c in in_window if c.tail_bytes)
        # Micro-steps before the last carry only the per-micro-step collectives; the last carries all.
        exposed += (grad_accum - 1) * max(0.0, every_micro - windows[window])
        exposed += max(tails, every_micro + last_micro - windows[window])
    for c in collectives:
        if c.window is None:
            exposed += c.seconds(topology) * (grad_accum if c.per_micro_step else 1)
    return exposed


def parameter_modules(shape: ModelShape) -> int:
    """Modules that hold parameters directly (what ZeRO-3's hooks gather one by one)."""
    if shape.param_modules is not None:
        return shape.param_modules
    layers = shape.dims.layers if shape.dims else 1
    return GPT_MODULES_PER_BLOCK * layers + GPT_ROOT_MODULES


def overhead_units(backend: Backend, shape: ModelShape, grad_accum: int) -> tuple[float, str]:
    """How much of the backend's own work one step does, in the unit it scales with, and its name."""
    if backend.stage == 3 and backend.engine == "torch":
        units = len(shape.block_params()) + 1  # every block, and the root
        gathers = 2 if backend.reshard_after_forward else 1
        reduces = grad_accum if backend.sharded_grads_every_micro_step else 1
        return float(units * (gathers * grad_accum + reduces)), "FSDP collective calls"
    if backend.stage == 3:
        return float(2 * parameter_modules(shape) * grad_accum), "ZeRO-3 parameter fetches"
    if backend.engine == "deepspeed":
        return float(shape.params), "parameters through ZeRO-1/2's flat buffers"
    return 0.0, ""


def price_per_unit(backend: Backend, factors: SpeedFactors) -> float:
    """A strategy's measured price per overhead unit; a strategy Accelerate drives that was not
    measured is priced as the engine it drives (Accelerate itself adds nothing measurable)."""
    if backend.name in factors.overhead_s:
        return factors.overhead_s[backend.name]
    native = counterpart(backend, offload=backend.offload_optimizer, via_accelerate=False)
    return factors.overhead_s.get(native, 0.0) if backend.via_accelerate and native else 0.0


def step_time(
    *,
    collectives: list[Collective],
    topology: Topology,
    backend: Backend,
    shape: ModelShape,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    precision: str,
    compiled: bool,
    checkpointing: bool,
    peak_flops: float,
    hbm_bytes_per_s: float,
    shard_params: int,
    factors: SpeedFactors,
) -> StepTime:
    """Predicted time of one optimizer step on every GPU, and what it buys."""
    micro_tokens = micro_batch * seq_len
    optimizer_params = 0 if backend.offload_optimizer else (shard_params if backend.stage else shape.params)
    work = None
    if factors.fixed_mfu is not None:
        again = 4 / 3 if checkpointing else 1.0
        micro_compute = shape.flops_per_token(seq_len) * micro_tokens * again / (peak_flops * factors.fixed_mfu)
        step_compute = grad_accum * micro_compute
    else:
        work = compute_work(
            shape,
            tokens=micro_tokens,
            seq_len=seq_len,
            precision=precision,
            mixed_precision=backend.mixed_precision,
            compiled=compiled,
            checkpointing=checkpointing,
            peak_flops=peak_flops,
            hbm_bytes_per_s=hbm_bytes_per_s,
        )
        micro_compute = work.micro_step_s * factors.compute_scale
        optimizer = work.optimizer_s * optimizer_params / max(shape.params, 1)
        step_compute = grad_accum * micro_compute + optimizer * factors.compute_scale
    forward_share = 0.25 if checkpointing else 1 / 3
    forward_s, backward_s = micro_compute * forward_share, micro_compute * (1 - forward_share)
    exposed = _exposed(collectives, topology, forward_s, backward_s, grad_accum)
    offload_s = 0.0
    if backend.offload_optimizer:
        gpus_per_node = topology.gpus // topology.nodes
        rate = factors.host_s_per_param.get(backend.name, HOST_ADAM_S_PER_PARAM)
        offload_s = shard_params * gpus_per_node * rate  # a node's CPUs step all its GPUs' shards
    units, what = overhead_units(backend, shape, grad_accum)
    overhead = units * price_per_unit(backend, factors)
    wire = sum(
        c.wire_bytes(topology.gpus) * (grad_accum if c.per_micro_step else 1)
        for c in collectives
        if c.kind != "host-copy"
    )
    comm_s = sum(c.seconds(topology) * (grad_accum if c.per_micro_step else 1) for c in collectives)
    step_s = step_compute + exposed + offload_s + overhead
    tokens = topology.gpus * grad_accum * micro_tokens
    return StepTime(
        step_compute,
        exposed,
        offload_s,
        overhead,
        wire,
        comm_s,
        tokens / step_s if step_s > 0 else math.inf,
        units,
        what,
        work,
    )
