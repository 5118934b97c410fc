"""Communication per step per GPU: which collectives each layout runs, over which group of GPUs, how
many bytes, and which compute phase can hide them (network.py prices them).

Data parallel (DDP) all-reduces the gradients, in buckets (replicate: a unit at a time); torch's
ZeRO-1 (ZeroRedundancyOptimizer) all-reduces them too, then broadcasts each updated parameter from
the rank that stepped it; DeepSpeed's ZeRO-1/2 all-reduce them bucket by bucket, each rank keeping
its partition, and all-gather the updated parameters; Megatron's distributed optimizer reduce-
scatters them and all-gathers the updated parameters; FSDP and ZeRO-3 all-gather each unit's
parameters for the forward and again for the backward, then reduce-scatter its gradients (the ZeRO
paper's 1.5x of data parallel). Hybrid sharding does that inside its shard group and all-reduces the
shards' gradients across the replicas; hpZ gathers the backward's parameters from its secondary copy
inside the node. Tensor parallelism (torchtitan's plan, with sequence parallelism) all-gathers a
block's activations before the attention and the MLP and reduce-scatters their outputs, forward and
backward, inside its group and in the block's critical path: on NVLink inside a node, on the network
where the group is wider than a node; async tensor parallelism pipelines most of them with the
matmuls they feed or drain (async_tp_cost.py prices those). Without sequence parallelism
(Megatron-LM's f and g operators) the column-parallel inputs are whole already, so nothing is
gathered, and the row-parallel outputs are all-reduced forward, the column-parallel inputs'
gradients backward: as many bytes on the wire, in half as many collectives (Korthikanti et al.
2022, arXiv 2205.05198, section 4.2.2). torch.nn.DataParallel broadcasts the
model from GPU 0 every step, gathers the replicas' outputs onto it and reduces their gradients
onto it, none of it hidden.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from harness.plan.memory.model_states import BYTES, compute_bytes
from harness.plan.model.mla_shape import tp_gathered_width
from harness.plan.model.model_shape import ModelShape
from harness.plan.network.fabric import Group, Topology, collective_seconds
from harness.plan.parallel.async_tp_cost import MEGATRON_ENGINE, fused_collectives
from harness.plan.parallel.backends import Backend
from harness.plan.parallel.layout import Layout
from harness.plan.speed.nanotron_step import NANOTRON_ENGINE

QUANTIZED_GATHER_BYTES = 1.0  # ZeRO++ qwZ: int8 weights (and a scale per block of them)
QUANTIZED_REDUCE_BYTES = 0.5  # ZeRO++ qgZ: int4 gradients
HOST_KINDS = ("host-copy",)
# The window of a tensor-parallel collective async TP pipelines with its matmuls: priced with them
# (async_tp_cost.py), neither hidden behind a phase nor exposed whole.
PIPELINED = "matmul"


@dataclass(frozen=True)
class Collective:
    """One kind of collective a step runs, summed over its calls."""

    what: str  # e.g. "all-reduce gradients"
    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all | broadcast | reduce | gather | host-copy
    payload_bytes: float  # bytes of the whole tensor(s) over all calls
    calls: int  # how many collective calls carry it (buckets, blocks)
    window: str | None  # compute phase that can hide it: forward | backward | matmul (PIPELINED) | None (exposed)
    group: Group = Group(1, 1)
    tail_bytes: float = 0.0  # payload that cannot overlap (the last bucket, the first block)
    per_micro_step: bool = False  # runs on every micro-step, not once per step
    # Copies the host issues from Python after the call, one a tensor and rank (DeepSpeed 2021's
    # gather of its persistent parameters: speed/list_collectives.py prices them).
    host_copies: int = 0

    def wire_bytes(self) -> float:
        """Bytes each GPU sends (ring algorithms); a host copy or a gather moves its payload once."""
        if self.kind in HOST_KINDS or self.kind == "gather":
            return float(self.payload_bytes)
        n = self.group.size
        if n <= 1:
            return 0.0
        factor = 2 * (n - 1) / n if self.kind == "all-reduce" else (n - 1) / n
        return factor * self.payload_bytes

    def seconds(self, topology: Topology, host_bytes_per_s: float, tail: bool = False) -> float:
        payload = self.tail_bytes if tail else self.payload_bytes
        calls = 1 if tail else self.calls
        if self.kind in HOST_KINDS:
            return payload / host_bytes_per_s
        if self.kind == "gather":  # copies into GPU 0, one replica after another, over its own link
            return payload / topology.intra.bytes_per_s if self.group.size > 1 else 0.0
        return collective_seconds(topology, self.group, self.kind, payload, calls)


def _grad_reduce_bytes(backend: Backend, precision: str) -> float:
    if backend.quantized_comm and precision != "fp32":
        return QUANTIZED_REDUCE_BYTES
    if backend.engine == "torch" and backend.options.get(MEGATRON_ENGINE):
        # Megatron-LM reduces the gradients of its low-precision parameters as they are, its fp32
        # main_grad under --accumulate-allreduce-grads-in-fp32 (megatron/model/distributed.py:
        # `param.grad.data` flattened and all-reduced, cast to fp32 only with --fp32-allreduce).
        return 4 if precision == "fp32" or backend.reduce_in_fp32 else BYTES[precision]
    if backend.engine == "torch":
        # DDP reduces the fp32 .grad; FSDP reduces in its reduce_dtype.
        return 4 if precision == "fp32" or backend.replicated or backend.reduce_in_fp32 else BYTES[precision]
    return 4 if backend.option("communication_data_type") == "fp32" else BYTES[precision]


def _gather_bytes(backend: Backend, precision: str) -> float:
    if backend.quantized_comm and precision != "fp32":
        return QUANTIZED_GATHER_BYTES
    return compute_bytes(precision)


def _kept_whole(shape: ModelShape, backend: Backend) -> int:
    """ZeRO-3 parameters under the persistence threshold: never gathered, kept whole on every rank."""
    if backend.engine != "deepspeed" or shape.tensors is None:
        return 0
    threshold = backend.option("stage3_param_persistence_threshold")
    return sum(t.numel for t in shape.tensors if t.numel < threshold)


@dataclass(frozen=True)
class Fetches:
    """DeepSpeed ZeRO-3's parameter gathers in one pass over the model (partitioned_param_coordinator.py's
    fetch_sub_module): one coalesced all-gather per module as it is fetched, and the next module's
    prefetched beside its compute, but only while the parameters gathered stay under
    stage3_max_live_parameters (`min(max_live - available, prefetch_bucket)`: nothing where the
    module just gathered holds that many alone). Modules are the matrices above the persistence
    threshold, in the model's order (backward: reversed).

    Where every block is recomputed (full checkpointing), a block's backward runs its forward again,
    fetching each module (its hooks fire in the recomputation), then its backward, last module first;
    the trace DeepSpeed records holds both. After a module's recomputed forward DeepSpeed keeps its
    parameters for the backward only if they recur within stage3_max_reuse_distance elements of
    the trace (`__params_to_release`: the modules after it in the trace, counted until that many
    have passed): module i of a block's k is released, and gathered again for its backward, where the
    modules after it, forward and back, hold 2 x (m_i+1 + ... + m_k) >= max_reuse elements; the
    block's last module always stays (the norms' and biases' few elements aside)."""

    numels: tuple[float, ...]  # each gathered matrix's elements on this GPU's tensor-parallel share
    blocks: tuple[int | None, ...]  # the block of each (None: the root's)
    max_live: float
    max_reuse: float | None = None  # stage3_max_reuse_distance where every block is recomputed; None: none is

    def order(self, window: str) -> list[float]:
        """The elements of each fetch of one pass, in the order they are fetched."""
        if window == "forward":
            return list(self.numels)
        if self.max_reuse is None:
            return list(self.numels[::-1])
        out: list[float] = []
        for block, group in itertools.groupby(zip(self.numels[::-1], self.blocks[::-1], strict=True), lambda e: e[1]):
            backward = [numel for numel, _ in group]  # the block's modules, last first
            if block is None:
                out += backward
                continue
            after = list(itertools.accumulate(backward, initial=0.0))[:-1]  # each module's later ones
            out += backward[::-1] + [m for m, later in zip(backward, after, strict=True) if 2 * later >= self.max_reuse]
        return out

    def _waited(self, window: str) -> list[float]:
        order = self.order(window)
        return [after for before, after in zip(order, order[1:], strict=False) if before >= self.max_live]

    def of(self, window: str) -> tuple[int, float]:
        """(calls, elements not prefetched) of the gathers of one pass."""
        waited = self._waited(window)
        return max(1, len(self.order(window)) - len(waited)), sum(waited)

    def regathered(self, window: str) -> float:
        """Elements one pass gathers beyond each module once: those gathered again for the backward."""
        return sum(self.order(window)) - sum(self.numels)

    def unprefetched(self, window: str) -> int:
        return len(self._waited(window))


def _deepspeed_fetches(shape: ModelShape, backend: Backend, tp: int, checkpointing: str) -> Fetches | None:
    """ZeRO-3's fetches as DeepSpeed runs them; None for FSDP (a unit a block) or a model known by its
    parameter count alone."""
    if backend.engine != "deepspeed" or shape.tensors is None:
        return None
    threshold = backend.option("stage3_param_persistence_threshold")
    gathered = [t for t in shape.tensors if t.numel >= threshold and len(t.shape) == 2]
    if not gathered:
        return None
    max_reuse = backend.option("stage3_max_reuse_distance") / tp if checkpointing == "full" else None
    return Fetches(
        tuple(t.numel / tp for t in gathered),
        tuple(t.block for t in gathered),
        backend.option("stage3_max_live_parameters"),
        max_reuse,
    )


# Of a block's tensor-parallel collectives in the forward, those checkpointing runs again in the
# backward: all of them under full checkpointing; under torchtitan's selective policy the
# reduce-scatters' outputs are kept (its save list), so only the all-gathers.
TP_RECOMPUTED = {"none": {"all-gather": 0, "reduce-scatter": 0}, "full": {"all-gather": 1, "reduce-scatter": 1}}
TP_RECOMPUTED["selective"] = {"all-gather": 1, "reduce-scatter": 0}
# Without sequence parallelism, a block's all-reduces of one pass (the attention's and the MLP's)
# that checkpointing runs again: both under full; under selective the output projection's, whose
# result the MLP's norm reads (the policy saves no all-reduce, and recomputation stops before the
# MLP's, which nothing in the block's backward reads).
TP_ALL_REDUCES_RECOMPUTED = {"none": 0, "full": 2, "selective": 1}
# The calls of each of a micro-step's tensor-parallel collectives outside the blocks: the embedding's
# and the head's, once each, whatever the blocks (a pipeline's stage_seconds tells them apart).
TP_ROOT_CALLS = 2


def _tensor_parallel(
    shape: ModelShape,
    layout: Layout,
    tokens: int,
    precision: str,
    checkpointing: str,
    fp8: bool = False,
    async_tp: bool = False,
    megatron: bool = False,
    sequence_parallel: bool = True,
) -> list[Collective]:
    """Per block, forward: all-gather the sequence-sharded input of the attention and of the MLP,
    reduce-scatter their outputs; the backward mirrors them, and checkpointing repeats the
    forward's. The head and the embedding each gather once and scatter once. With fp8 projections
    (torchao's float8 tensor parallel: the inputs cast before the forward's gathers, the outputs'
    gradients before the backward's) the blocks' all-gathers carry fp8; the reduce-scatters stay
    in `precision`. Under async TP those fused with matmuls (async_tp_cost.fused_collectives) are
    PIPELINED, the rest exposed as before. Megatron-LM's engine (`megatron`) gathers the attention's
    and the MLP's inputs again in the backward, for their weight gradients (it keeps their shards:
    activations.py); under TransformerEngine's `tp_comm_overlap` (`async_tp` there) its
    userbuffers pipeline the same collectives with their GEMMs as async TP's pass does (split
    GEMMs beside ring-exchanged shards), and run the rest beside the backward's other GEMMs (its
    bulk overlaps): those hide behind the backward; the head's and the embedding's, outside the
    blocks, stay exposed. Without `sequence_parallel`: the row-parallel outputs all-reduced forward
    and the column-parallel inputs' gradients backward, two a block each way, and once each for the
    embedding's output and the head's input. Latent attention (mla_shape.py) gathers its latents and
    the shared rotary key into its up-projections where a GQA block gathers H: the passes on the
    attention input's side (the forward's gathers, the backward's reduce-scatter of their gradient)
    carry q_lora + kv_lora + rope a token."""
    if layout.tp <= 1 or shape.dims is None:
        return []
    element = tokens * shape.dims.width
    layers = shape.dims.layers
    held = compute_bytes(precision)
    if not sequence_parallel:
        calls = (2 * 2 + TP_ALL_REDUCES_RECOMPUTED[checkpointing]) * layers + TP_ROOT_CALLS
        what = "tensor-parallel all-reduce of activations (no sequence parallel)"
        return [
            Collective(what, "all-reduce", element * calls * held, calls, None, layout.tp_group, per_micro_step=True)
        ]
    fused = fused_collectives(shape.dims, layout.tp, checkpointing) if async_tp else []
    sublayers = tensor_parallel_sublayers(shape, layout)
    mla = shape.dims.mla
    out = []
    for kind in ("all-gather", "reduce-scatter"):
        passes = 2 + TP_RECOMPUTED[checkpointing][kind] + (1 if megatron and kind == "all-gather" else 0)
        blocks = sublayers * passes  # Megatron's third gather: the saved shards again for the weight gradients
        widths = float(blocks)  # in H-wide passes
        if mla is not None:  # latent attention gathers its latents, not H, into its up-projections
            inputs = passes - 1 if kind == "all-gather" else 1  # the passes on the input's side
            widths -= layers * inputs * (1 - tp_gathered_width(mla) / shape.dims.width)
        block_bytes = 1 if fp8 and kind == "all-gather" else held
        payload = element * (widths * block_bytes + TP_ROOT_CALLS * held)
        mine = [f for f in fused if f.kind == kind]
        pipelined = element * layers * sum(f.element_bytes(held, fp8) for f in mine)
        calls = layers * len(mine)
        what = f"tensor-parallel {kind} of activations"
        if mine:
            how = "userbuffers' tp_comm_overlap" if megatron else "async TP"
            out.append(
                Collective(
                    f"{what}, pipelined with its matmuls ({how})",
                    kind,
                    pipelined,
                    calls,
                    PIPELINED,
                    layout.tp_group,
                    per_micro_step=True,
                )
            )
        rest, rest_bytes = blocks + TP_ROOT_CALLS - calls, payload - pipelined
        if rest > 0 and megatron and async_tp:  # userbuffers' bulk overlaps; the head's and the embedding's exposed
            root = TP_ROOT_CALLS * element * held
            bulk = f"{what}, beside the backward's GEMMs (userbuffers' bulk overlap)"
            out.append(
                Collective(
                    bulk,
                    kind,
                    rest_bytes - root,
                    rest - TP_ROOT_CALLS,
                    "backward",
                    layout.tp_group,
                    per_micro_step=True,
                )
            )
            rest, rest_bytes = TP_ROOT_CALLS, root
        if rest > 0:
            out.append(Collective(what, kind, rest_bytes, rest, None, layout.tp_group, per_micro_step=True))
    return out


@dataclass(frozen=True)
class SharedCards(Collective):
    """The wait tensor parallelism wider than a node adds where the data-parallel collectives of the
    same micro-step cross the network on the same cards. A group of whole nodes drives every card
    of its nodes (NCCL's rings over the rails), and each of its GPUs' data-parallel ring runs over
    that GPU's own card: two communicators on one card share its rate while both have work on it
    (NCCL's network proxy posts each one's sends as they come, and the card serves its queues in
    turn). A collective hidden behind the compute issues its buckets as they are ready and runs
    while the compute does, so while both run each gets half the card: the critical-path tensor-
    parallel collectives take longer by the data-parallel traffic that shares the card with them,
    at most by their own time (all of theirs shared) and at most by the data-parallel time (all of
    it beside theirs). No bytes and no calls of its own: those are the collectives named."""

    tensor_parallel: tuple[Collective, ...] = ()
    data_parallel: tuple[Collective, ...] = ()
    before: tuple[Collective, ...] = ()  # data-parallel collectives already sharing it (every micro-step's)

    def wire_bytes(self) -> float:
        return 0.0

    def seconds(self, topology: Topology, host_bytes_per_s: float, tail: bool = False) -> float:
        if tail:
            return 0.0
        exposed = sum(c.seconds(topology, host_bytes_per_s) for c in self.tensor_parallel)
        taken = sum(c.seconds(topology, host_bytes_per_s) for c in self.before)
        beside = sum(c.seconds(topology, host_bytes_per_s) for c in self.data_parallel)
        return min(beside, max(0.0, exposed - taken))


def shared_cards(collectives: list[Collective]) -> list[Collective]:
    """SharedCards for a step's whole list of collectives (the recipe's and the experts' among them)
    where its tensor-parallel group spans nodes: one for the data-parallel collectives every
    micro-step runs beside its compute (FSDP's gathers and reductions), one for those only the last
    micro-step runs (a replica's gradient reduction), which share the rest of the tensor-parallel
    time. Nothing where the group stays inside a node: its collectives run on NVLink, the
    data-parallel ones on the cards."""
    tensor = tuple(
        c
        for c in collectives
        if c.what.startswith("tensor-parallel") and c.window is None and c.group.nodes > 1 and c.group.size > 1
    )
    if not tensor:
        return []
    beside = [
        c
        for c in collectives
        if c.window in ("forward", "backward")
        and c.group.nodes > 1
        and c.kind not in HOST_KINDS
        and not c.what.startswith("tensor-parallel")
    ]
    every = tuple(c for c in beside if c.per_micro_step)
    last = tuple(c for c in beside if not c.per_micro_step)
    group = tensor[0].group
    what = "tensor-parallel collectives slowed by the data-parallel traffic sharing their nodes' cards"
    out: list[Collective] = []
    if every:
        out.append(
            SharedCards(
                what,
                "all-reduce",
                0.0,
                0,
                None,
                group,
                per_micro_step=True,
                tensor_parallel=tensor,
                data_parallel=every,
            )
        )
    if last:
        out.append(
            SharedCards(
                f"{what} (the last micro-step's)",
                "all-reduce",
                0.0,
                0,
                None,
                group,
                tensor_parallel=tensor,
                data_parallel=last,
                before=every,
            )
        )
    return out


def tensor_parallel_sublayers(shape: ModelShape, layout: Layout) -> int:
    """The sub-layers whose input tensor parallelism gathers and whose output it scatters: every
    block's attention and MLP, but a mixture of experts' MoE block whose experts it does not split
    (etp 1, Megatron-core's parallel folding) and which has no shared expert: its tokens reach the
    experts by the all-to-all (expert_comm.py)."""
    assert shape.dims is not None
    moe = shape.dims.moe
    if moe is None or layout.experts.etp > 1 or moe.shared_ffn:
        return 2 * shape.dims.layers
    return 2 * shape.dims.layers - moe.moe_layers


def tensor_parallel_across_nodes(collectives: list[Collective]) -> str | None:
    """Why tensor parallelism wider than a node costs what it does: its per-layer collectives cross
    the network with nothing to hide them; None where its group stays inside a node."""
    crossing = next((c for c in collectives if c.what.startswith("tensor-parallel") and c.group.nodes > 1), None)
    if crossing is None:
        return None
    shared = (
        " and share their nodes' cards with the data-parallel collectives"
        if any(isinstance(c, SharedCards) for c in collectives)
        else ""
    )
    return (
        f"tensor parallelism over {crossing.group.size} GPUs spans {crossing.group.nodes} nodes: the all-gathers and "
        f"reduce-scatters of every block's activations cross the network, in the block's critical path{shared}"
    )


def _data_parallel_threads(shape: ModelShape, precision: str, gpus: int, tokens: int, group: Group) -> list[Collective]:
    """torch.nn.DataParallel: the model copied out of GPU 0 every step, the replicas' outputs
    (the logits) gathered onto it, their gradients summed onto it; nothing overlaps."""
    if gpus <= 1:
        return []
    vocab = shape.dims.vocab if shape.dims else 0
    outputs = (gpus - 1) * tokens * vocab * compute_bytes(precision)
    return [
        Collective(
            "broadcast the model from GPU 0", "broadcast", shape.params * 4, 1, None, group, per_micro_step=True
        ),
        Collective("gather the replicas' logits onto GPU 0", "gather", outputs, 1, None, group, per_micro_step=True),
        Collective("reduce the gradients onto GPU 0", "reduce", shape.params * 4, 1, None, group, per_micro_step=True),
    ]


def _distributed_optimizer(
    backend: Backend, params: float, grad_bytes: float, gather_bytes: float, calls: int, largest: float, group: Group
) -> list[Collective]:
    """Megatron's distributed optimizer (ZeRO-1, docs/source/distrib_optimizer.md of Megatron-LM): the
    gradients reduce-scattered in buckets as the backward produces them, each rank steps its
    shard, and the updated parameters are all-gathered in the model's dtype before the next
    forward, where its param-gather overlap hides them behind the forward; with either overlap
    off (overlap_grad_reduce, overlap_param_gather false) that collective runs after the backward,
    or before the forward, with nothing beside it."""
    reduce_window = None if backend.options.get("overlap_grad_reduce") is False else "backward"
    gather_window = None if backend.options.get("overlap_param_gather") is False else "forward"
    return [
        Collective(
            "reduce-scatter gradients",
            "reduce-scatter",
            params * grad_bytes,
            calls,
            reduce_window,
            group,
            tail_bytes=largest * grad_bytes,
        ),
        Collective("all-gather updated parameters", "all-gather", params * gather_bytes, calls, gather_window, group),
    ]


def _nanotron_zero1(params: float, tensors: int, gather_bytes: float, group: Group) -> list[Collective]:
    """nanotron's ZeRO-1 with its fp32 gradient accumulation, as the Ultra-Scale Playbook's branch
    runs it (huggingface/nanotron nouamane/bench2 @ 67c5ebb6, the same at e24d2483): no DDP wraps the
    model (trainer.py init_model: `make_ddp` is false under `accumulate_grad_in_fp32` with a ZeRO
    stage), so after the last micro-step's backward `sync_gradients_across_dp` all-reduces the whole
    contiguous fp32 gradient buffer in one call (gradient_accumulator.py: `reduce_scatter=False`,
    `dist.all_reduce(self._contiguous_fp32_grad_buffer)`), nothing beside it; the optimizer steps each
    rank's slice of every parameter and `_all_gather_params` (optim/zero.py) gathers them in one list
    all-gather inside its step (distributed.py `all_gather_coalesced`: every rank's slices flattened,
    gathered, then copied back into each parameter's slice for each rank from Python): one copy a
    parameter tensor and rank, issued by the host with nothing beside it (speed/list_collectives.py
    prices them)."""
    return [
        Collective(
            "all-reduce the fp32 gradients after the backward (nanotron's ZeRO-1)",
            "all-reduce",
            params * BYTES["fp32"],
            1,
            None,
            group,
        ),
        Collective(
            "all-gather updated parameters, copied back tensor by tensor (nanotron's ZeRO-1)",
            "all-gather",
            params * gather_bytes,
            1,
            None,
            group,
            host_copies=tensors * group.size,
        ),
    ]


# A plan option of DeepSpeed's ZeRO-3: as 0.3.12 to 0.5.x ran it, each parameter's gather and each
# gradient's reduce-scatter a list collective of its own (speed/list_collectives.py prices their host).
ZERO3_LIST_COLLECTIVES = "zero3_list_collectives"


def ranks_holding(numel: int, ranks: int) -> int:
    """The ranks whose ZeRO-3 slice of a tensor holds any of it: each holds ceil(numel / ranks)
    elements, and those past its end hold padding only."""
    return min(ranks, math.ceil(numel / math.ceil(numel / ranks)))


def _persistent_regather(shape: ModelShape, backend: Backend, gather_bytes: float, group: Group) -> list[Collective]:
    """DeepSpeed's ZeRO-3 of 2021 partitions every parameter as its backward ends, the persistent ones
    (under stage3_param_persistence_threshold) too (stage3.py's `backward` ends in
    `_partition_all_parameters()`), and gathers those back after the optimizer's step (`_post_step`).
    That gather (partition_parameters.py's `_allgather_params`, 0.3.12 to 0.5.4) is one list all-gather
    of their concatenated shards, then a Python loop over each tensor and each rank whose slice holds
    any of it, copying that slice into the tensor: `host_copies` such copies, nothing beside them."""
    if shape.tensors is None or group.size <= 1:
        return []
    threshold = backend.option("stage3_param_persistence_threshold")
    kept = [t.numel for t in shape.tensors if t.numel < threshold]
    if not kept:
        return []
    copies = sum(ranks_holding(n, group.size) for n in kept)
    return [
        Collective(
            "all-gather persistent parameters after the step, copied out tensor by tensor and rank by rank",
            "all-gather",
            sum(kept) * gather_bytes,
            1,
            None,
            group,
            host_copies=copies,
        )
    ]


# A plan option: InternEvo's HybridZeroOptimizer (InternLM/InternEvo
# internlm/solver/optimizer/hybrid_zero_optim.py @ c18bec93) reduces and shares the gradients and
# parameters of a Megatron-style layout: `_hybrid_zero` says how.
HYBRID_ZERO = "hybrid_zero"
HYBRID_ZERO_BUCKET = 512 * 1024 * 1024  # elements: configs/7B_sft.py's reduce_bucket_size at the same commit


def _hybrid_zero(params: float, grad_bytes: float, gather_bytes: float, layout: Layout) -> list[Collective]:
    """InternEvo's HybridZeroOptimizer: on the last micro-step (its scheduler sets skip_grad_reduce on
    the others) each parameter's gradient hook fills a bucket of HYBRID_ZERO_BUCKET elements, and a
    full bucket is all-reduced, not reduce-scattered, over every data-parallel rank
    (`reduce_tensor` with no dst_rank: dist.all_reduce over ParallelMode.DATA) on a side stream
    beside the backward, after a `torch.cuda.synchronize()` that lets no bucket start before the last
    has finished (`_reduce_and_copy`); the last bucket after the backward. After the step each rank
    of the ZeRO group (zero1: a node's GPUs, or every data-parallel rank) broadcasts its flat
    partition of the updated parameters, one broadcast per rank, all waited on before the next
    forward (`broadcast_params(overlap=False)`): the group's size in calls, each paying the ring's
    latency over the group."""
    data_parallel = Group(
        layout.shard_group.size * layout.replica_group.size, layout.shard_group.nodes * layout.replica_group.nodes
    )
    payload = params * grad_bytes
    bucket = min(params, HYBRID_ZERO_BUCKET)
    return [
        Collective(
            "all-reduce gradients in 512M-element buckets (HybridZeroOptimizer)",
            "all-reduce",
            payload,
            max(1, math.ceil(params / HYBRID_ZERO_BUCKET)),
            "backward",
            data_parallel,
            tail_bytes=bucket * grad_bytes,
        ),
        Collective(
            "broadcast each ZeRO rank's updated parameters (HybridZeroOptimizer)",
            "broadcast",
            params * gather_bytes,
            layout.shard,
            None,
            layout.shard_group,
        ),
    ]


def collectives(
    shape: ModelShape,
    backend: Backend,
    layout: Layout,
    precision: str,
    gpus: int,
    tokens: int,
    world: Group,
    checkpointing: str = "none",
    fp8: bool = False,
    async_tp: bool = False,
) -> list[Collective]:
    """What one optimizer step of `backend` communicates, per GPU; `tokens` per micro-step; `fp8`:
    the blocks' projections run in fp8 (precision is then what everything else is held in);
    `async_tp`: tensor parallelism's collectives pipelined with their matmuls where they can be."""
    params = shape.params / layout.tp
    blocks = shape.block_params() or [shape.params]
    largest_block = max(blocks) / layout.tp
    calls = len(blocks) + 1  # one per FSDP/ZeRO-3 unit: every block and the root
    tensors = len(shape.tensors) if shape.tensors else calls  # a unit's tensors as one where none are listed
    grad_bytes, gather_bytes = _grad_reduce_bytes(backend, precision), _gather_bytes(backend, precision)
    shards = layout.shard_group
    out: list[Collective] = []
    hybrid_zero = bool(backend.options.get(HYBRID_ZERO))
    if backend.replicas == "threads":
        out += _data_parallel_threads(shape, precision, gpus, tokens, world)
    elif layout.data_parallel > 1 and hybrid_zero:
        out += _hybrid_zero(params, grad_bytes, gather_bytes, layout)
    elif (
        layout.data_parallel > 1
        and backend.options.get(NANOTRON_ENGINE)
        and backend.options.get("distributed_optimizer")
    ):
        out += _nanotron_zero1(params, tensors, gather_bytes, shards)
    elif layout.data_parallel > 1 and backend.engine == "torch" and backend.options.get("distributed_optimizer"):
        out += _distributed_optimizer(backend, params, grad_bytes, gather_bytes, calls, largest_block, shards)
    elif layout.data_parallel > 1 and backend.engine == "torch" and backend.stage in (0, 1):
        payload = params * grad_bytes
        window: str | None = "backward"
        if backend.options.get("overlap_grad_reduce") is False:
            # Megatron's DDP without overlap: its whole gradient buffer, one all-reduce after the backward.
            reduces, tail, window = 1, payload, None
        elif backend.fsdp2_units:  # replicate: each unit's gradients as its backward ends
            reduces, tail = calls, largest_block * grad_bytes
        else:  # DDP's buckets
            bucket = int(backend.option("bucket_cap_mb") * 2**20)
            reduces, tail = max(1, math.ceil(payload / bucket)), min(bucket, payload)
        # replicate reduces on every micro-step where its strategy says so (sync_each_micro_step), DDP on the last.
        every = backend.fsdp2_units and bool(backend.options.get("sync_each_micro_step"))
        out.append(
            Collective(
                "all-reduce gradients",
                "all-reduce",
                payload,
                reduces,
                window,
                shards,
                tail_bytes=tail,
                per_micro_step=every,
            )
        )
        if backend.stage == 1:
            # torch's ZeRO-1 (ZeroRedundancyOptimizer): each rank broadcasts the fp32 parameters it
            # stepped, one tensor at a time, after the step.
            out.append(Collective("broadcast updated parameters", "broadcast", params * 4, tensors, None, shards))
    elif layout.shard > 1 and backend.stage in (1, 2) and backend.engine == "deepspeed":
        reduce_payload = params * grad_bytes
        reduce_calls = max(1, math.ceil(params / backend.option("reduce_bucket_size")))
        # DeepSpeed's PipelineEngine reduces after the last micro-batch, beside nothing (it turns
        # enable_backward_allreduce off: parallel/deepspeed_pipeline.py).
        window = "backward" if backend.option("overlap_comm") and not backend.pipeline_engine else None
        # ZeRO-2 keeps only its gradient partition, so it must reduce on every micro-step. Each
        # bucket is all-reduced and every rank keeps its partition of the result (stage_1_and_2.py's
        # average_tensor under use_multi_rank_bucket_allreduce, on by default): an all-reduce's
        # bytes on the wire, twice a reduce-scatter's.
        out.append(
            Collective(
                "all-reduce gradients, each rank keeping its partition",
                "all-reduce",
                reduce_payload,
                reduce_calls,
                window,
                shards,
                tail_bytes=min(reduce_payload, int(backend.option("reduce_bucket_size")) * grad_bytes),
                per_micro_step=backend.stage == 2,
            )
        )
        gather_calls = max(1, math.ceil(params / backend.option("allgather_bucket_size")))
        out.append(
            Collective("all-gather updated parameters", "all-gather", params * gather_bytes, gather_calls, None, shards)
        )
    elif layout.shard > 1 and backend.stage == 3:
        gathered = (shape.params - _kept_whole(shape, backend)) / layout.tp
        passes = [("forward", shards, largest_block * gather_bytes)]
        if backend.reshard_after_forward:
            passes.append(("backward", layout.hpz_group if layout.hpz > 1 else shards, 0.0))
        fetches = _deepspeed_fetches(shape, backend, layout.tp, checkpointing)
        for window, group, tail in passes:
            what = f"all-gather parameters ({window})" + (
                ", from hpZ's copy in the node" if window == "backward" and layout.hpz > 1 else ""
            )
            gather_calls, waited = (calls, 0.0) if fetches is None else fetches.of(window)
            again = 0.0 if fetches is None else fetches.regathered(window)
            if again:
                what += ", each recomputed module's again where stage3_max_reuse_distance lets it go"
            out.append(
                Collective(
                    what,
                    "all-gather",
                    (gathered + again - waited) * gather_bytes,
                    gather_calls,
                    window,
                    group,
                    tail_bytes=tail,
                    per_micro_step=True,
                )
            )
            if waited:
                out.append(
                    Collective(
                        f"{what}, not prefetched: the module before holds stage3_max_live_parameters",
                        "all-gather",
                        waited * gather_bytes,
                        fetches.unprefetched(window),
                        None,
                        group,
                        per_micro_step=True,
                    )
                )
        reduces, tail = calls, largest_block * grad_bytes
        reduce_what, reduce_window = "reduce-scatter gradients", "backward"
        if fetches is not None:  # DeepSpeed reduce-scatters its gradient bucket each time it fills
            bucket = backend.option("reduce_bucket_size")
            reduces, tail = max(1, math.ceil(params / bucket)), min(bucket, params) * grad_bytes
            if backend.options.get(ZERO3_LIST_COLLECTIVES):
                # A reduce-scatter a parameter, issued from its gradient's hook, which autograd runs
                # before the next module's pre-backward hook (AccumulateGrad first); that hook's fetch
                # then drains the GPU (torch.cuda.synchronize), so no compute runs beside it.
                reduces, reduce_window = len(shape.tensors or ()), None
                reduce_what += ", each waited on by the next module's fetch"
        out.append(
            Collective(
                reduce_what,
                "reduce-scatter",
                params * grad_bytes,
                reduces,
                reduce_window,
                shards,
                tail_bytes=tail,
                per_micro_step=backend.sharded_grads_every_micro_step,
            )
        )
        if backend.options.get(ZERO3_LIST_COLLECTIVES):
            out += _persistent_regather(shape, backend, gather_bytes, shards)
    if layout.replicas > 1 and backend.stage > 0 and backend.replicas != "threads" and not hybrid_zero:
        shard_grads = params / layout.shard * grad_bytes
        out.append(
            Collective(
                "all-reduce gradient shards across replicas",
                "all-reduce",
                shard_grads,
                calls if backend.stage == 3 else 1,
                "backward",
                layout.replica_group,
                tail_bytes=largest_block / layout.shard * grad_bytes,
                per_micro_step=backend.stage == 3 and backend.sharded_grads_every_micro_step,
            )
        )
    megatron = bool(backend.options.get(MEGATRON_ENGINE))
    out += _tensor_parallel(
        shape, layout, tokens, precision, checkpointing, fp8, async_tp, megatron, backend.sequence_parallel
    )
    out += _offload_copies(shape, backend, precision, layout.shard)
    return out


def _offload_copies(shape: ModelShape, backend: Backend, precision: str, shards: int) -> list[Collective]:
    """Host <-> GPU traffic of offload: gradients down, updated parameters up, ZeRO-3 shards per gather."""
    shard = math.ceil(shape.params / shards)
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


def local_copy_bytes(
    shape: ModelShape,
    backend: Backend,
    layout: Layout,
    precision: str,
    tokens: int,
    checkpointing: str,
    fp8: bool = False,
    async_tp: bool = False,
) -> float:
    """Bytes a micro-step moves through the GPU's memory around its collectives, besides the wire:
    FSDP and ZeRO-3 copy each gathered unit out of the all-gather buffer into the parameters (read
    and write, forward and again in a resharded backward; replicate, a unit's copy of one rank) and
    the gradients into the reduction's input (read in the compute dtype, written in the reduction's);
    ZeRO-1/2 copy the gradients into their bucket. Tensor parallelism gathers and scatters
    activations along the sequence, not the first dimension NCCL works on, so each of its
    collectives copies the whole activation once more (DTensor's redistribution between Shard(1)
    and Replicate); async TP's fused ops take and give the sequence's shards as they are (their
    own copies are async_tp_cost.py's), and without sequence parallelism the all-reduces work on
    the whole activation as it lies. Megatron-LM's engine (MEGATRON_ENGINE, a published run's
    layout) copies none of these: its bf16 parameters are the ones the kernels read, its
    weight-gradient GEMMs accumulate into the contiguous buffer the reduction runs on
    (`gradient_accumulation_fusion`, on by default), and its activations are sequence-first
    ([s, b, h]), the dimension its gathers and scatters work on; TransformerEngine's userbuffers
    under tp_comm_overlap gather into and scatter out of the buffers its GEMMs read and write."""
    if backend.options.get(MEGATRON_ENGINE):
        return 0.0
    params = shape.params / layout.tp
    gather = 2 * compute_bytes(precision)
    reduce = compute_bytes(precision) + _grad_reduce_bytes(backend, precision)
    moved = 0.0
    if (backend.stage == 3 or backend.fsdp2_units) and backend.replicas != "threads":
        gathers = 2 if backend.reshard_after_forward else 1
        moved += params * (gathers * gather + reduce)
    elif backend.stage in (1, 2) and backend.engine == "deepspeed":
        moved += params * reduce
    for c in _tensor_parallel(
        shape, layout, tokens, precision, checkpointing, fp8, async_tp, sequence_parallel=backend.sequence_parallel
    ):
        if c.window != PIPELINED and c.kind != "all-reduce":
            moved += 2 * c.payload_bytes  # read and written once more
    return moved
