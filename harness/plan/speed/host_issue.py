"""The host's share of a micro-step: the time the CPU takes to issue its kernels and collectives,
which the GPU cannot beat.

A GPU runs what its host has queued. Eager PyTorch queues each kernel from Python (the forward:
the module's code, the operator's dispatch, autograd's record, the launch) or from autograd's engine
(the backward), one after another; the host runs ahead of the GPU while long kernels run, and the
GPU waits whenever short ones drain the queue faster than the host fills it. So a micro-step takes
the longer of its GPU time and its host time:

    host = kernels x HOST_S_PER_KERNEL[eager | compiled] + collectives x HOST_S_PER_COLLECTIVE

What does not shrink with the work: a block issues as many kernels at micro-batch 1 as at 16, and
tensor parallelism leaves every GPU of its group the whole block's kernels on a part of the work,
with its collectives besides. Large micro-steps (a block's matmuls of milliseconds) hide it
entirely; it binds where each GPU's work per op is small.

  HOST_S_PER_KERNEL["eager"]     24 us: an eager training step's host time per kernel where the
                                 GPU waited on it: torch 2.11, 8 x B200 (huggingface/lerobot#4612:
                                 about 1,150 kernels a step, 28.0 ms a step with the GPU busy 30%
                                 of it, 13.0 ms under CUDA graphs); a cloud L4 host, 31 us
                                 (roboflow/rf-detr#1410: 4,228 kernels, 132.9 ms a step, the GPU busy
                                 25.8 ms of it); a workstation A6000, 45 us (facebookresearch/sam2#768,
                                 1,185 kernels, 53.7 ms eager, 7.3 ms of GPU time)
  HOST_S_PER_KERNEL["compiled"]  4.7 us: a compiled graph's wrapper launches its kernels without
                                 Python per operator: the dispatch of one torch function (about 2 us,
                                 pytorch/pytorch benchmarks/overrides_benchmark/README.md @ 17dc58bc)
                                 and an asynchronous launch (2.65-2.81 us per kernel enqueued, CUDA
                                 13, ahrefs/ocannl#488)
  HOST_S_PER_COLLECTIVE          48 us: a collective from torch.distributed issues the NCCL kernel
                                 and its stream's events and waits on both sides, and tensor
                                 parallelism's redistribution copies around it: counted as two
                                 eager kernels

A forward that synchronises with the host (a dropless mixture of experts: the host must read how
many tokens each expert got before it can size the exchange, models/routing.py's `.tolist()`,
Megatron-core's token dispatcher's `cuda_sync_point`) cannot be issued ahead: from each such point
the GPU runs what the host has just issued, so the forward's short kernels cost their issue and its
long ones (matmuls, attention) their run, one after the other, where an unsynchronised micro-step
overlaps the two:

    synced forward = long kernels' GPU time + short kernels x HOST_S_PER_KERNEL

and the backward, issued without a sync, takes the longer of its host and GPU time as before, but for
the forward it runs again (full checkpointing, Megatron-core's `moe` recompute module), which reaches the
same sync (the dispatcher's `preprocess` runs again, megatron/core/transformer/moe/token_dispatcher.py @
6a6cd478) and costs the same way:

    synced recomputation = its long kernels' GPU time + its short kernels x HOST_S_PER_KERNEL

A dense layer can read back too. Megatron-DeepSpeed's ParallelTransformerLayer builds two scalars on the
GPU in the middle of every forward, before its MLP (`moe_loss` and `mlp_bias` as `torch.tensor(0.0,
device=...)`, megatron/model/transformer.py from 50b32515, 2022-06-07, to f4157bea, 2024-12-24), whatever
its experts and whether or not DeepSpeed's pipeline engine runs it. A tensor made from host data on the
GPU is a blocking copy, which PyTorch issues as a copy and a wait for the stream (pytorch/pytorch
aten/src/ATen/native/cuda/Copy.cu @ 007aa8ae, `copy_kernel_cuda`: `memcpy_and_sync`, cudaMemcpyAsync then
cudaStreamSynchronize; torch's sync debug mode warns on it). So each layer's forward, and under full
checkpointing its recomputed forward, runs as the synchronised forward above, and each such copy is one
more operation the host issues (LAYER_SYNCS, a published run's option: `layer_sync_copies`).

A Grace CPU (GB200's and GB300's host, over NVLink-C2C) issues each operator slower than the
x86 hosts the rates above were measured on: PyTorch's nn.Linear forward takes 37.08 us of host
time on GB200 against 13.48 us on a DGX H100's Xeon Platinum 8480C, the same script and library
(NVIDIA/TransformerEngine#2053: GH200 33.17 us). GRACE_HOST_SLOWDOWN, their ratio, scales every
rate of a card whose host is a Grace CPU, where no kernel table of its own was measured.

CUDA graphs (TransformerEngine's and Megatron's graphed layers, torch.compile's reduce-overhead)
replay a captured step at about 0.6 us a kernel (ahrefs/ocannl#488, 0.58 us per node,
GRAPH_REPLAY_S_PER_KERNEL). The planner's own plans run eager or torch.compile's default mode; a
published run whose whole step replays one graph (Megatron-core's `cuda_graph_impl='full_iteration'`,
its MoE layers made capturable by static per-rank token budgets: FULL_ITERATION_GRAPH) issues its
kernels and collectives at that rate, and no forward waits on the host for token counts. Layerwise
graphs (Megatron-core's `enable_cuda_graph` with its default `cuda_graph_scope='full'`: "one CUDA graph
per layer", megatron/core/transformer/transformer_config.py @ 1584dca2: LAYER_GRAPHS) replay each
transformer layer's forward and its backward from a graph of its own, its kernels and the collectives
inside it (tensor parallelism's, the experts' exchanges) at that rate, and each replay's fixed launch
(about 15 us, GRAPH_LAUNCH_S, the same measurement); the embedding, the head and the loss stay eager,
as do the collectives issued once a step; a captured layer has fixed shapes, so nothing in it waits on
the host either (Megatron-core refuses graphs beside recomputation). Graphs of parts of a layer
(`cuda_graph_scope='attn'`, TransformerEngine's modules) are not modelled.

Under CUDA_LAUNCH_BLOCKING=1 (LAUNCH_BLOCKING, a published run's option) every launch returns only
once its kernel has finished, so the host issues the next kernel only then: the GPU waits out the
host's whole issue time on every micro-step, beside none of its own work (CUDA's programming guide,
"Concurrent Execution between Host and Device": the variable disables asynchronous launches), and
a micro-step of many kernels pays it on each, as one of few large ones does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.common.hardware import GPUSpec
from harness.plan.network.comm import PIPELINED, Collective
from harness.plan.speed.compute import Kernels
from harness.plan.speed.kernel_table import kernel_table

HOST_S_PER_KERNEL = {"eager": 24e-6, "compiled": 4.7e-6}
GRACE_HOST_SLOWDOWN = 37.08 / 13.48  # a torch operator's host time, GB200's Grace over DGX H100's Xeon
GRACE_HOST = "Grace"  # in a card's host_link (harness/common/hardware.py): its host is a Grace CPU
GRAPH_REPLAY_S_PER_KERNEL = 0.58e-6
GRAPH_LAUNCH_S = 15e-6  # a replay's fixed cost beside its kernels' (ahrefs/ocannl#488: about 15 us)
FULL_ITERATION_GRAPH = "full_iteration_graph"  # a published layout's option: every micro-step one graph's replay
LAYER_GRAPHS = "layer_graphs"  # a published layout's option: each layer's forward and backward one graph's replay
LAUNCH_BLOCKING = "launch_blocking"  # a published layout's option: the run set CUDA_LAUNCH_BLOCKING=1
LAYER_SYNCS = "layer_syncs"  # a published layout's option: each layer's forward waits on blocking copies
LAYER_SYNC_COPIES = 2  # the blocking copies in each layer's forward (Megatron-DeepSpeed's two scalars)
COLLECTIVE_KERNELS = 2  # a collective and the stream's events around it, priced as two eager kernels
HOST_S_PER_COLLECTIVE = COLLECTIVE_KERNELS * HOST_S_PER_KERNEL["eager"]


def host_slowdown(gpu: GPUSpec) -> float:
    """How much longer `gpu`'s host takes for the same Python and dispatch as the x86 hosts the rates
    here (and the reference compare's backend overheads) were measured on: the given eager rate over
    HOST_S_PER_KERNEL's (host_us_per_kernel=), else GRACE_HOST_SLOWDOWN for a Grace CPU, else 1."""
    if gpu.host_us_per_kernel is not None:
        return gpu.host_us_per_kernel * 1e-6 / HOST_S_PER_KERNEL["eager"]
    return GRACE_HOST_SLOWDOWN if GRACE_HOST in gpu.host_link else 1.0


def host_rates(gpu: GPUSpec) -> dict[str, float]:
    """Host seconds per kernel, eager and compiled, on `gpu`'s host: the x86 figures times host_slowdown
    (the same CPU runs a compiled graph's launches at the same pace against the x86 host's)."""
    return {kind: rate * host_slowdown(gpu) for kind, rate in HOST_S_PER_KERNEL.items()}


def issue_rates(gpu: GPUSpec) -> tuple[dict[str, float], str]:
    """Host seconds per kernel, eager and compiled, on `gpu`'s host, and where they come from: the pace
    given (host_us_per_kernel=), else the card's measured kernel table, else host_rates."""
    table = kernel_table(gpu)
    if gpu.host_us_per_kernel is not None:
        return host_rates(gpu), "host_us_per_kernel=, as given"
    if table is not None and table.host_s_per_kernel:
        return table.host_s_per_kernel, f"measured on the card: {table.source}"
    grace = f", x {GRACE_HOST_SLOWDOWN:.2f} on this card's Grace CPU" if host_slowdown(gpu) != 1.0 else ""
    return host_rates(gpu), f"an x86 server's under torch 2.11, host_issue.py{grace}"


@dataclass(frozen=True)
class HostIssue:
    """Seconds the host takes to issue one micro-step, and what it issues."""

    kernels: float  # the model's kernels (forward, backward and what checkpointing runs again)
    collectives: float  # collectives issued on every micro-step
    seconds: float
    # Where the forward synchronises with the host (a dropless mixture of experts): the host's time to
    # issue its short kernels, which the GPU then waits out in series with its long ones; None: no sync.
    synced_forward_short_s: float | None = None
    backward_s: float = 0.0  # of `seconds`, the backward's and what checkpointing runs again
    blocking: bool = False  # every launch waits for its kernel (LAUNCH_BLOCKING): nothing overlaps
    # Where the forward run again in the backward synchronises too: its short kernels' issue; None: no sync.
    synced_again_short_s: float | None = None

    def wait(
        self,
        forward_s: float,
        forward_long_s: float,
        micro_compute_s: float,
        recurring_s: float,
        again_s: float = 0.0,
        long_share: float = 1.0,
    ) -> float:
        """Seconds a micro-step's GPU waits on this host: the longer of the two over the step, or, with a
        synchronised forward, its short kernels' issue beside the long kernels' run, then the backward, whose
        synchronised recomputation (`again_s` of GPU time, `long_share` of it long kernels') is paid the
        forward's way; with blocking launches, the whole issue time."""
        if self.blocking:
            return self.seconds
        overall = max(0.0, self.seconds - micro_compute_s - recurring_s)
        if self.synced_forward_short_s is None:
            return overall
        forward = max(0.0, forward_long_s + self.synced_forward_short_s - forward_s)
        backward_gpu = micro_compute_s - forward_s
        if self.synced_again_short_s is None:
            return max(overall, forward + max(0.0, self.backward_s - backward_gpu))
        again = max(0.0, again_s * long_share + self.synced_again_short_s - again_s)
        rest = max(0.0, self.backward_s - self.synced_again_short_s - (backward_gpu - again_s))
        return max(overall, forward + again + rest)

    def describe(self) -> str:
        return (
            f"the host issues {self.kernels:,.0f} kernels and {self.collectives:,.0f} collectives a micro-step "
            f"in {self.seconds * 1e3:.1f} ms"
        )


def layer_sync_copies(layers: int, full_checkpointing: bool) -> Kernels:
    """The blocking copies a micro-step of `layers` LAYER_SYNCS layers issues: LAYER_SYNC_COPIES in each
    layer's forward and, under full checkpointing, in its recomputed forward."""
    copies = LAYER_SYNC_COPIES * layers
    return Kernels(forward=copies, again=copies if full_checkpointing else 0)


def _issued_calls(collectives: list[Collective], grad_accum: int) -> tuple[float, float]:
    """The collective calls the host issues a micro-step: those of every micro-step, and those issued
    once a step spread over its `grad_accum` micro-steps. A host copy is a copy engine's work, and
    async TP's pipelined calls are issued by its compiled graph."""
    issued = [c for c in collectives if c.kind != "host-copy" and c.window != PIPELINED]
    every = sum(c.calls for c in issued if c.per_micro_step)
    return every, sum(c.calls for c in issued if not c.per_micro_step) / grad_accum


def host_issue(
    kernels: Kernels,
    collectives: list[Collective],
    compiled: bool,
    grad_accum: int,
    measured: dict[str, float] | None = None,
    synced_long_forward: float | None = None,
    blocking: bool = False,
    synced_long_again: float | None = None,
) -> HostIssue:
    """The host's time for one micro-step of `kernels`, beside the collectives each micro-step issues
    (those issued once a step are spread over its `grad_accum` micro-steps); `measured`: the card's
    own host times per kernel (kernel_table.py), in place of HOST_S_PER_KERNEL; `synced_long_forward`:
    where the forward synchronises with the host, how many of its kernels are long ones (matmuls,
    attention), the rest short; `blocking`: every launch waits for its kernel (LAUNCH_BLOCKING);
    `synced_long_again`: likewise of the kernels checkpointing runs again, where they reach the sync."""
    issued = sum(_issued_calls(collectives, grad_accum))
    rates = measured or HOST_S_PER_KERNEL
    rate = rates["compiled" if compiled else "eager"]
    collective_s = issued * COLLECTIVE_KERNELS * rates["eager"]
    seconds = kernels.total * rate + collective_s
    backward = (kernels.backward + kernels.again) * rate + collective_s / 2
    short = None if synced_long_forward is None else max(0.0, kernels.forward - synced_long_forward) * rate
    again = None if synced_long_again is None else max(0.0, kernels.again - synced_long_again) * rate
    return HostIssue(kernels.total, issued, seconds, short, backward, blocking, again)


def layer_graph_issue(
    kernels: Kernels, eager: Kernels, collectives: list[Collective], grad_accum: int, eager_rate: float, layers: int
) -> HostIssue:
    """The host's time for one micro-step whose `layers` transformer layers replay their forward and
    backward from graphs of their own (LAYER_GRAPHS): the `eager` kernels (the embedding, the head, the
    loss) and the collectives issued once a step at `eager_rate`, the rest of `kernels` and the
    collectives of every micro-step (the layers' own) at the replay's rate, and two replays' launches a
    layer. Nothing waits on the host mid-way: a captured layer has fixed shapes."""
    in_layers, once = _issued_calls(collectives, grad_accum)
    collective_s = COLLECTIVE_KERNELS * (once * eager_rate + in_layers * GRAPH_REPLAY_S_PER_KERNEL)

    def issue(eager_kernels: float, every_kernel: float) -> float:
        return eager_kernels * eager_rate + (every_kernel - eager_kernels) * GRAPH_REPLAY_S_PER_KERNEL

    seconds = issue(eager.total, kernels.total) + collective_s + 2 * layers * GRAPH_LAUNCH_S
    backward = issue(eager.backward + eager.again, kernels.backward + kernels.again) + collective_s / 2
    return HostIssue(kernels.total, in_layers + once, seconds, backward_s=backward + layers * GRAPH_LAUNCH_S)
