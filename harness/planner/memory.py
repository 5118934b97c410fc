"""Model states per GPU: parameters, gradients and optimizer state, as each backend really
holds them, for the most loaded rank (the figure a run reports is the maximum over ranks).

Bytes follow the code, not a textbook: the torch engine (single, DDP, FSDP2, Accelerate's
DDP/FSDP) keeps fp32 parameters, fp32 gradients and fp32 Adam moments in every precision
(autocast and FSDP's MixedPrecisionPolicy cast on the fly); DeepSpeed casts the model to
bf16/fp16, keeps low-precision parameters and gradients plus an fp32 master copy (counted
as optimizer state, as the ZeRO paper's K=12 does), flattens each optimizer param group
padded to a multiple of 2·N elements (ZeRO-1/2) or pads each parameter to a multiple of
N (ZeRO-3). FSDP2 shards every tensor on dim 0, the first ranks taking ceil(rows/N).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.planner.backends import Backend
from harness.planner.model_shape import ModelShape, ParamTensor
from strategies.memory import MemoryBreakdown

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, fp32
STEP_TENSOR_BYTES = 4  # torch Adam keeps `step` as a float32 scalar tensor per parameter it steps
DEEPSPEED_ALIGNMENT = 2  # ZeRO-1/2 pad each flat group to a multiple of 2·N elements (nccl_start_alignment_factor)
GPU = "cuda"


def zero_paper_bytes_per_gpu(params: float, stage: int, gpus: int, k: float = 12.0) -> float:
    """The ZeRO paper's model states per GPU (section 3, table 1): fp16 parameters and
    gradients (2+2 bytes) plus K bytes of optimizer state, sharded by stage."""
    if stage == 0:
        return (2 + 2 + k) * params
    if stage == 1:
        return (2 + 2 + k / gpus) * params
    if stage == 2:
        return (2 + (2 + k) / gpus) * params
    if stage == 3:
        return (2 + 2 + k) * params / gpus
    raise ValueError(f"ZeRO stage {stage} does not exist: use 0 (data parallel), 1, 2 or 3")


def _dim0_shard(t: ParamTensor, world: int) -> int:
    """FSDP2's Shard(0) on the first rank: ceil(rows / N) rows."""
    rows = t.shape[0] if t.shape else 1
    return math.ceil(rows / world) * (t.numel // max(rows, 1))


def _groups(shape: ModelShape) -> list[list[ParamTensor]]:
    """The runner's AdamW param groups (harness/optim.py): matrices decay, vectors do not."""
    assert shape.tensors is not None
    groups = [[t for t in shape.tensors if len(t.shape) >= 2], [t for t in shape.tensors if len(t.shape) < 2]]
    return [g for g in groups if g]


def _placed(gpu_bytes: int, on_cpu: bool) -> dict[str, int]:
    return {"cpu": gpu_bytes} if on_cpu else {GPU: gpu_bytes}


@dataclass(frozen=True)
class _Counts:
    """Elements per rank: parameters, gradients, fp32 optimizer elements, optimizer tensors."""

    params: int
    grads: int
    master: int  # elements of the fp32 copy the optimizer steps (0 where it steps the parameters themselves)
    moments_of: int  # elements each Adam moment covers
    optimizer_tensors: int  # how many tensors Adam steps (one `step` scalar each)


def _torch_counts(shape: ModelShape, backend: Backend, world: int) -> _Counts:
    sharded = backend.stage == 3 and world > 1
    if shape.tensors is None:
        n = math.ceil(shape.params / world) if sharded else shape.params
        return _Counts(n, n, 0, n, 0)
    n = sum(_dim0_shard(t, world) if sharded else t.numel for t in shape.tensors)
    return _Counts(n, n, 0, n, len(shape.tensors))


def _deepspeed_counts(shape: ModelShape, backend: Backend, world: int) -> _Counts:
    if backend.stage == 3:
        if shape.tensors is None:
            part = math.ceil(shape.params / world)
            return _Counts(part, part, part, part, 0)
        parts = [[math.ceil(t.numel / world) for t in group] for group in _groups(shape)]
        sub_group = backend.option("sub_group_size")
        part = sum(map(sum, parts))
        sub_groups = sum(max(1, math.ceil(sum(g) / sub_group)) for g in parts)
        return _Counts(part, part, part, part, sub_groups)
    if shape.tensors is None:
        part = math.ceil(shape.params / world)
        return _Counts(shape.params, part if backend.stage == 2 else shape.params, part, part, 0)
    align = DEEPSPEED_ALIGNMENT * world
    padded = [math.ceil(sum(t.numel for t in g) / align) * align for g in _groups(shape)]
    part = sum(p // world for p in padded)
    full = sum(padded)
    return _Counts(full, part if backend.stage == 2 else full, part, part, len(padded))


def model_states(shape: ModelShape, backend: Backend, precision: str, world: int) -> MemoryBreakdown:
    """Bytes of parameters, gradients and optimizer state the most loaded rank holds, by device."""
    if backend.engine == "deepspeed":
        counts = _deepspeed_counts(shape, backend, world)
        low = BYTES[precision]  # DeepSpeed casts the model: bf16/fp16 parameters and gradients
    else:
        counts = _torch_counts(shape, backend, world)
        low = BYTES["fp32"]
    optimizer = (counts.master + ADAM_MOMENTS * counts.moments_of) * BYTES["fp32"]
    optimizer += counts.optimizer_tensors * STEP_TENSOR_BYTES
    return MemoryBreakdown(
        params=_placed(counts.params * low, backend.offload_params),
        grads=_placed(counts.grads * low, backend.offload_params and backend.engine == "torch"),
        optimizer=_placed(optimizer, backend.offload_optimizer),
    )


def gpu_bytes(breakdown: MemoryBreakdown) -> int:
    """What of a breakdown lives in GPU memory."""
    return sum(getattr(breakdown, c).get(GPU, 0) for c in ("params", "grads", "optimizer"))
