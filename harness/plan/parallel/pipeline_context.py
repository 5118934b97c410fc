"""The plan of a layout that splits the model over pipeline stages or its sequences over
context-parallel GPUs (`pp_size=`, `cp_size=` on fsdp and fsdp-tp): the fullest stage is timed
as a model of its own on its share of the GPUs (pipeline_cost.py), at seq_len / cp_size, with the
pipeline's micro-batches as its micro-steps, then the schedule's bubble, the traffic between stages
and context parallel's attention (its work and its all-to-all or ring traffic,
context_parallel_cost.py) are added. Its memory is each GPU's own (the first, the fullest between,
the last: its blocks, its tables, the micro-batches it holds in flight), the peak the largest.

`published_options` reads a published run's layout (torchtitan's `FSDP2 dp_shard=8 tp=8 pp=8
schedule=1F1B`) as these options, for bench/plan_vs_published.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from harness.plan.memory.activations import Activations
from harness.plan.memory.buffers import Buffers
from harness.plan.memory.capacity import headroom
from harness.plan.memory.model_states import BYTES
from harness.plan.model.model_shape import TransformerDims
from harness.plan.network.comm import TP_ROOT_CALLS, Collective
from harness.plan.network.fabric import Group, Topology, collective_seconds
from harness.plan.parallel.async_tp_cost import MEGATRON_ENGINE, TP_COMM_OVERLAP
from harness.plan.parallel.backends import Backend, model_of
from harness.plan.parallel.context_parallel_cost import (
    ULYSSES_EXCHANGES,
    ContextParallel,
    context_parallel_of,
    exchange_bytes,
    extra_attention_s,
    ring_gradient_bytes,
    ring_pass_bytes,
)
from harness.plan.parallel.deepspeed_pipeline import (
    DEEPSPEED_PIPELINE,
    GATHERS_PER_MICRO_BATCH,
    runs_deepspeed_pipeline,
    transfers_per_micro_batch,
)
from harness.plan.parallel.layout import Layout, LayoutError, layout_of
from harness.plan.parallel.nanotron_split import nanotron_split
from harness.plan.parallel.pipeline_cost import (
    DEEPSPEED_RUNTIME,
    EMBEDDING_IN_SPLIT,
    FIRST_STAGE_BLOCKS,
    LAST_STAGE_BLOCKS,
    LOSS_IN_SPLIT,
    MEGATRON_SPLIT_OPTIONS,
    TORCH_RUNTIME,
    Pipeline,
    StageSplit,
    boundary_bytes,
    idle_words,
    micro_batches,
    pipeline_of,
    stage_shape,
    stage_split,
    tied_head,
)
from harness.plan.parallel.planned_options import check_what_ifs_apply
from harness.plan.parallel.stage_comm import block_recurring_s, root_recurring_s
from harness.plan.predict import (
    Question,
    StrategyPlan,
    communicators,
    held_memory,
    on_host_bytes,
    plan_backend,
    plan_fits,
    prepared,
    storage_precision,
)
from harness.plan.speed.gemm import gemm_seconds
from harness.plan.speed.nanotron_step import NANOTRON_ENGINE
from harness.plan.speed.step_time import StepTime, host_bytes_per_s
from strategies.memory import CATEGORIES, MemoryBreakdown
from strategies.plan_model import PlanModel

# The options that make a layout pipelined or context parallel; the stage's own plan runs without them.
SPLIT_OPTIONS = (
    "pp_size",
    "microbatches",
    "schedule",
    "virtual_stages",
    "cp_size",
    "cp_attention",
    *MEGATRON_SPLIT_OPTIONS,
)
NO_PIPELINE = Pipeline(1, 1, "1f1b")
# torchtitan's schedule names (its --parallelism.pipeline_parallel_schedule) as the planner's.
TORCHTITAN_SCHEDULES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved-1f1b",
    "interleaved 1f1b": "interleaved-1f1b",
    "zbvzerobubble": "zero-bubble",
    "interleavedzerobubble": "zero-bubble",
}


def stage_topology(topology: Topology, pp: int) -> Topology:
    """The GPUs of one stage: stages are the outermost mesh dimension, so a stage is whole nodes
    where it has a node's GPUs or more, else part of one node."""
    gpus = topology.gpus // pp
    return replace(topology, gpus=gpus, nodes=max(1, -(-gpus // topology.per_node)))


def _cp_group(topology: Topology, cp: int, tp: int) -> Group:
    """Context parallel's GPUs: next to the tensor-parallel ones, inside the NVLink domain (a node,
    or a GB200 NVL72 rack) while the blocks of tp x cp tile one (Topology.block: cp 16 of 72 straddles)."""
    return topology.block(cp, tp)


def runtime_of(backend: Backend) -> str | None:
    """Whose pipeline `backend` runs where it is one of parabench's strategies (pipeline_of's
    `runtime`); None for a published run's engine."""
    if model_of(backend.name) is None:
        return None
    return DEEPSPEED_RUNTIME if runs_deepspeed_pipeline(backend) else TORCH_RUNTIME


def plan_split_model(backend: Backend, q: Question, layout: Layout) -> StrategyPlan:
    """The plan of `backend` with `layout`'s pipeline stages and context-parallel GPUs; q's micro-batch
    and accumulation are already those of each data-parallel rank."""
    dims = q.shape.dims
    if dims is None:
        raise LayoutError(f"{backend.name}: pipeline and context parallelism need a transformer the planner knows")
    pipe = pipeline_of(backend.options, q.micro_batch, layout.pp, runtime_of(backend)) if layout.pp > 1 else NO_PIPELINE
    # torch's context parallel gathers k and v by default; Megatron-LM's TransformerEngine passes them.
    rotate = "passes" if backend.context_parallel_engine else "all-gather"
    torch_ring = not backend.context_parallel_engine
    cp = context_parallel_of(backend.options, dims, q.seq_len, layout.tp, layout.cp, rotate, torch_ring)
    # parabench's strategies cut the blocks as its runtime does; a published Megatron run as it names,
    # a published Megatron-DeepSpeed one as DeepSpeed's PipelineModule balances its GPTModelPipe.
    runtime_cut = model_of(backend.name) is not None and not backend.pipeline_engine
    deepspeed_cut = bool(backend.options.get(DEEPSPEED_PIPELINE))
    split = _split(dims, pipe, backend, runtime_cut, deepspeed_cut) if layout.pp > 1 else None
    shape = stage_shape(q.shape, split.fullest) if split is not None else q.shape
    # The stage is laid out with the whole layout's tensor-parallel and sharding sizes, unsplit.
    sizes = {"pp_size": 1, "cp_size": 1, "tp_size": layout.tp}
    if backend.hybrid_shard:
        sizes["shard_size"] = layout.shard
    options = {k: v for k, v in backend.options.items() if k not in SPLIT_OPTIONS} | sizes
    inner = replace(backend, options=options)
    if layout.pp > 1:
        # torchtitan under a pipeline: parameters stay gathered across the schedule's micro-batches,
        # gradients reduced once, after the last.
        inner = replace(inner, reshard_after_forward=False, options={**options, "sync_each_micro_step": False})
    stage_q = replace(
        q,
        shape=shape,
        topology=stage_topology(q.topology, layout.pp),
        seq_len=q.seq_len // cp.size,
        micro_batch=q.micro_batch // pipe.microbatches,
        grad_accum=q.grad_accum * pipe.microbatches,
        global_batch=None,
        split_global_batch=False,
        nearest_split=False,
    )
    if split is not None and not q.timed:
        # The memory alone of a split model: each GPU's as _fullest_gpu plans it, the stage's own not needed.
        stage_layout = layout_of(inner, stage_q.shape, stage_q.topology)
        check_what_ifs_apply(inner, stage_layout)
        stage_time, stage_collectives = None, []
    else:
        stage = plan_backend(inner, stage_q)
        stage_layout, stage_time, stage_collectives = stage.layout, stage.time, stage.collectives
        states, held, buffers, peak = stage.states, stage.activations, stage.buffers, stage.peak_bytes
    if split is not None:
        states, held, buffers, peak = _fullest_gpu(inner, replace(stage_q, shape=q.shape), stage_layout, pipe, split)
    elif held is not None and peak is not None:  # context parallel alone
        extra = int((pipe.in_flight - 1) * held.blocks)
        held, peak = replace(held, blocks=held.blocks + extra), peak + extra
    rings = communicators(stage_layout, stage_q.gpus) + (layout.pp > 1) + (cp.size > 1)
    room = headroom(q.capacity_bytes, rings, q.topology.library)
    fits = plan_fits(room, peak, q.host, on_host_bytes(states, held))
    parts = None if stage_time is None else _head_and_block(stage_time, q, stage_q, layout)
    timed = stage_time is not None
    context = _context_traffic(q, stage_q, layout, cp, timed) if q.timed else []
    block_comm = (
        None if stage_time is None else _block_comm(stage_time, stage_collectives, q, stage_q, layout, cp, context)
    )
    seconds = _stage_seconds(parts, q, split, block_comm)
    between = _pipeline_traffic(q, stage_q, layout, pipe, backend, timed, seconds) if q.timed else []
    timing = None
    if stage_time is not None:
        timing = _time(stage_time, q, stage_q, layout, pipe, split, cp, between, context, parts, block_comm)
    traffic = between + context
    return StrategyPlan(
        backend.name,
        backend,
        replace(layout, hpz_group=stage_layout.hpz_group, shard_group=stage_layout.shard_group),
        states,
        held,
        buffers,
        peak,
        room,
        fits,
        stage_collectives + [c for c, _, _ in traffic],
        timing,
        q.micro_batch,
        q.grad_accum,
        q.host,
    )


def _split(
    dims: TransformerDims, pipe: Pipeline, backend: Backend, runtime_cut: bool, deepspeed_cut: bool
) -> StageSplit:
    """The blocks on each GPU (stage_split); a published nanotron run's as nanotron balances them."""
    if backend.options.get(NANOTRON_ENGINE):
        if pipe.virtual > 1:
            raise LayoutError("nanotron's pipeline engine runs one stage a GPU: no virtual stages")
        return nanotron_split(dims, pipe.stages)
    return stage_split(dims.layers, pipe, backend.options, runtime_cut, deepspeed_cut)


def _fullest_gpu(
    backend: Backend, stage_q: Question, layout: Layout, pipe: Pipeline, split: StageSplit
) -> tuple[MemoryBreakdown, Activations, Buffers, int | None]:
    """Each GPU of the pipeline planned as Megatron-LM's and torch's schedules hold it: the first
    (its blocks and the embedding, the most micro-batches in flight), the fullest between (its
    blocks, the second rank's micro-batches) and the last (its blocks, the final norm, the head and
    the loss, the fewest micro-batches; Pipeline.in_flight_at). Returns the model states of the GPU
    that holds the most (what a breakdown over ranks shows at its largest), and the activations
    (those in flight with them), buffers and peak of the GPU whose peak is highest, the peak the
    plan's. `stage_q` is a stage's question with the whole model's shape."""
    ranks = {"first": (split.first, 0), "last": (split.last, pipe.stages - 1)}
    if pipe.stages > 2 and split.middle > 0:
        ranks["middle"] = (split.middle, 1)
    held: list[tuple[MemoryBreakdown, Activations, Buffers, int | None]] = []
    for position, (blocks, rank) in ranks.items():
        held_by, q = prepared(backend, replace(stage_q, shape=stage_shape(stage_q.shape, blocks, position)))
        states, memory = held_memory(held_by, q, layout, head=position == "last")
        acts = memory.activations
        assert acts is not None
        extra = int((pipe.in_flight_at(rank) - 1) * acts.blocks)
        peak = None if memory.peak is None else memory.peak + extra
        held.append((states, replace(acts, blocks=acts.blocks + extra), memory.buffers, peak))
    most = max(held, key=lambda h: sum(sum(getattr(h[0], c).values()) for c in CATEGORIES))
    highest = max(held, key=lambda h: h[3] or 0)
    return most[0], highest[1], highest[2], highest[3]


def _pipeline_traffic(
    q: Question,
    stage_q: Question,
    layout: Layout,
    pipe: Pipeline,
    backend: Backend,
    timed: bool,
    stage_seconds: tuple[float, float, float] | None = None,
) -> list[tuple[Collective, float, float]]:
    """The pipeline's transfers of one step, each with its seconds per step and, of those, what every
    micro-batch runs (0 where the plan is not timed: a question without a GPU's links, as a CPU
    run's is); `stage_seconds` a micro-batch's length on the first GPU, those between and the last
    (`_stage_seconds`), where the split is known. A micro-batch's exchanges with its neighbours (and
    DeepSpeed's gathers of them) are one per micro-batch, whatever a stage's blocks."""
    assert stage_q.shape.dims is not None
    dims = stage_q.shape.dims
    element = BYTES[storage_precision(q.precision)]
    micro_steps = stage_q.grad_accum
    out: list[tuple[Collective, float, float]] = []
    if layout.pp > 1:
        across = stage_q.topology.gpus >= q.topology.per_domain
        sent = boundary_bytes(stage_q.micro_batch, stage_q.seq_len, dims.width, layout.tp, element)
        group = Group(2, 2 if across else 1)
        deepspeed = runs_deepspeed_pipeline(backend)
        per_micro = transfers_per_micro_batch(layout.pp) if deepspeed else 2
        payload = per_micro * sent * micro_steps  # activations forward, their gradients back
        one = collective_seconds(q.topology, group, "broadcast", sent) if timed else 0.0
        # The fill and the drain cross every boundary one after another; in the steady state a
        # schedule that waits on each exchange before its next micro-batch (steady_state_exposed)
        # adds the slowest GPU's exchanges to every micro-batch (Pipeline.steady_exchange_wait;
        # DeepSpeed's engine two each way, one after the other, where a GPU sits between two others:
        # deepspeed_pipeline.py), the others hide them.
        critical = 2 * pipe.boundaries * one * q.grad_accum
        if not pipe.steady_state_exposed:
            steady = 0.0
        elif deepspeed:
            steady = per_micro * one * micro_steps
        else:
            steady = pipe.steady_exchange_wait(stage_seconds, one) * micro_steps
        how = "each micro-batch waits on them" if pipe.steady_state_exposed else "hidden but the fill and drain"
        what = f"send activations and gradients between pipeline stages ({'network' if across else 'NVLink'}; {how})"
        sends = Collective(
            what, "broadcast", payload, per_micro * micro_steps, "backward", group, per_micro_step=bool(steady)
        )
        out.append((sends, critical + steady, steady))
        if deepspeed and layout.tp > 1:
            out.append(_partition_gathers(q, stage_q, layout, element, timed))
        tied = _tied_embedding_reduce(q, layout, across, timed)
        if tied is not None:
            out.append(tied)
    return out


def _context_traffic(
    q: Question, stage_q: Question, layout: Layout, cp: ContextParallel, timed: bool
) -> list[tuple[Collective, float, float]]:
    """Context parallel's transfers of one step, as `_pipeline_traffic`'s: every block's attention
    exchanges, the planned stage's blocks'."""
    assert stage_q.shape.dims is not None
    dims = stage_q.shape.dims
    element = BYTES[storage_precision(q.precision)]
    tokens = stage_q.micro_batch * stage_q.seq_len  # one GPU's tokens of one micro-step
    micro_steps = stage_q.grad_accum
    forwards = 2 if q.checkpointing == "full" else 1
    out: list[tuple[Collective, float, float]] = []
    if cp.size > 1:
        group = _cp_group(q.topology, cp.size, layout.tp)
        if cp.attention == "all-to-all":
            per_layer = exchange_bytes(dims, tokens, layout.tp, element, cp.size)
            calls = ULYSSES_EXCHANGES * dims.layers * (forwards + 1)
            payload = per_layer * dims.layers * (forwards + 1)
            seconds = collective_seconds(q.topology, group, "all-gather", payload, calls) if timed else 0.0
            seconds *= micro_steps
            c = Collective(
                "all-to-all q, k, v and attention output (context parallel)",
                "all-gather",
                payload,
                calls,
                None,
                group,
                per_micro_step=True,
            )
            out.append((c, seconds, seconds))
        elif cp.rotate == "all-gather":
            out += _gathered_ring(q, stage_q, layout, cp, group, element, timed)
        else:
            passes = (cp.size - 1) * dims.layers
            one = ring_pass_bytes(dims, tokens, layout.tp, element, cp)
            grad = ring_gradient_bytes(one, element, cp)
            payload = (one * (forwards + 1) + grad) * passes
            # Each pass is one send to the next GPU of the ring (two in the backward: k, v and their
            # gradients), at NCCL's price for two GPUs: across the network where the ring leaves a node.
            hop = Group(2, 2 if group.nodes > 1 else 1)

            def sent(size: float) -> float:
                return collective_seconds(q.topology, hop, "broadcast", size) * passes * micro_steps

            seconds = sent(one) * (forwards + 1) + sent(grad) if timed else 0.0
            c = Collective(
                "ring attention k and v passes (context parallel)",
                "broadcast",
                payload,
                passes,
                "backward",
                group,
                per_micro_step=True,
            )
            out.append((c, seconds, seconds))
    return out


GATHERED_KV = "all-gather k and v (context parallel, torch's allgather rotate method)"
GATHERED_KV_GRADS = "pass k and v gradients round the ring (context parallel, torch's allgather rotate method)"


def _gathered_ring(
    q: Question, stage_q: Question, layout: Layout, cp: ContextParallel, group: Group, element: int, timed: bool
) -> list[tuple[Collective, float, float]]:
    """torch's ring attention with the allgather rotate method (context_parallel_cost.py): every
    layer's k and v gathered whole in one all-gather in each forward and in the backward, which only
    the first sub-step's attention hides (`_time` charges what it does not), and the gradients of k
    and v passed round the ring in the backward, hidden behind its sub-steps."""
    dims = stage_q.shape.dims
    assert dims is not None
    tokens = stage_q.micro_batch * stage_q.seq_len
    micro_steps = stage_q.grad_accum
    forwards = 2 if q.checkpointing == "full" else 1
    local = ring_pass_bytes(dims, tokens, layout.tp, element, cp)
    calls = dims.layers * (forwards + 1)
    gather = collective_seconds(q.topology, group, "all-gather", local * cp.size) if timed else 0.0
    payload = local * cp.size * calls
    gathers = Collective(GATHERED_KV, "all-gather", payload, calls, "attention", group, per_micro_step=True)
    passes = (cp.size - 1) * dims.layers
    hop = Group(2, 2 if group.nodes > 1 else 1)
    grad = ring_gradient_bytes(local, element, cp)
    one = collective_seconds(q.topology, hop, "broadcast", grad) if timed else 0.0
    grads = Collective(GATHERED_KV_GRADS, "broadcast", grad * passes, passes, "backward", group, per_micro_step=True)
    gathered = gather * calls * micro_steps
    return [(gathers, gathered, gathered), (grads, one * passes * micro_steps, 0.0)]


def _partition_gathers(
    q: Question, stage_q: Question, layout: Layout, element: int, timed: bool
) -> tuple[Collective, float, float]:
    """DeepSpeed's engine under tensor parallelism: the whole boundary activation gathered over the
    tensor-parallel group three times a micro-batch (deepspeed_pipeline.py), in the critical path."""
    assert stage_q.shape.dims is not None
    whole = boundary_bytes(stage_q.micro_batch, stage_q.seq_len, stage_q.shape.dims.width, 1, element)
    calls = GATHERS_PER_MICRO_BATCH * stage_q.grad_accum
    seconds = collective_seconds(q.topology, layout.tp_group, "all-gather", whole) * calls if timed else 0.0
    what = "all-gather the partitioned activations and gradients between stages (DeepSpeed's PartitionedTensor)"
    gathers = Collective(what, "all-gather", whole * calls, calls, None, layout.tp_group, per_micro_step=True)
    return gathers, seconds, seconds


def _tied_embedding_reduce(
    q: Question, layout: Layout, across: bool, timed: bool
) -> tuple[Collective, float, float] | None:
    """A head tied to the embedding under a pipeline: the first stage holds the embedding, the last
    the head, each a copy of the table, and their gradients are all-reduced between the two after
    the last micro-batch, beside no compute (DeepSpeed's `_exec_reduce_tied_grads`, Megatron-LM's
    `_allreduce_word_embedding_grads` in megatron/core/distributed/finalize_model_grads.py); None
    for an untied head."""
    dims = q.shape.dims
    if dims is None or not tied_head(q.shape):
        return None
    table = dims.vocab // dims.head_split(layout.tp) * dims.width * BYTES[storage_precision(q.precision)]
    group = Group(2, 2 if across else 1)
    seconds = collective_seconds(q.topology, group, "all-reduce", table) if timed else 0.0
    what = "all-reduce the tied embedding's gradients between the first and the last stage"
    return Collective(what, "all-reduce", table, 1, None, group), seconds, 0.0


def _time(
    t: StepTime,
    q: Question,
    stage_q: Question,
    layout: Layout,
    pipe: Pipeline,
    split: StageSplit | None,
    cp: ContextParallel,
    between: list[tuple[Collective, float, float]],
    context: list[tuple[Collective, float, float]],
    parts: tuple[float, float] | None = None,
    block_comm: BlockComm | None = None,
) -> StepTime:
    """The stage's step with the bubble, context parallel's attention and the exposed transfers added
    (`between` the pipeline's, `context` context parallel's), its compute and its blocks'
    communication the slowest GPU's (`_stage_work`, `_stage_seconds`); `parts` the head's and a
    block's seconds (`_head_and_block`), `block_comm` what the planned stage's blocks exchange in
    their micro-batches' critical path (`_block_comm`)."""
    scale = q.factors.compute_scale
    attention_extra = _context_attention(t, q, stage_q, layout, cp)
    overplanned, uneven, blocks = _stage_work(parts, q, stage_q, layout, split, block_comm)
    # Every block's work and exchanges run on the slowest GPU's blocks, not the planned stage's: context
    # parallel's extra attention (each block's queries against the whole sequence), its tensor
    # parallelism's and experts' exchanges (of t's recurring and exposed communication), and context
    # parallel's transfers.
    kept = blocks / split.fullest if split is not None else 1.0
    compute = t.compute_s + attention_extra * kept - overplanned * scale
    optimizer = t.work.step_s * scale if t.work is not None else 0.0
    uneven *= scale
    fewer = block_comm.recurring_s * (1 - kept) if block_comm is not None else 0.0
    fewer += _root_calls_left(split, parts, q, block_comm)
    context_s = _context_exposed(context, _attention_seconds(t, q, stage_q, attention_extra), cp) * kept
    # The embedding's and the head's own tensor-parallel calls (comm.py's `_tensor_parallel`, one of
    # TP_ROOT_CALLS apiece), which t charges both, are the slowest GPU's: the first's the embedding's,
    # the last's the head's, none between (`_root_calls_left`). Once a micro-batch, whatever the
    # blocks, and left as planned: the exchanges between stages (each micro-batch's, the fill's and
    # the drain's: `_pipeline_traffic`) and the tied embedding's reduction (`_tied_embedding_reduce`).
    # The vocabulary-parallel loss's own all-reduces of a token's maximum and sums are not priced
    # anywhere (comm.py lists none).
    exposed = sum(seconds for _, seconds, _ in between) + context_s
    recurring = sum(every_micro_batch for _, _, every_micro_batch in between) + context_s
    recurring_comm = t.recurring_comm_s - fewer
    # The bubble idles a stage for the length of its micro-batches' work: their compute, the
    # communication in each one's critical path (tensor parallelism's, context parallelism's) and
    # the wait on the host to issue them (host_issue.py); the slowest GPU idles for the others'.
    idle = pipe.idle_share(_stage_seconds(parts, q, split, block_comm))
    bubble = pipe.bubble * idle * (compute - optimizer + recurring_comm + recurring + t.host_wait_s)
    tokens = t.tokens_per_s * t.step_s
    bubble_what = (
        f"{pipe.schedule}, {pipe.stages} stages, {micro_batches(pipe.microbatches)}: {idle_words(pipe.bubble * idle)}"
        if layout.pp > 1
        else ""
    )
    traffic = between + context
    timed = replace(
        t,
        compute_s=compute,
        exposed_comm_s=t.exposed_comm_s - fewer + exposed,
        recurring_comm_s=recurring_comm + recurring,
        bubble_s=bubble,
        bubble_what=bubble_what,
        imbalance_s=uneven,
        wire_bytes=t.wire_bytes + sum(c.wire_bytes() for c, _, _ in traffic),
        comm_s=t.comm_s + sum(seconds for _, seconds, _ in traffic),
    )
    return replace(timed, tokens_per_s=tokens / timed.step_s)


def _context_attention(t: StepTime, q: Question, stage_q: Question, layout: Layout, cp: ContextParallel) -> float:
    """Seconds a step the planned stage's attention adds under context parallelism (each GPU's
    queries against the whole sequence's keys), at its compute scale."""
    assert q.gpu is not None and stage_q.shape.dims is not None
    if cp.size <= 1:
        return 0.0
    dims = stage_q.shape.dims
    full = q.checkpointing == "full"
    if t.work is not None:
        per_micro = extra_attention_s(
            dims,
            q.gpu,
            q.attention,
            storage_precision(q.precision),
            micro_batch=stage_q.micro_batch,
            seq_len=q.seq_len,
            cp=cp.size,
            tp=layout.tp,
            layers=dims.layers,
            recompute=full,
        )
        return per_micro * q.factors.compute_scale * stage_q.grad_accum
    if q.factors.fixed_mfu is not None:
        flops = 12 * dims.layers * dims.heads * dims.head_dim * (q.seq_len - stage_q.seq_len)
        tokens = stage_q.micro_batch * stage_q.seq_len * stage_q.grad_accum
        again = 4 / 3 if full else 1.0
        peak = q.gpu.peak_flops[storage_precision(q.precision)] * q.factors.fixed_mfu
        return flops * tokens * again / layout.tp / peak
    return 0.0


def _attention_seconds(t: StepTime, q: Question, stage_q: Question, attention_extra: float) -> float:
    """The planned stage's attention of a step, what context parallel's ring passes hide behind."""
    return (t.work.attention_s * q.factors.compute_scale * stage_q.grad_accum if t.work else 0.0) + attention_extra


def _context_exposed(context: list[tuple[Collective, float, float]], attention: float, cp: ContextParallel) -> float:
    """Seconds a step of context parallel's transfers (`_context_traffic`) no compute hides, all of
    them in every micro-batch's critical path: its all-to-alls whole, each gather beyond the first
    of the cp sub-steps of its pass, the ring's passes beyond the attention they run beside."""
    exposed = 0.0
    for c, seconds, _ in context:
        if c.window is None:
            exposed += seconds
        elif c.what == GATHERED_KV:
            exposed += max(0.0, seconds - attention / cp.size)
        else:
            exposed += max(0.0, seconds - attention)
    return exposed


@dataclass(frozen=True)
class BlockComm:
    """What the planned stage's blocks (the fullest GPU's) exchange in their micro-batches' critical
    path, seconds a step: of its step's recurring communication (stage_comm.block_recurring_s), and
    context parallel's exposed transfers."""

    recurring_s: float
    context_s: float
    blocks: int  # the planned stage's
    micro_steps: int
    root_s: float = 0.0  # of its recurring communication, the embedding's and the head's (stage_comm.root_recurring_s)

    @property
    def per_root(self) -> float:
        """Seconds the embedding's calls, or the head's, add to a micro-batch's critical path."""
        return self.root_s / (TP_ROOT_CALLS * self.micro_steps) if self.micro_steps else 0.0

    @property
    def per_block(self) -> float:
        """Seconds one block adds to a micro-batch's critical path."""
        return (self.recurring_s + self.context_s) / (self.blocks * self.micro_steps) if self.blocks else 0.0


def _block_comm(
    t: StepTime,
    collectives: list[Collective],
    q: Question,
    stage_q: Question,
    layout: Layout,
    cp: ContextParallel,
    context: list[tuple[Collective, float, float]],
) -> BlockComm:
    """The planned stage's BlockComm from its step `t` and its `collectives`, as its plan prices
    them (its GPUs' topology, its host's copies)."""
    assert q.gpu is not None and stage_q.shape.dims is not None
    host = host_bytes_per_s(q.gpu)
    recurring = block_recurring_s(t, collectives, stage_q.topology, host, stage_q.grad_accum)
    root = root_recurring_s(collectives, stage_q.topology, host, stage_q.grad_accum)
    attention = _attention_seconds(t, q, stage_q, _context_attention(t, q, stage_q, layout, cp))
    context_s = _context_exposed(context, attention, cp)
    return BlockComm(recurring, context_s, stage_q.shape.dims.layers, stage_q.grad_accum, root)


def _head_and_block(t: StepTime, q: Question, stage_q: Question, layout: Layout) -> tuple[float, float] | None:
    """Unscaled seconds of a micro-batch's head (its matmuls and the loss) and of one block, from
    the planned stage's work (the fullest GPU's blocks with the head and the loss)."""
    dims = stage_q.shape.dims
    if t.work is None or q.gpu is None or dims is None:
        return None
    tokens = stage_q.micro_batch * stage_q.seq_len
    out = dims.vocab // dims.head_split(layout.tp)
    held = storage_precision(q.precision)
    head = t.work.loss_s + sum(
        gemm_seconds(m, n, k, q.gpu, held, widths=(out, dims.width))
        for m, n, k in ((tokens, out, dims.width), (tokens, dims.width, out), (out, dims.width, tokens))
    )
    return head, max(0.0, t.work.micro_step_s - head) / dims.layers


def _stage_seconds(
    parts: tuple[float, float] | None, q: Question, split: StageSplit | None, block_comm: BlockComm | None = None
) -> tuple[float, float, float] | None:
    """A micro-batch's length on the first GPU (its blocks; the embedding's lookup is negligible),
    the fullest between (their blocks) and the last (its blocks, the head's matmuls and the loss):
    its compute, scaled, from `parts` (`_head_and_block`), and its blocks' exchanges in its critical
    path (`block_comm`); None where the split is not known."""
    if split is None or parts is None:
        return None
    head, block = parts
    scale = q.factors.compute_scale
    exchanged = block_comm.per_block if block_comm is not None else 0.0
    root = block_comm.per_root if block_comm is not None else 0.0  # the embedding's calls, or the head's
    one = block * scale + exchanged
    return split.first * one + root, split.middle * one, split.last * one + head * scale + root


def _slowest(lengths: tuple[float, float, float]) -> int:
    """Which of `_stage_seconds`' GPUs (0 the first, 1 the fullest between, 2 the last) is the slowest."""
    return max(range(3), key=lambda i: lengths[i])


def _root_calls_left(
    split: StageSplit | None, parts: tuple[float, float] | None, q: Question, block_comm: BlockComm | None
) -> float:
    """Seconds a step of the embedding's and the head's tensor-parallel calls the slowest GPU does not
    run of the planned stage's both: the first runs the embedding's alone, the last the head's, a GPU
    between neither."""
    lengths = _stage_seconds(parts, q, split, block_comm)
    if lengths is None or block_comm is None:
        return 0.0
    own = 0 if _slowest(lengths) == 1 else 1
    return block_comm.per_root * (TP_ROOT_CALLS - own) * block_comm.micro_steps


def _stage_work(
    parts: tuple[float, float] | None,
    q: Question,
    stage_q: Question,
    layout: Layout,
    split: StageSplit | None,
    block_comm: BlockComm | None = None,
) -> tuple[float, float, int]:
    """The slowest GPU, the one whose micro-batch (its compute and its blocks' exchanges,
    `_stage_seconds`) each micro-batch waits on: unscaled seconds a step the stage planned (the
    fullest GPU's blocks with the head and the loss) computes beyond it; what it computes beyond an
    even share of the model's compute, which the others idle (StepTime.imbalance_s); and its
    blocks. Under an even split the last is the slowest and the planned stage is it; under
    Megatron-LM's counted embedding and loss, or the runtime's cut with fewer blocks on the last
    stages, a GPU between may be, without the head, and where a GPU between holds more blocks than
    the last its exchanges may make it the slowest though the last computes more."""
    whole = q.shape.dims
    if split is None or parts is None or whole is None:
        return 0.0, 0.0, split.fullest if split is not None else 0
    head, block = parts
    lengths = _stage_seconds(parts, q, split, block_comm)
    assert lengths is not None
    stages = ((split.first, 0.0), (split.middle, 0.0), (split.last, head))
    blocks, own_head = stages[_slowest(lengths)]
    planned = split.fullest * block + head
    slowest = blocks * block + own_head
    even = (whole.layers * block + head) / layout.pp
    micro_steps = stage_q.grad_accum
    return micro_steps * max(0.0, planned - slowest), micro_steps * max(0.0, slowest - even), blocks


def published_layout(
    sharding: str, reduce_in_fp32: bool, overlap_dp: bool | None = None
) -> tuple[PlanModel, dict[str, Any]] | str | None:
    """A published run with pipeline or context parallelism as the PlanModel and options it is
    planned with (fsdp, or fsdp-tp where it names tp=; Megatron-LM's pipeline and context parallelism
    beside its tensor and data parallelism, `overlap_dp` as megatron_layout's), or why it is not
    planned; None where it has neither."""
    if sharding.lower().startswith("megatron"):
        return megatron_pipeline_layout(sharding, overlap_dp)
    options = published_options(sharding)
    if options is None:
        return None
    if not sharding.startswith("FSDP2"):
        return "pipeline or context parallelism outside FSDP2 and Megatron-LM: not modelled"
    model = PlanModel("torch", 3, "low_precision", reduce_in_fp32=reduce_in_fp32, tensor_parallel="tp_size" in options)
    return model, {"sync_each_micro_step": True, **options}


# Megatron's flags that overlap its data-parallel collectives with the backward and the next forward.
OVERLAP_FLAGS = ("overlap_grad_reduce", "overlap_param_gather")


def megatron_layout(sharding: str, overlap_dp: bool | None = None) -> tuple[PlanModel, dict[str, Any]]:
    """Megatron-LM's tensor parallel inside a node beside data parallel across (`megatron tp=8 dp=32
    ddp`): its DDP (ddp-tp's model) or its distributed optimizer (zero1-tp's, which reduce-scatters
    the fp32 gradients and all-gathers the updated parameters, Megatron-LM's
    docs/source/distrib_optimizer.md), on its own engine (comm.py's MEGATRON_ENGINE: its buffers,
    its sequence parallelism's saved shards), with sequence parallelism where the layout names
    `sequence_parallel` (or `tp_comm_overlap`, which Megatron-LM refuses without it) and
    TransformerEngine's tensor-parallel overlap where it names `tp_comm_overlap`.

    Its data-parallel overlap (OVERLAP_FLAGS: the gradients' reduction behind the backward, the
    parameters' gather behind the next forward) is on where the layout names the flag; else as
    `overlap_dp` says, what the run's recipe does (NeMo's and Megatron-Bridge's recipes set both,
    Megatron-LM's arguments leave both off); else, not known, as Megatron's engine defaults: its DDP
    overlaps nothing (`--DDP-impl local`, Megatron-LM's default until its torch DDP went,
    megatron/arguments.py, all-reduces the contiguous gradient buffer after the backward, as
    Megatron-core's DDP does with overlap_grad_reduce=False, distributed_data_parallel_config.py),
    a distributed optimizer overlaps both, as NeMo's recipes run it."""
    tp = int(sharding.split("tp=")[1].split()[0])
    words = sharding.split()
    stage = 1 if "distributed_optimizer" in words else 0
    sequence_parallel = "sequence_parallel" in words or TP_COMM_OVERLAP in words
    model = PlanModel(
        "torch",
        stage,
        "low_precision",
        reshard_after_forward=False,
        tensor_parallel=True,
        sequence_parallel=sequence_parallel,
    )
    options: dict[str, Any] = {"tp_size": tp, "distributed_optimizer": stage == 1, MEGATRON_ENGINE: True}
    # Its own DDP, not another engine's ZeRO beside Megatron's layers (`zero=`, Megatron-FSDP).
    megatron_ddp = stage == 0 and "ddp" in words and not any(w.startswith("zero=") for w in words)
    if TP_COMM_OVERLAP in words:
        options[TP_COMM_OVERLAP] = True
    for flag in OVERLAP_FLAGS:
        if flag in words:
            options[flag] = True
        elif overlap_dp is not None:
            options[flag] = overlap_dp
        elif megatron_ddp:  # Megatron's DDP reduces its gradient buffer after the backward unless told otherwise
            options[flag] = False
    return model, options


def megatron_pipeline_layout(sharding: str, overlap_dp: bool | None = None) -> tuple[PlanModel, dict[str, Any]] | None:
    """Megatron-LM's pipeline (`pp=`) and context parallelism (`cp=`) on its tensor and data-parallel
    layout: the model cut into pp_size stages, 1F1B, or its interleaved schedule with `vp=` virtual
    stages a GPU (Narayanan et al. 2021, section 2.2.2), its micro-batches the step's accumulation
    (`microbatches` is set from the run's batch); each sequence split over cp_size GPUs, attention
    made whole by TransformerEngine's ring of k, v passes (its default `p2p` exchange), the
    gradients reduced over the data-parallel and context-parallel ranks together. Its uneven splits
    (pipeline_cost.py's megatron_split) where the layout names them: `embedding_in_pipeline_split`,
    `loss_in_pipeline_split`, `first_pipeline_layers=N`, `last_pipeline_layers=N`. None with
    neither pipeline nor context parallelism."""
    sizes = {key: int(value) for key, value in re.findall(r"\b(pp|cp|vp)=(\d+)", sharding)}
    pp, cp = sizes.get("pp", 1), sizes.get("cp", 1)
    if pp <= 1 and cp <= 1:
        return None
    model, options = megatron_layout(sharding, overlap_dp)
    if cp > 1:
        model = replace(model, context_parallel_engine=True)
        options = {**options, "cp_size": cp, "cp_attention": "ring"}
    if pp <= 1:
        return model, options
    virtual = sizes.get("vp", 1)
    schedule = {"schedule": "interleaved-1f1b", "virtual_stages": virtual} if virtual > 1 else {"schedule": "1f1b"}
    words = sharding.split()
    split: dict[str, Any] = {flag: True for flag in (EMBEDDING_IN_SPLIT, LOSS_IN_SPLIT) if flag in words}
    for key in (FIRST_STAGE_BLOCKS, LAST_STAGE_BLOCKS):
        given = re.search(rf"\b{key}=(\d+)", sharding)
        if given:
            split[key] = int(given.group(1))
    return replace(model, pipeline_engine=True), {**options, "pp_size": pp, **schedule, **split}


def published_options(sharding: str) -> dict[str, Any] | None:
    """A published run's pipeline and context-parallel layout as plan options (pp_size,
    microbatches, schedule, cp_size and ring attention; tp_size and async_tp where given), from torchtitan's way
    of writing it (`FSDP2 dp_shard=8 tp=8 pp=8 cp=2 async_tp schedule=1F1B microbatches=8`); None where it has
    neither. torchtitan's pipeline default is as many micro-batches as stages."""
    sizes = {key: int(value) for key, value in re.findall(r"\b(tp|pp|cp|microbatches)=(\d+)", sharding)}
    pp, cp = sizes.get("pp", 1), sizes.get("cp", 1)
    if pp <= 1 and cp <= 1:
        return None
    options: dict[str, Any] = {"pp_size": pp, "cp_size": cp}
    if cp > 1:
        options["cp_attention"] = "ring"  # torchtitan's context parallel is torch's ring attention
    if "tp" in sizes:
        options["tp_size"] = sizes["tp"]
        if "async_tp" in sharding.split():
            options["async_tp"] = True
    if pp > 1:
        named = re.search(r"schedule=(.+?)(?:\s+\w+=|$)", sharding)
        schedule = named.group(1).strip().lower() if named else "1f1b"
        if schedule not in TORCHTITAN_SCHEDULES:
            raise LayoutError(f"pipeline schedule {schedule!r}: not one the planner knows")
        options["schedule"] = TORCHTITAN_SCHEDULES[schedule]
        options["microbatches"] = sizes.get("microbatches", pp)
    return options
