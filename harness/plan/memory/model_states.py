"""Model states per GPU: parameters, gradients and optimizer state, as each backend really
holds them, for the most loaded rank (the figure a run reports is the maximum over ranks).

Bytes follow the code, not a textbook: the torch engine (single, DDP, FSDP2, Accelerate's
DDP/FSDP) keeps fp32 parameters, fp32 gradients and fp32 Adam moments in every precision
(autocast and FSDP's MixedPrecisionPolicy cast on the fly); DeepSpeed casts the model to
bf16/fp16, keeps low-precision parameters and gradients plus an fp32 master copy (counted
as optimizer state, as the ZeRO paper's K=12 does), flattens each optimizer param group
padded to a multiple of 2·N elements (ZeRO-1/2) or pads each parameter to a multiple of
N (ZeRO-3). FSDP2 shards every tensor on dim 0, the first ranks taking ceil(rows/N).

torch's ZeRO-1 (ZeroRedundancyOptimizer, zero1-tp) keeps the whole model and its gradients, and
the optimizer state of the whole tensors it steps, dealt out greedily by size.

N is the group the stage shards over (every data-parallel GPU, or a hybrid shard group).
Tensor parallelism first splits every matrix over its tp GPUs (vectors stay whole); hpZ keeps a
secondary copy of the parameter shards over its node-sized group; torch.nn.DataParallel keeps
the whole model, its gradients and the optimizer state on GPU 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from harness.plan.memory.recipe import PLAIN, Recipe, moment_bytes
from harness.plan.model.model_shape import ModelShape, ParamTensor
from harness.plan.parallel.backends import MEGATRON_FSDP, Backend
from strategies.memory import MemoryBreakdown

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, fp32
STEP_TENSOR_BYTES = 4  # torch Adam keeps `step` as a float32 scalar tensor per parameter it steps
DEEPSPEED_ALIGNMENT = 2  # ZeRO-1/2 pad each flat group to a multiple of 2·N elements (nccl_start_alignment_factor)
GPU = "cuda"
T = TypeVar("T")


def compute_bytes(precision: str) -> int:
    """Bytes per element of what a GPU computes with: the parameters a forward reads once gathered
    or cast (FSDP's param_dtype, DeepSpeed's cast, autocast's copies), the activations exchanged."""
    return 4 if precision == "fp32" else BYTES[precision]


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


# Kept: a model's tensors repeat over its blocks, and a plan slices them for every layout it weighs.
# A ParamTensor is frozen, so the slice of equal tensors is one object.
@functools.lru_cache(maxsize=65536)
def tp_slice(t: ParamTensor, tp: int) -> ParamTensor:
    """What one of `tp` tensor-parallel GPUs holds of a tensor: a matrix split, a vector (or a matrix
    every GPU holds whole, ParamTensor.tp_whole) whole."""
    if tp <= 1 or len(t.shape) < 2 or t.tp_whole:
        return t
    return replace(t, shape=(max(1, t.shape[0] // tp), *t.shape[1:]))


def _per_model(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn(shape, *sizes)` computed once per model's tensors and sizes: a plan, its searches and its
    recommendation ask again for every strategy, GPU count and micro-batch, and a 405B model has
    over 1,000 tensors. The entry keeps the tensors it was computed for, so a new model never
    reads another's."""
    cache: dict[tuple, tuple[object, T]] = {}

    @functools.wraps(fn)
    def cached(shape: ModelShape, *sizes: object) -> T:
        key = (id(shape.tensors), *sizes)
        hit = cache.get(key)
        if hit is not None and hit[0] is shape.tensors:
            return hit[1]
        if len(cache) >= 256:
            cache.clear()
        value = fn(shape, *sizes)
        cache[key] = (shape.tensors, value)
        return value

    return cached


@_per_model
def _tensors(shape: ModelShape, tp: int) -> tuple[ParamTensor, ...]:
    """What one tensor-parallel GPU holds: the blocks' matrices split, the root's where the
    model's plan splits its embedding and head."""
    assert shape.tensors is not None
    head = shape.dims.head_split(tp) if shape.dims is not None else tp
    return tuple(tp_slice(t, tp if t.block is not None else head) for t in shape.tensors)


def _groups(shape: ModelShape, tp: int = 1) -> list[list[ParamTensor]]:
    """The runner's AdamW param groups (harness/train/optimizer.py): matrices decay, vectors do not."""
    tensors = _tensors(shape, tp)
    groups = [[t for t in tensors if len(t.shape) >= 2], [t for t in tensors if len(t.shape) < 2]]
    return [g for g in groups if g]


class _Holdings:
    """Bytes per category and device, added up piece by piece."""

    def __init__(self) -> None:
        self.bytes: dict[str, dict[str, int]] = {c: {} for c in ("params", "grads", "optimizer")}

    def add(self, category: str, nbytes: int, on_cpu: bool = False) -> None:
        device = "cpu" if on_cpu else GPU
        self.bytes[category][device] = self.bytes[category].get(device, 0) + int(nbytes)

    def breakdown(self) -> MemoryBreakdown:
        return MemoryBreakdown(**self.bytes)


def _adam(held: _Holdings, sizes: list[int], tensors: int, on_cpu: bool, recipe: Recipe, moment_dtype: int = 4) -> None:
    """AdamW's moments over tensors of `sizes` elements (fp32, the parameters' dtype under pure
    bf16, or 8-bit blocks), and torch's `step` scalar per stepped tensor."""
    held.add("optimizer", moment_bytes(sizes, recipe.optimizer, moment_dtype) + tensors * STEP_TENSOR_BYTES, on_cpu)


def _torch_states(shape: ModelShape, backend: Backend, shards: int, tp: int, recipe: Recipe) -> _Holdings:
    """fp32 parameters, gradients and moments (bf16 all three under pure bf16, the gradients fp32
    again with fp32 accumulation; bf16 parameters and gradients beside an fp32 master and moments
    under Megatron's mixed precision); FSDP2 shards each tensor on dim 0."""
    sharded = backend.stage == 3 and shards > 1
    if shape.tensors is None:
        whole = math.ceil(shape.params / tp)
        sizes, tensors = [math.ceil(whole / shards) if sharded else whole], 0
    else:
        sizes = list(_torch_elements(shape, tp, shards if sharded else 1))
        tensors = len(sizes)
    elements = sum(sizes)
    element = 2 if recipe.low_precision_params else 4
    held_bytes = _Holdings()
    fp8_saving = _fp8_weight_saving(shape, backend, tp, shards, recipe, element)
    held_bytes.add("params", elements * element - fp8_saving, backend.offload_params)
    held_bytes.add("grads", elements * (4 if recipe.fp32_grad_accum else element), backend.offload_params)
    if backend.stage == 1 and shards > 1 and recipe.megatron_mixed_precision:
        # Megatron's distributed optimizer: an even range of the flat gradient buffer per rank
        sizes = [math.ceil(elements / shards)]
    elif backend.stage == 1 and shards > 1:  # torch's ZeRO-1: the state of the tensors this rank steps
        sizes = list(_zero_redundancy_share(shape, tp, shards)) if tensors else [math.ceil(elements / shards)]
        tensors = len(sizes) if tensors else 0
    if recipe.megatron_mixed_precision:  # the fp32 master of what this rank steps
        held_bytes.add("optimizer", sum(sizes) * 4, backend.offload_optimizer)
    _adam(held_bytes, sizes, tensors, backend.offload_optimizer, recipe, 2 if recipe.pure_bf16 else 4)
    return held_bytes


def _fp8_weight_saving(shape: ModelShape, backend: Backend, tp: int, shards: int, recipe: Recipe, element: int) -> int:
    """Bytes Megatron-FSDP saves holding the blocks' matrices as fp8 (`fp8_param_gather`: its sharded
    weight buffer is uint8, megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py
    @ 41eecc45), one byte an element where the other weights keep `element`."""
    if not (recipe.fp8_all_gather and backend.options.get(MEGATRON_FSDP)) or shape.tensors is None:
        return 0
    matrices = sum(t.numel for t in shape.tensors if t.block is not None and len(t.shape) >= 2)
    return matrices // (tp * max(shards, 1)) * (element - 1)


@_per_model
def _zero_redundancy_share(shape: ModelShape, tp: int, world: int) -> tuple[int, ...]:
    """torch's ZeroRedundancyOptimizer: each param group's tensors, largest first, to the rank
    stepping the fewest elements so far; the sizes of the tensors the most loaded rank steps."""
    owned: list[list[int]] = [[] for _ in range(world)]
    loads = [0] * world
    for group in _groups(shape, tp):
        for numel in sorted((t.numel for t in group), reverse=True):
            rank = loads.index(min(loads))
            owned[rank].append(numel)
            loads[rank] += numel
    return tuple(owned[loads.index(max(loads))])


@_per_model
def _torch_elements(shape: ModelShape, tp: int, shards: int) -> tuple[int, ...]:
    """Elements one GPU holds of each tensor, sharded on dim 0 over `shards`: each distinct shape's
    shard worked out once, the blocks repeating the same few."""
    tensors = _tensors(shape, tp)
    if shards <= 1:
        return tuple(t.numel for t in tensors)
    by_shape: dict[tuple[int, ...], int] = {}
    for t in tensors:
        if t.shape not in by_shape:
            by_shape[t.shape] = _dim0_shard(t, shards)
    return tuple(by_shape[t.shape] for t in tensors)


def _rank_overlaps(numels: list[int], world: int) -> list[int]:
    """ZeRO-1/2: elements of the parameters that reach into each rank's partition of one flat
    group (padded to 2·N); DeepSpeed keeps whole gradients of those, straddlers included."""
    align = DEEPSPEED_ALIGNMENT * world
    part = math.ceil(sum(numels) / align) * align // world
    per_rank, offset = [0] * world, 0
    for n in numels:
        for rank in range(offset // part, min((offset + n - 1) // part, world - 1) + 1):
            per_rank[rank] += n
        offset += n
    return per_rank


@_per_model
def _zero12_layout(shape: ModelShape, tp: int, world: int) -> tuple[int, int, int, int, int]:
    """(elements of the padded flat groups, of this rank's partition, groups, of the gradients
    reaching into the most loaded partition, of the largest parameter)."""
    numels = [[t.numel for t in g] for g in _groups(shape, tp)]
    align = DEEPSPEED_ALIGNMENT * world
    padded = [math.ceil(sum(g) / align) * align for g in numels]
    overlaps = [_rank_overlaps(g, world) for g in numels]
    grads = max(sum(o[rank] for o in overlaps) for rank in range(world))
    largest = max(t.numel for t in _tensors(shape, tp))
    return sum(padded), sum(p // world for p in padded), len(padded), grads, largest


def _zero12_states(
    shape: ModelShape, backend: Backend, precision: str, world: int, tp: int, recipe: Recipe
) -> _Holdings:
    """stage_1_and_2.py: each param group flat (the whole model on every rank, padded to 2·N),
    an fp32 master of this rank's partition, its gradients in a flat buffer of the parameters
    reaching into the partition (ZeRO-1 as ZeRO-2: both reduce into it during the last
    micro-step's backward). Under offload: the master, moments and its fp32 gradients on the
    host, a low-precision host copy of the partition, and a largest-parameter gradient
    buffer on each side instead of the flat gradient buffer."""
    low = BYTES[precision]
    held = _Holdings()
    offload = backend.offload_optimizer
    if shape.tensors is None:
        whole = math.ceil(shape.params / tp)
        full, part, groups, largest = whole, math.ceil(whole / world), 0, 0
        grads = part
    else:
        full, part, groups, grads, largest = _zero12_layout(shape, tp, world)
    held.add("params", full * low)
    held.add("optimizer", part * 4, offload)  # the fp32 master partition
    _adam(held, _flat(part, groups), groups, offload, recipe)
    if offload:
        held.add("params", part * low, on_cpu=True)
        held.add("grads", part * 4, on_cpu=True)  # the master's fp32 gradient
        held.add("grads", largest * low, on_cpu=True)
        held.add("grads", largest * low)
    else:
        held.add("grads", grads * (4 if recipe.fp32_grad_accum else low))
    return held


def _flat(elements: int, groups: int) -> list[int]:
    """DeepSpeed's flat partitions: `elements` over `groups` tensors (one where no group is known)."""
    return [math.ceil(elements / max(groups, 1))] * max(groups, 1)


@_per_model
def _zero3_layout(shape: ModelShape, tp: int, world: int, threshold: float, sub_group: float) -> tuple[int, int, int]:
    """(elements of this rank's partitions, of the parameters kept whole, optimizer sub-groups)."""
    parts = [[math.ceil(t.numel / world) for t in g] for g in _groups(shape, tp)]
    whole = sum(t.numel for t in _tensors(shape, tp) if t.numel <= threshold) if world > 1 else 0
    sub_groups = sum(max(1, math.ceil(sum(g) / sub_group)) for g in parts)
    return sum(map(sum, parts)), whole, sub_groups


def _zero3_states(
    shape: ModelShape, backend: Backend, precision: str, world: int, tp: int, hpz: int, recipe: Recipe
) -> _Holdings:
    """stage3.py: each parameter's partition (padded to a multiple of N), parameters up to the
    persistence threshold also kept whole, a flat buffer of every partition's gradient (on
    the host under optimizer offload), one reduction bucket in the communication dtype, an
    fp32 master and moments per sub-group (sub_group_size elements); hpZ's secondary partition
    over its group."""
    low = BYTES[precision]
    held = _Holdings()
    offload = backend.offload_optimizer
    if shape.tensors is None:
        whole_model = math.ceil(shape.params / tp)
        part, whole, sub_groups, bucket = math.ceil(whole_model / world), 0, 0, 0
    else:
        threshold, sub_group = backend.option("stage3_param_persistence_threshold"), backend.option("sub_group_size")
        part, whole, sub_groups = _zero3_layout(shape, tp, world, threshold, sub_group)
        bucket = int(backend.option("reduce_bucket_size")) * BYTES[backend.option("communication_data_type")]
    held.add("params", part * low, backend.offload_params)
    held.add("params", whole * low)
    if hpz > 1:
        # hpZ's secondary partition, kept whenever the group has more than one rank: DeepSpeed
        # builds it even where the group is the whole world (measured: a 2-rank run holds both).
        held.add("params", math.ceil(part * world / hpz) * low)
    held.add("grads", part * (4 if recipe.fp32_grad_accum else low), offload)
    held.add("grads", bucket)
    held.add("optimizer", part * 4, offload)
    _adam(held, _flat(part, sub_groups), sub_groups, offload, recipe)
    if offload:
        held.add("grads", part * 4, on_cpu=True)  # the master's fp32 gradient
    return held


def model_states(
    shape: ModelShape,
    backend: Backend,
    precision: str,
    shards: int,
    tp: int = 1,
    hpz: int = 1,
    recipe: Recipe = PLAIN,
) -> MemoryBreakdown:
    """Bytes of parameters, gradients and optimizer state the most loaded rank holds, by device,
    as the strategy's own memory_breakdown counts them; `shards` GPUs share the stage's states
    (DataParallel's GPU 0 holds them all); `recipe`: pure bf16 or Megatron's mixed precision, the
    optimizer, fp32 gradients."""
    if backend.replicas == "threads":
        shards = 1
    if backend.engine == "torch":
        return _torch_states(shape, backend, shards, tp, recipe).breakdown()
    if backend.stage == 3:
        return _zero3_states(shape, backend, precision, shards, tp, hpz, recipe).breakdown()
    return _zero12_states(shape, backend, precision, shards, tp, recipe).breakdown()
