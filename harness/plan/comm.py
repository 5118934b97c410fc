"""Communication per step per GPU: which collectives each strategy runs, how many bytes
each GPU puts on the wire, how long that takes on the interconnect, and which compute
phase can hide it.

Ring collectives over N GPUs (NCCL's bandwidth-optimal algorithms): an all-reduce of B
bytes sends 2(N-1)/N·B per GPU, an all-gather or reduce-scatter (N-1)/N·B. DDP and
ZeRO-1/2 reduce gradients and (ZeRO) gather parameters back: 2(N-1)/N·Ψ in all;
FSDP and ZeRO-3 gather parameters for forward and again for backward, then reduce-scatter
gradients: 3(N-1)/N·Ψ, the ZeRO paper's 1.5x of data parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.plan.backends import Backend
from harness.plan.model_shape import ModelShape, PlanError
from harness.plan.model_states import BYTES


@dataclass(frozen=True)
class Link:
    name: str
    gb_per_s: float  # bus bandwidth one GPU reaches in a ring collective, GB/s (1e9 bytes)
    latency_us: float  # per hop of a collective


# Effective per-GPU bus bandwidths, below the data-sheet peaks: NCCL reaches ~70-80% of them.
INTERCONNECTS = {
    "nvlink": Link("nvlink", 300.0, 5.0),  # H100 SXM NVLink 4: 450 GB/s per direction
    "pcie": Link("pcie", 24.0, 10.0),  # PCIe 4.0 x16: 32 GB/s per direction, through the host bridge
    "infiniband": Link("infiniband", 40.0, 10.0),  # NDR 400 Gb/s (50 GB/s), one NIC per GPU
}
INTER_NODE = {
    "infiniband": INTERCONNECTS["infiniband"],
    "ethernet": Link("ethernet", 10.0, 30.0),  # 100 GbE (12.5 GB/s) per GPU, RoCE
}
HOST_LINK = Link("pcie-host", 24.0, 10.0)  # GPU <-> CPU memory for offload: PCIe 4.0 x16


def parse_link(value: str, table: dict[str, Link], what: str) -> Link:
    """A link by name or by bandwidth in GB/s (`nvlink`, `pcie`, `100`)."""
    key = str(value).strip().lower()
    if key in table:
        return table[key]
    try:
        gb_per_s = float(key)
    except ValueError:
        raise PlanError(
            f"unknown {what} {value!r}: use {', '.join(table)} or a bandwidth in GB/s such as 100"
        ) from None
    if not math.isfinite(gb_per_s) or gb_per_s <= 0:
        raise PlanError(f"{what}={value} must be a positive bandwidth in GB/s")
    return Link(f"{gb_per_s:g} GB/s", gb_per_s, 10.0)


@dataclass(frozen=True)
class Topology:
    gpus: int
    nodes: int
    intra: Link
    inter: Link

    @property
    def link(self) -> Link:
        """The link a collective over every GPU is limited by: across nodes the slower one."""
        if self.nodes == 1:
            return self.intra
        return min((self.intra, self.inter), key=lambda link: link.gb_per_s)

    def describe(self) -> str:
        if self.nodes == 1:
            return f"{self.gpus} GPUs on {self.intra.name}"
        return (
            f"{self.nodes} nodes x {self.gpus // self.nodes} GPUs, {self.intra.name} inside, {self.inter.name} between"
        )


@dataclass(frozen=True)
class Collective:
    """One kind of collective a step runs, summed over its calls."""

    what: str  # e.g. "all-reduce gradients"
    kind: str  # all-reduce | all-gather | reduce-scatter | host-copy
    payload_bytes: int  # bytes of the whole tensor(s), per call set
    calls: int  # how many collective calls carry it (buckets, blocks)
    window: str | None  # compute phase that can hide it: forward | backward | None (exposed)
    tail_bytes: int = 0  # payload that cannot overlap (the last bucket, the first block)
    per_micro_step: bool = False  # runs on every micro-step, not once per step

    def wire_bytes(self, gpus: int) -> float:
        """Bytes each GPU sends (ring algorithms); a host copy moves its payload once."""
        if self.kind == "host-copy":
            return float(self.payload_bytes)
        if gpus <= 1:
            return 0.0
        factor = 2 * (gpus - 1) / gpus if self.kind == "all-reduce" else (gpus - 1) / gpus
        return factor * self.payload_bytes

    def seconds(self, topology: Topology, tail: bool = False) -> float:
        link = HOST_LINK if self.kind == "host-copy" else topology.link
        payload = self.tail_bytes if tail else self.payload_bytes
        if self.kind != "host-copy" and topology.gpus <= 1:
            return 0.0
        wire = Collective(self.what, self.kind, payload, 1, None).wire_bytes(topology.gpus)
        hops = 1 if self.kind == "host-copy" else 2 * math.ceil(math.log2(topology.gpus))
        calls = 1 if tail else self.calls
        return wire / (link.gb_per_s * 1e9) + calls * hops * link.latency_us * 1e-6


def _grad_reduce_bytes(backend: Backend, precision: str) -> int:
    if backend.engine == "torch":
        # DDP reduces the fp32 .grad; FSDP reduces in its reduce_dtype.
        return 4 if precision == "fp32" or backend.replicated or backend.reduce_in_fp32 else BYTES[precision]
    return 4 if backend.option("communication_data_type") == "fp32" else BYTES[precision]


def _gather_bytes(backend: Backend, precision: str) -> int:
    """Bytes per parameter element a gather moves: the compute dtype (FSDP's param_dtype, DeepSpeed's cast)."""
    return 4 if precision == "fp32" else BYTES[precision]


def collectives(shape: ModelShape, backend: Backend, precision: str, gpus: int) -> list[Collective]:
    """What one optimizer step of `backend` communicates, per GPU."""
    params = shape.params
    blocks = shape.block_params() or [params]
    largest_block = max(blocks)
    calls = len(blocks) + 1  # one per FSDP/ZeRO-3 unit: every block and the root
    grad_bytes, gather_bytes = _grad_reduce_bytes(backend, precision), _gather_bytes(backend, precision)
    out: list[Collective] = []
    if gpus > 1 and backend.stage == 0:
        payload = params * grad_bytes
        bucket = int(backend.option("bucket_cap_mb") * 2**20)
        out.append(
            Collective(
                "all-reduce gradients",
                "all-reduce",
                payload,
                max(1, math.ceil(payload / bucket)),
                "backward",
                tail_bytes=min(bucket, payload),
            )
        )
    elif gpus > 1 and backend.stage in (1, 2) and backend.engine == "deepspeed":
        reduce_payload = params * grad_bytes
        reduce_calls = max(1, math.ceil(params / backend.option("reduce_bucket_size")))
        window = "backward" if backend.option("overlap_comm") else None
        # ZeRO-2 keeps only its gradient partition, so it must reduce on every micro-step.
        out.append(
            Collective(
                "reduce-scatter gradients",
                "reduce-scatter",
                reduce_payload,
                reduce_calls,
                window,
                tail_bytes=min(reduce_payload, int(backend.option("reduce_bucket_size")) * grad_bytes),
                per_micro_step=backend.stage == 2,
            )
        )
        gather_calls = max(1, math.ceil(params / backend.option("allgather_bucket_size")))
        out.append(Collective("all-gather updated parameters", "all-gather", params * gather_bytes, gather_calls, None))
    elif gpus > 1 and backend.stage == 3:
        gathered = params - _kept_whole(shape, backend)
        out.append(
            Collective(
                "all-gather parameters (forward)",
                "all-gather",
                gathered * gather_bytes,
                calls,
                "forward",
                tail_bytes=largest_block * gather_bytes,
                per_micro_step=True,
            )
        )
        if backend.reshard_after_forward:
            out.append(
                Collective(
                    "all-gather parameters (backward)",
                    "all-gather",
                    gathered * gather_bytes,
                    calls,
                    "backward",
                    per_micro_step=True,
                )
            )
        out.append(
            Collective(
                "reduce-scatter gradients",
                "reduce-scatter",
                params * grad_bytes,
                calls,
                "backward",
                tail_bytes=largest_block * grad_bytes,
                per_micro_step=backend.sharded_grads_every_micro_step,
            )
        )
    out.extend(_offload_copies(shape, backend, precision, gpus))
    return out


def _kept_whole(shape: ModelShape, backend: Backend) -> int:
    """ZeRO-3 parameters under the persistence threshold: never gathered, kept whole on every rank."""
    if backend.engine != "deepspeed" or shape.tensors is None:
        return 0
    threshold = backend.option("stage3_param_persistence_threshold")
    return sum(t.numel for t in shape.tensors if t.numel < threshold)


def _offload_copies(shape: ModelShape, backend: Backend, precision: str, gpus: int) -> list[Collective]:
    """Host <-> GPU traffic of offload: gradients down, updated parameters up, ZeRO-3 shards per gather."""
    shard = math.ceil(shape.params / gpus)
    out: list[Collective] = []
    if backend.offload_optimizer:
        grad_bytes = 4 if backend.engine == "torch" else BYTES[precision]
        out.append(Collective("gradients to host", "host-copy", shard * grad_bytes, 1, None))
        if not backend.offload_params:
            out.append(Collective("updated parameters to GPU", "host-copy", shard * BYTES[precision], 1, None))
    if backend.offload_params:
        param_bytes = 4 if backend.engine == "torch" else BYTES[precision]
        gathers = 2 if backend.reshard_after_forward else 1
        out.append(
            Collective(
                "parameter shards to GPU", "host-copy", gathers * shard * param_bytes, 1, None, per_micro_step=True
            )
        )
    return out
