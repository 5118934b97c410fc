"""One planning question answered for every strategy: memory (model states, activations,
buffers, peak, fits), communication and step time. `runner.py plan` prints it; every
`train` run records its own strategy's line beside what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.plan.activations import Activations, activations
from harness.plan.backends import Backend, backend_for
from harness.plan.buffers import Buffers, backend_buffers
from harness.plan.comm import Collective, Topology, collectives
from harness.plan.model_shape import ModelShape
from harness.plan.model_states import GPU, model_states
from harness.plan.speed import SpeedFactors, StepTime, step_time
from strategies.memory import CATEGORIES, MemoryBreakdown

# Peak allocated may use this share of the card; the rest goes to the CUDA context, cuBLAS
# and NCCL workspaces, and the caching allocator's fragmentation (reserved > allocated).
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Question:
    shape: ModelShape
    gpus: int
    nodes: int
    gpu_mem_bytes: float
    micro_batch: int
    grad_accum: int
    seq_len: int
    precision: str
    checkpointing: bool
    topology: Topology
    peak_flops: float | None  # per GPU at this precision; None: no speed prediction
    hbm_bytes_per_s: float | None  # per GPU; None with peak_flops None
    factors: SpeedFactors  # compute scale, backend overheads, memory corrections (calibration.py)
    strategy_options: dict[str, Any] = field(default_factory=dict)
    compiled: bool = False  # compile=true: most elementwise work fused

    def with_gpus(self, gpus: int) -> "Question":
        """The same question on `gpus` GPUs, as many per node as now (more nodes as needed)."""
        per_node = self.gpus // self.nodes
        nodes = max(1, -(-gpus // per_node))
        return replace(self, gpus=gpus, nodes=nodes, topology=replace(self.topology, gpus=gpus, nodes=nodes))


@dataclass(frozen=True)
class StrategyPlan:
    name: str
    backend: Backend
    states: MemoryBreakdown  # what memory_breakdown would report, per device
    activations: Activations | None
    buffers: Buffers
    peak_bytes: int | None  # predicted peak allocated on one GPU; None where activations are unknown
    fits: bool | None
    collectives: list[Collective]
    time: StepTime | None

    def states_on(self, device: str = GPU) -> dict[str, int]:
        return on_device(self.states, device)

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "model_states_bytes": self.states.as_dict(),
            "activations_bytes": None
            if self.activations is None
            else {
                "blocks": self.activations.blocks,
                "head_and_loss": self.activations.head,
                "rebuilt_block": self.activations.rebuilt,
            },
            "buffers_bytes": {
                "backward": self.buffers.backward,
                "hooks": self.buffers.hooks,
                "step": self.buffers.step,
            },
            "peak_allocated_bytes": self.peak_bytes,
            "fits": self.fits,
            "collectives": [
                {
                    "what": c.what,
                    "kind": c.kind,
                    "payload_bytes": c.payload_bytes,
                    "calls": c.calls,
                    "hidden_behind": c.window,
                    "every_micro_step": c.per_micro_step,
                }
                for c in self.collectives
            ],
            "time": None
            if self.time is None
            else {
                "step_s": self.time.step_s,
                "compute_s": self.time.compute_s,
                "exposed_comm_s": self.time.exposed_comm_s,
                "offload_step_s": self.time.offload_step_s,
                "overhead_s": self.time.overhead_s,
                "overhead_units": self.time.overhead_units,
                "overhead_what": self.time.overhead_what,
                "comm_s": self.time.comm_s,
                "wire_bytes_per_gpu": self.time.wire_bytes,
                "tokens_per_s": self.time.tokens_per_s,
                "scaling_efficiency": self.time.efficiency,
            },
        }


def on_device(states: MemoryBreakdown, device: str = GPU) -> dict[str, int]:
    """Bytes per category that live on `device` ("cuda" or "cpu")."""
    return {c: getattr(states, c).get(device, 0) for c in CATEGORIES}


def peak_allocated(states: dict[str, int], acts: Activations | None, buffers: Buffers, grads_held: bool) -> int | None:
    """Most GPU memory allocated at once: at the start of backward (everything forward kept,
    the backend's buffers, gradients where they persist), at the first gradient hook (the
    loss's buffers freed, the hooks' buffers allocated) or in the optimizer step."""
    if acts is None:
        return None
    params, grads, optimizer = states["params"], states["grads"], states["optimizer"]
    held = params + optimizer + (grads if grads_held else 0) + sum(buffers.backward.values())
    backward = held + acts.total
    first_hook = held + acts.total - acts.head + sum(buffers.hooks.values())
    end_of_backward = params + optimizer + grads + sum(buffers.step.values())
    return max(backward, first_hook, end_of_backward)


def plan_strategy(name: str, q: Question) -> StrategyPlan:
    backend = backend_for(name, q.shape, q.precision, q.gpus, q.strategy_options)
    states = model_states(q.shape, backend, q.precision, q.gpus)
    acts = activations(
        q.shape,
        micro_batch=q.micro_batch,
        seq_len=q.seq_len,
        precision=q.precision,
        mixed_precision=backend.mixed_precision,
        checkpointing=q.checkpointing,
    )
    buffers = backend_buffers(q.shape, backend, q.precision, q.gpus, q.grad_accum)
    grads_held = buffers.grads_resident or q.grad_accum > 1
    peak = peak_allocated(on_device(states), acts, buffers, grads_held)
    missed = q.factors.memory_per_param.get(name)
    if peak is not None and missed:
        peak = int(peak + missed * q.shape.params)  # what a calibration found the model to miss
    fits = None if peak is None else peak <= USABLE_FRACTION * q.gpu_mem_bytes
    comms = collectives(q.shape, backend, q.precision, q.gpus)
    timing = None
    if q.peak_flops and q.hbm_bytes_per_s:
        timing = step_time(
            collectives=comms,
            topology=q.topology,
            backend=backend,
            shape=q.shape,
            micro_batch=q.micro_batch,
            grad_accum=q.grad_accum,
            seq_len=q.seq_len,
            precision=q.precision,
            compiled=q.compiled,
            checkpointing=q.checkpointing,
            peak_flops=q.peak_flops,
            hbm_bytes_per_s=q.hbm_bytes_per_s,
            shard_params=-(-q.shape.params // q.gpus),
            factors=q.factors,
        )
    return StrategyPlan(name, backend, states, acts, buffers, peak, fits, comms, timing)


def plan_all(names: list[str], q: Question) -> list[StrategyPlan]:
    return [plan_strategy(name, q) for name in names]
