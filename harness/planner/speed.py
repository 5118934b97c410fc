"""Step time, tokens/s and scaling efficiency: compute from flops per token at a stated
MFU, plus the communication that cannot hide behind compute (Amdahl's law with overlap).

Each micro-step's compute splits 1:2 between forward and backward (2N and 4N flops per
parameter and token; with activation checkpointing backward also re-runs the forward, so
8N in all, 1:3). A collective whose window is a phase hides behind that phase's compute;
what exceeds the window, plus the part that can never overlap (DDP's last bucket, the
first block's gather, the last block's reduce-scatter), adds to the step. Collectives with
no window (ZeRO-1/2's parameter gather after the step, host copies of offload, the CPU
optimizer step) add in full. Efficiency is compute time over step time: one GPU with the
same per-GPU batch computes the same and communicates nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.planner.backends import Backend
from harness.planner.comm import Collective, Topology

CPU_ADAM_PARAMS_PER_S = 1.0e9  # Adam updates per second on one node's CPUs (DeepSpeed CPUAdam, AVX-512)
CHECKPOINTING_EXTRA_FORWARD = 4 / 3  # 8N instead of 6N flops


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    exposed_comm_s: float
    offload_step_s: float  # the optimizer step on the host, for optimizer offload
    wire_bytes: float  # bytes each GPU sends over the interconnect per step
    comm_s: float  # all the interconnect's busy time, hidden or not
    tokens_per_s: float  # the whole job's

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.offload_step_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s


def compute_seconds(flops_per_token: float, tokens: int, peak_flops: float, mfu: float, checkpointing: bool) -> float:
    factor = CHECKPOINTING_EXTRA_FORWARD if checkpointing else 1.0
    return flops_per_token * tokens * factor / (peak_flops * mfu)


def _exposed(collectives: list[Collective], topology: Topology, forward_s: float, backward_s: float,
             grad_accum: int) -> float:
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


def step_time(*, collectives: list[Collective], topology: Topology, backend: Backend, flops_per_token: float,
              micro_batch: int, grad_accum: int, seq_len: int, peak_flops: float, mfu: float,
              checkpointing: bool, shard_params: int) -> StepTime:
    """Predicted time of one optimizer step on every GPU, and what it buys."""
    micro_tokens = micro_batch * seq_len
    micro_compute = compute_seconds(flops_per_token, micro_tokens, peak_flops, mfu, checkpointing)
    forward_share = 0.25 if checkpointing else 1 / 3
    forward_s, backward_s = micro_compute * forward_share, micro_compute * (1 - forward_share)
    exposed = _exposed(collectives, topology, forward_s, backward_s, grad_accum)
    offload_s = 0.0
    if backend.offload_optimizer:
        gpus_per_node = topology.gpus // topology.nodes
        offload_s = shard_params * gpus_per_node / CPU_ADAM_PARAMS_PER_S  # a node's CPUs step all its GPUs' shards
    wire = sum(c.wire_bytes(topology.gpus) * (grad_accum if c.per_micro_step else 1)
               for c in collectives if c.kind != "host-copy")
    comm_s = sum(c.seconds(topology) * (grad_accum if c.per_micro_step else 1) for c in collectives)
    compute = grad_accum * micro_compute
    step_s = compute + exposed + offload_s
    tokens = topology.gpus * grad_accum * micro_tokens
    return StepTime(compute, exposed, offload_s, wire, comm_s, tokens / step_s if step_s > 0 else math.inf)
