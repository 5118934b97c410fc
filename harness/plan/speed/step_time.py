"""Step time, tokens/s and scaling efficiency: the micro-steps' compute (compute.py) times a
compute scale, the communication no compute hides, what the backend itself costs, and
offload's optimizer step on the host.

Communication: a collective whose window is a phase (forward, backward) hides behind that
phase's compute; what exceeds the window, plus the part that can never overlap (DDP's last
bucket, the first block's gather, the last block's reduce-scatter), adds to the step.
Collectives with no window (ZeRO-1/2's parameter gather after the step, host copies of offload,
tensor parallelism's, DataParallel's) add in full. Async tensor parallelism's pipelined ones add
what their pipelines cost beyond the whole matmuls (async_tp_cost.py): the pieces' compute, and
the copies no piece hides.

Contention: compute that runs beside a collective shares the GPU with NCCL's kernels, which
take NCCL_SMS of its SMs (one per channel, not shared with compute: "on DGX with 8 NICs ... it
would use 16 SMs", an NCCL maintainer in NVIDIA/nccl issue 689) and move NCCL_MEMORY_PASSES
times their wire bytes through its memory ("300GB/s needs to be multiplied by at least 2x for
memory bandwidth ... it can be 3x", issue 1428). While hidden communication runs, compute loses
the larger of the two shares; in issue 1428's profile of a GPT step on A100s, the kernels that
overlapped an all-gather ran slower still (matmuls 1.76x, attention 1.8x, elementwise 2.5x).
Async tensor parallelism's copies run on the copy engines: no SMs, their memory share only
(async_tp_cost.py).

Backend overhead: what a strategy cost beyond the model's compute and communication where it
was measured (calibration.py), carried as time per micro-step: it is the backend's host-side
work (hooks, flat buffers, bookkeeping, synchronisations), which does not grow with the width
and which a larger model's compute hides. At gpt2-124m and gpt2-350m on one H100, DeepSpeed
ZeRO-3 took 119 and 144 ms per step beyond its compute for twice the layers.
Offload's host optimizer step costs SpeedFactors.host_s_per_param per parameter of one GPU's
shard: each rank steps its shard on the host at once, on its share of the host's CPUs and memory.
Hosts are built with their GPUs' count (a DGX H100's 112 cores and p5's 96 for 8 GPUs, DGX A100's
128: 12-16 cores a GPU), so a rate measured on a host of one GPU's share (parabench's reference
H100, 16 cores) holds per GPU; charged to a whole node's shards it would price an 8-GPU host as if
it had one GPU's cores.
Host issue: a micro-step takes at least the host's time to issue its kernels and collectives
(host_issue.py); what it takes beyond the micro-step's compute and its critical-path collectives
is the time the GPU waits on its host. torch.nn.DataParallel drives every replica from one Python
process: its kernel launches are serialised by the GIL (HOST_S_PER_LAUNCH each, per replica), and
GPU 0 runs the loss over every replica's logits and the optimizer over the whole model.
Stragglers: the step's compute is the slowest GPU's, each chip running its own speed about the
median card's (stragglers.py); with a fixed MFU, which stands for all of a run's compute, none is added.
Efficiency is compute time over step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from harness.common.hardware import GPUSpec
from harness.plan.memory.memory_correction import MemoryCorrection
from harness.plan.network.comm import PIPELINED, ZERO3_LIST_COLLECTIVES, Collective
from harness.plan.network.fabric import Topology
from harness.plan.parallel.async_tp_cost import AsyncTensorParallel
from harness.plan.parallel.backends import Backend, planner_models
from harness.plan.speed.compute import ComputeWork
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL, HostIssue
from harness.plan.speed.list_collectives import list_collectives_host_s
from harness.plan.speed.stragglers import straggler_share

HOST_ADAM_S_PER_PARAM = 1e-9  # DeepSpeed CPUAdam on one GPU's share of its host (AVX-512), where nothing is measured
HOST_S_PER_LAUNCH = HOST_S_PER_KERNEL["eager"]  # eager PyTorch's, where no dataparallel run is measured
HOST_LINK_EFFICIENCY = 0.8  # pinned host <-> GPU copies reach about this share of the PCIe link


def host_bytes_per_s(gpu: GPUSpec) -> float:
    """What offload's copies between host and GPU move per second: a Grace CPU's NVLink-C2C as
    measured (hardware.py), else this share of the PCIe link."""
    return gpu.host_copy_bytes_per_s or gpu.pcie_bytes_per_s * HOST_LINK_EFFICIENCY


NCCL_SMS = 16
NCCL_MEMORY_PASSES = 3


@dataclass(frozen=True)
class SpeedFactors:
    """What the speed model takes from a measurement: the compute scale, each strategy's overhead
    per micro-step and host rate, and the peak memory the memory model misses, by kind."""

    compute_scale: float = 1.0
    overhead_s: dict[str, float] = field(default_factory=dict)  # strategy -> seconds per micro-step
    host_s_per_param: dict[str, float] = field(default_factory=dict)  # offload strategies
    memory: dict[str, MemoryCorrection] = field(default_factory=dict)  # strategy -> what the peak model misses
    launch_s: float = HOST_S_PER_LAUNCH  # DataParallel's serialised launches
    basis: str = "assumed"  # where the figures come from, said beside every prediction
    measured: bool = False  # True: measured on the machine being planned for (plan calibrate=)
    fixed_mfu: float | None = None  # plan's mfu=: compute at this MFU instead of the compute model
    unused: tuple[str, ...] = ()  # fits that needed an implausible figure: reported, not used
    card: str | None = None  # the card the compute scale was measured on; None: any


def for_card(factors: SpeedFactors, card: str) -> SpeedFactors:
    """The factors as they hold on `card`: the compute scale corrects the compute model on the card it
    was measured on and is not carried to another (the model's own figures for that card stand); the
    backends' own work and the memory corrections are the software's and carry."""
    if factors.card is None or factors.card == card:
        return factors
    return replace(factors, compute_scale=1.0)


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    exposed_comm_s: float
    offload_step_s: float  # the optimizer step on the host, for optimizer offload
    overhead_s: float  # the backend's own work beside the model
    contention_s: float  # compute slowed by the collectives running beside it
    wire_bytes: float  # bytes each GPU sends over the interconnect per step
    comm_s: float  # all the interconnect's busy time, hidden or not
    tokens_per_s: float  # the whole job's
    overhead_what: str = ""
    work: ComputeWork | None = None  # the unscaled parts of the compute (None with a fixed MFU)
    # Of exposed_comm_s, what every micro-step runs in its critical path (tensor parallelism's
    # collectives, async TP's unhidden copies, DataParallel's): part of each micro-step's length.
    recurring_comm_s: float = 0.0
    host_wait_s: float = 0.0  # the GPU waiting on its host to issue the micro-steps' kernels (host_issue.py)
    host: HostIssue | None = None
    # A pipeline's stages idle in its fill and drain (parallel/pipeline_context.py); bubble_what: its
    # schedule, stages and micro-batches.
    bubble_s: float = 0.0
    bubble_what: str = ""
    # Of compute_s, what a pipeline's slowest stage (its compute and its blocks' exchanges the longest:
    # parallel/pipeline_context.py) computes beyond an even share of the model's compute (its head and
    # loss, blocks that do not divide evenly), which every other stage waits out; 0 where it computes less.
    imbalance_s: float = 0.0
    # The share of compute_s the step waits beyond the median GPU's for the slowest of its GPUs (stragglers.py).
    straggle: float = 0.0
    straggle_gpus: int = 1  # the GPUs it waits on

    @property
    def straggler_s(self) -> float:
        return self.straggle * self.compute_s

    @property
    def step_s(self) -> float:
        return (
            self.compute_s
            + self.straggler_s
            + self.contention_s
            + self.exposed_comm_s
            + self.offload_step_s
            + self.overhead_s
            + self.host_wait_s
            + self.bubble_s
        )

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s


def waiting_on(t: StepTime, gpus: int) -> StepTime:
    """`t` with the slowest of `gpus` GPUs waited on: a pipeline's step, planned on one stage's GPUs,
    waits on every stage's."""
    if t.work is None or gpus == t.straggle_gpus:
        return t
    tokens = t.tokens_per_s * t.step_s
    waited = replace(t, straggle=straggler_share(gpus), straggle_gpus=gpus)
    return replace(waited, tokens_per_s=tokens / waited.step_s)


@dataclass(frozen=True)
class Overlap:
    """How a step's collectives sit beside its compute."""

    exposed_s: float  # no compute hides it
    hidden_s: float  # compute runs beside it
    hidden_rate: float  # bytes/s the hidden collectives put on the wire while they run


def _overlap(
    collectives: list[Collective],
    topology: Topology,
    host_bytes_per_s: float,
    forward_s: float,
    backward_s: float,
    grad_accum: int,
) -> Overlap:
    """Seconds of communication per step that no compute hides, and that compute runs beside."""
    windows = {"forward": forward_s, "backward": backward_s}
    exposed = hidden = busy = wire = 0.0
    for window in ("forward", "backward"):
        in_window = [c for c in collectives if c.window == window]
        every_micro = sum(c.seconds(topology, host_bytes_per_s) for c in in_window if c.per_micro_step)
        last_micro = sum(c.seconds(topology, host_bytes_per_s) for c in in_window if not c.per_micro_step)
        tails = sum(c.seconds(topology, host_bytes_per_s, tail=True) for c in in_window if c.tail_bytes)
        # Micro-steps before the last carry only the per-micro-step collectives; the last carries all.
        exposed += (grad_accum - 1) * max(0.0, every_micro - windows[window])
        exposed += max(tails, every_micro + last_micro - windows[window])
        hidden += (grad_accum - 1) * min(every_micro, windows[window]) + min(every_micro + last_micro, windows[window])
        busy += grad_accum * every_micro + last_micro
        wire += sum(
            c.wire_bytes() * (grad_accum if c.per_micro_step else 1) for c in in_window if c.kind != "host-copy"
        )
    for c in collectives:
        if c.window is None:
            exposed += c.seconds(topology, host_bytes_per_s) * (grad_accum if c.per_micro_step else 1)
    return Overlap(exposed, hidden, wire / busy if busy else 0.0)


def contention(overlap: Overlap, sms: int, memory_bytes_per_s: float) -> float:
    """Seconds compute loses to the collectives hidden behind it."""
    if overlap.hidden_s <= 0:
        return 0.0
    sm_share = min(1.0, NCCL_SMS / sms)
    memory_share = min(1.0, NCCL_MEMORY_PASSES * overlap.hidden_rate / memory_bytes_per_s)
    return overlap.hidden_s * max(sm_share, memory_share)


def overhead_per_micro_step(backend: Backend, factors: SpeedFactors) -> float:
    """A strategy's measured overhead; one not measured is priced as the measured strategy that
    runs the same engine and stage the same way (its hooks are the engine's: accelerate-zero3 as
    zero3, a hybrid or tensor-parallel FSDP as fsdp), and as nothing where none was."""
    if backend.measured_as in factors.overhead_s:
        return factors.overhead_s[backend.measured_as]
    same = ("engine", "stage", "reshard_after_forward", "offload_optimizer", "data_parallel", "replicas")
    for model in planner_models().values():
        if model.name in factors.overhead_s and not model.via_accelerate:
            if all(getattr(model, key) == getattr(backend, key) for key in same):
                return factors.overhead_s[model.name]
    return 0.0


def step_time(
    *,
    work: ComputeWork | None,
    fixed_compute_s: float | None,
    collectives: list[Collective],
    topology: Topology,
    host_bytes_per_s: float,
    backend: Backend,
    micro_tokens: int,
    grad_accum: int,
    data_parallel: int,
    shard_params: float,
    factors: SpeedFactors,
    launches: int,
    sms: int,
    memory_bytes_per_s: float,
    pipelined: AsyncTensorParallel | None = None,
    host: HostIssue | None = None,
    gpus: int = 1,
    host_scale: float = 1.0,
) -> StepTime:
    """Predicted time of one optimizer step on every GPU, and what it buys. `work` is the compute
    model's micro-step (scaled here); `fixed_compute_s` a micro-step's compute at a fixed MFU (which
    stands for all compute: async TP's pieces then add only the copies they leave exposed, and no
    straggler is added); `gpus`: the job's, whose slowest every step waits on; `host_scale`: how much
    slower this card's host runs the backend's own Python than the host its overheads were measured
    on (host_issue.host_slowdown; 1 where they were measured on this machine)."""
    if work is not None:
        micro_compute = work.micro_step_s * factors.compute_scale
        forward_s = work.forward_s * factors.compute_scale
        if pipelined is not None:
            micro_compute += (pipelined.forward_s + pipelined.backward_s) * factors.compute_scale
            forward_s += pipelined.forward_s * factors.compute_scale
        step_compute = grad_accum * micro_compute + work.step_s * factors.compute_scale
    else:
        assert fixed_compute_s is not None
        micro_compute, forward_s = fixed_compute_s, fixed_compute_s / 3
        step_compute = grad_accum * micro_compute
    backward_s = micro_compute - forward_s
    overlap = _overlap(collectives, topology, host_bytes_per_s, forward_s, backward_s, grad_accum)
    copies = grad_accum * pipelined.exposed_s if pipelined is not None else 0.0
    exposed = overlap.exposed_s + copies
    recurring = copies + grad_accum * sum(
        c.seconds(topology, host_bytes_per_s) for c in collectives if c.window is None and c.per_micro_step
    )
    contended = contention(overlap, sms, memory_bytes_per_s)
    if pipelined is not None:
        contended += grad_accum * pipelined.contention(memory_bytes_per_s)
    offload_s = 0.0
    if backend.offload_optimizer:
        rate = factors.host_s_per_param.get(backend.measured_as, HOST_ADAM_S_PER_PARAM)
        offload_s = shard_params * rate  # every rank steps its own shard at once, on its share of the host
    # The backend's own work: its host's (at this card's host's pace, host_scale), and DataParallel's loss on GPU 0.
    on_host = grad_accum * overhead_per_micro_step(backend, factors)
    on_gpu = 0.0
    what = "the backend's own work, as measured" if on_host else ""
    if backend.options.get(ZERO3_LIST_COLLECTIVES):
        on_host += list_collectives_host_s(collectives, grad_accum)
        what = "DeepSpeed's ZeRO-3 of 2021: each collective's list split and copied rank by rank, the GPU waiting"
    elif any(c.host_copies for c in collectives):  # nanotron's ZeRO-1 gather, the only list collective there
        on_host += list_collectives_host_s([c for c in collectives if c.host_copies])
        what = "the updated parameters copied back from a list all-gather tensor by tensor and rank by rank"
    if backend.replicas == "threads" and data_parallel > 1:
        on_host += grad_accum * launches * (data_parallel - 1) * factors.launch_s
        if work is not None:  # GPU 0: the loss over every replica's logits
            on_gpu = grad_accum * (data_parallel - 1) * work.loss_s * factors.compute_scale
        what = "one process drives every GPU: launches serialised by the GIL, the loss of every replica on GPU 0"
    overhead = on_host * host_scale + on_gpu
    wire = sum(c.wire_bytes() * (grad_accum if c.per_micro_step else 1) for c in collectives if c.kind != "host-copy")
    comm_s = sum(
        c.seconds(topology, host_bytes_per_s) * (grad_accum if c.per_micro_step else 1)
        for c in collectives
        if c.window != PIPELINED
    )
    if pipelined is not None:  # the copy engines' busy time
        comm_s += grad_accum * (pipelined.exposed_s + pipelined.hidden_s)
    host_wait = 0.0
    # Every backend's host issues its first replica's kernels (DataParallel's one thread too, its other
    # replicas' launches priced above): on one GPU DataParallel is single's step, never without its host.
    if host is not None:
        long_share = (work.matmul_s + work.attention_s) / work.micro_step_s if work and work.micro_step_s else 1.0
        again_s = work.recompute_s * factors.compute_scale if work else 0.0
        host_wait = grad_accum * host.wait(
            forward_s, forward_s * long_share, micro_compute, recurring / grad_accum, again_s, long_share
        )
    straggle = straggler_share(gpus) if work is not None else 0.0
    step_s = step_compute * (1 + straggle) + contended + exposed + offload_s + overhead + host_wait
    tokens = data_parallel * grad_accum * micro_tokens
    return StepTime(
        step_compute,
        exposed,
        offload_s,
        overhead,
        contended,
        wire,
        comm_s,
        tokens / step_s if step_s > 0 else math.inf,
        what,
        work,
        recurring,
        host_wait,
        host,
        straggle=straggle,
        straggle_gpus=gpus,
    )
