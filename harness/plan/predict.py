"""One planning question answered for every strategy: memory (model states, activations,
buffers, peak, fits), communication and step time. `runner.py plan` prints it; every
`train` run records its own strategy's line beside what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.common.hardware import GPUSpec
from harness.plan.memory.activations import Activations, activations
from harness.plan.memory.buffers import Buffers, backend_buffers
from harness.plan.memory.capacity import Headroom, headroom
from harness.plan.memory.expert_memory import (
    added,
    expert_activations,
    expert_buffers,
    expert_states,
    with_experts_held,
)
from harness.plan.memory.host_memory import HostRoom, host_room
from harness.plan.memory.invariants import check_memory
from harness.plan.memory.memory_correction import corrected_peak
from harness.plan.memory.model_states import GPU, compute_bytes, model_states
from harness.plan.memory.recipe import PLAIN, Recipe
from harness.plan.memory.recipe_plan import FRAGMENTATION, recipe_collectives, with_recipe
from harness.plan.model.model_shape import ModelShape
from harness.plan.network.comm import Collective, collectives, local_copy_bytes, shared_cards
from harness.plan.network.expert_comm import all_to_alls, expert_gradient_collectives
from harness.plan.network.fabric import Topology, default_fabric
from harness.plan.parallel.async_tp_cost import (
    MEGATRON_ENGINE,
    AsyncTensorParallel,
    async_tp_cost,
    async_tp_of,
    fused_collectives,
)
from harness.plan.parallel.backends import Backend, backend_for, model_of
from harness.plan.parallel.batch_split import nearest_split, split
from harness.plan.parallel.layout import Layout, LayoutError, layout_of, reason_of
from harness.plan.parallel.planned_options import check_priced, check_what_ifs_apply, options_of
from harness.plan.speed.alibi_scores import ALIBI, ALIBI_SCORE_BYTES
from harness.plan.speed.attention import UNFUSED
from harness.plan.speed.compute import (
    ROOT_KERNELS,
    Kernels,
    Regime,
    block_projections,
    compute_work,
    kernel_launches,
    memory_bytes_per_s,
    micro_step_kernels,
)
from harness.plan.speed.core_attention_recompute import recomputed_attention_flops, with_core_attention_recomputed
from harness.plan.speed.dropout import SOFTMAX_DROPOUT_FUSION, Dropout, dropout_kernels, with_dropout
from harness.plan.speed.expert_compute import MEGATRON_MOE_LAYER, expert_kernels, expert_long_forward, expert_work
from harness.plan.speed.gemm import LOW_PRECISION, gemm_seconds
from harness.plan.speed.host_issue import (
    FULL_ITERATION_GRAPH,
    GRAPH_REPLAY_S_PER_KERNEL,
    HOST_S_PER_KERNEL,
    LAUNCH_BLOCKING,
    LAYER_GRAPHS,
    LAYER_SYNCS,
    HostIssue,
    host_issue,
    host_slowdown,
    issue_rates,
    layer_graph_issue,
    layer_sync_copies,
)
from harness.plan.speed.masked_softmax import (
    FUSED_SOFTMAX,
    SWAPPED_SOFTMAX_CHECK,
    fused_softmax_bytes,
    fused_softmax_kernels,
)
from harness.plan.speed.nanotron_step import NANOTRON_ENGINE, with_nanotron_step
from harness.plan.speed.scaled_scores import (
    SCALED_SCORES,
    SCALED_SCORES_BACKWARD_BYTES,
    SCALED_SCORES_FORWARD_BYTES,
    scaled_scores_kernels,
)
from harness.plan.speed.score_traffic import with_score_traffic
from harness.plan.speed.step_time import SpeedFactors, StepTime, host_bytes_per_s, step_time, waiting_on
from strategies.memory import CATEGORIES, MemoryBreakdown


@dataclass(frozen=True)
class Question:
    shape: ModelShape
    topology: Topology
    capacity_bytes: float  # one GPU's memory as torch reports it
    micro_batch: int
    grad_accum: int
    seq_len: int
    precision: str  # fp32 | bf16 | fp16 | fp8 | fp4 (fp8, fp4: the projections' matmuls, the rest in bf16)
    gpu: GPUSpec | None  # None: an unknown card, memory only
    factors: SpeedFactors  # compute scale, backend overheads, memory corrections (calibration.py)
    checkpointing: str = "none"  # none | full | selective
    fused_loss: bool = False  # a fused or chunked cross-entropy: no whole fp32 logits
    fused_norm: bool = False  # a fused RMSNorm kernel: saves its input and 1/rms, no fp32 copy
    complex_rope: bool = False  # rotary in complex numbers (torchtitan): compile leaves it eager
    attention: str = "flash"  # the attention kernel (attention.py)
    compiled: bool = False  # compile=true: elementwise chains fused
    # Fused kernels issued op by op from Python all the same (TransformerEngine's modules): the host's
    # rate per kernel is eager's (host_issue.py).
    eager_launches: bool = False
    strategy_options: dict[str, Any] = field(default_factory=dict)
    # Set: the global batch in sequences, which fixes each layout's accumulation (a tensor-parallel
    # group shares one micro-batch); None: grad_accum as given for every layout. With
    # split_global_batch the micro-batch is the global batch over each layout's ranks instead.
    global_batch: int | None = None
    split_global_batch: bool = False
    # Set where no batch was given: the sequences each GPU takes, so the global batch grows with the
    # GPUs a what-if asks about (with_gpus) instead of being kept; a question derived with
    # global_batch=None (a layout's own split) keeps its micro-batch as given.
    batch_per_gpu: int | None = None
    # A what-if on another GPU count (with_gpus): the global batch kept, each layout taking the
    # largest micro-batch up to the asked one that divides its ranks' share.
    nearest_split: bool = False
    recipe: Recipe = PLAIN  # pure bf16, the optimizer, QK-norm, offload... (recipe.py)
    # Megatron-LM's selective recomputation beside checkpointing=none: each layer's core attention
    # run again in the backward (core_attention_recompute.py).
    core_attention_recompute: bool = False
    # One host's memory, bytes (the card's reference system, or host_mem_gb=); None: not checked.
    host_memory_bytes: float | None = None
    # The GPUs of the reference host host_memory_bytes is (a GB200 tray's 4): a planned host of more GPUs
    # (gpus_per_node=8 of GB200s) has as much per GPU, not one tray's for all; None: one host's memory
    # whatever its GPUs (host_mem_gb=).
    host_memory_gpus: int | None = None
    # The GPUs of one full host (the card's, or gpus_per_node=): a question on part of a host grows
    # into the rest of it before it takes more hosts (with_gpus); None: as many a host as now.
    host_gpus: int | None = None
    # False: the memory alone (whether a layout fits, and what it holds), no step time or collectives:
    # a search for the layouts that would fit plans most of them only to find they do not (what_fits).
    timed: bool = True

    @property
    def gpus(self) -> int:
        return self.topology.gpus

    @property
    def host(self) -> HostRoom | None:
        """The host memory its GPUs' processes share: one node's GPUs."""
        return host_room(
            self.host_memory_bytes and self.host_memory_bytes * self.hosts_per_node, self.topology.per_node
        )

    @property
    def hosts_per_node(self) -> float:
        """How many of the reference host's memory a planned node has: more than one where the node holds more
        GPUs than the reference host (host_memory_gpus) does."""
        reference = self.host_memory_gpus
        return max(1.0, self.topology.per_node / reference) if reference else 1.0

    @property
    def batch_defaulted(self) -> bool:
        """Whether the global batch is batch_per_gpu sequences a GPU because none was given."""
        return self.batch_per_gpu is not None and self.global_batch is not None

    @property
    def nodes(self) -> int:
        return self.topology.nodes

    def with_gpus(self, gpus: int) -> "Question":
        """The same question on `gpus` GPUs: a part of one host filled up to a full host first, then as
        many per node as that (more nodes as needed), a host's default network grown with its GPUs;
        a global batch given is kept, split as each layout there can (nearest_split), and one not
        given stays batch_per_gpu sequences a GPU."""
        now = self.topology.per_node
        per_node = min(gpus, self.host_gpus) if self.host_gpus and now < self.host_gpus else now
        nodes = max(1, -(-gpus // per_node))
        fabric = self.topology.fabric
        if per_node != now and self.gpu is not None and fabric == default_fabric(self.gpu, now):
            fabric = default_fabric(self.gpu, per_node)  # a card per GPU, as the platform's hosts have
        batch = self.batch_per_gpu * gpus if self.batch_defaulted else self.global_batch
        topology = replace(self.topology, gpus=gpus, nodes=nodes, fabric=fabric)
        return replace(self, topology=topology, global_batch=batch, nearest_split=True)


@dataclass(frozen=True)
class StrategyPlan:
    name: str
    backend: Backend
    layout: Layout
    states: MemoryBreakdown  # what memory_breakdown would report, per device
    activations: Activations | None
    buffers: Buffers
    peak_bytes: int | None  # predicted peak allocated on one GPU; None where activations are unknown
    headroom: Headroom
    fits: bool | None
    collectives: list[Collective]
    time: StepTime | None
    # The split of the batch this plan runs: sequences per micro-step on each data-parallel rank (a
    # pipeline's: its whole local batch) and micro-steps per step.
    micro_batch: int = 1
    grad_accum: int = 1
    host: HostRoom | None = None  # the host's memory, where it is checked

    def __post_init__(self) -> None:
        check_memory(self.name, self.states, self.activations, self.buffers, self.peak_bytes)

    @property
    def host_bytes(self) -> int:
        """What one GPU's process keeps in host memory: offloaded model states and saved activations."""
        return on_host_bytes(self.states, self.activations)

    @property
    def host_fits(self) -> bool | None:
        """Whether the host holds what its GPUs offload; None where the host is not checked."""
        return None if self.host is None else self.host.fits(self.host_bytes)

    @property
    def gpu_fits(self) -> bool | None:
        """Whether the card holds the peak, whatever the host; None where the activations are unknown."""
        return None if self.peak_bytes is None else self.headroom.fits(self.peak_bytes)

    @property
    def reserved_bytes(self) -> float | None:
        """What the caching allocator is predicted to hold at the peak (torch's max reserved): the peak
        with its reserve, and the logits' freed block it holds beside the loss (activations.py)."""
        if self.peak_bytes is None:
            return None
        cached = self.activations.logits_cached if self.activations is not None else 0
        return self.headroom.reserved(self.peak_bytes) + cached

    def states_on(self, device: str = GPU) -> dict[str, int]:
        return on_device(self.states, device)

    def as_dict(self) -> dict[str, Any]:
        t = self.time
        return {
            "strategy": self.name,
            "layout": {
                "tp": self.layout.tp,
                "shard": self.layout.shard,
                "replicas": self.layout.replicas,
                "hpz": self.layout.hpz,
                "pp": self.layout.pp,
                "cp": self.layout.cp,
                "ep": self.layout.experts.ep,
                "etp": self.layout.experts.etp,
                "edp": self.layout.experts.edp,
            },
            "model_states_bytes": self.states.as_dict(),
            "activations_bytes": None
            if self.activations is None
            else {
                "blocks": self.activations.blocks,
                "head_and_loss": self.activations.head,
                "rebuilt_block": self.activations.rebuilt,
                "logits_block_cached": self.activations.logits_cached,
            },
            "buffers_bytes": {
                "backward": self.buffers.backward,
                "hooks": self.buffers.hooks,
                "step": self.buffers.step,
            },
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "peak_allocated_bytes": self.peak_bytes,
            "peak_reserved_bytes": self.reserved_bytes,
            "usable_bytes": self.headroom.usable,
            "host_bytes": self.host_bytes,
            "host_usable_bytes": None if self.host is None else self.host.usable,
            "host_gpus": None if self.host is None else self.host.gpus,
            "fits": self.fits,
            "collectives": [
                {
                    "what": c.what,
                    "kind": c.kind,
                    "payload_bytes": c.payload_bytes,
                    "calls": c.calls,
                    "group_gpus": c.group.size,
                    "group_nodes": c.group.nodes,
                    "hidden_behind": c.window,
                    "every_micro_step": c.per_micro_step,
                }
                for c in self.collectives
            ],
            "time": None
            if t is None
            else {
                "step_s": t.step_s,
                "compute_s": t.compute_s,
                "exposed_comm_s": t.exposed_comm_s,
                "offload_step_s": t.offload_step_s,
                "overhead_s": t.overhead_s,
                "bubble_s": t.bubble_s,
                "contention_s": t.contention_s,
                "straggler_s": t.straggler_s,
                "overhead_what": t.overhead_what,
                "host_wait_s": t.host_wait_s,
                "comm_s": t.comm_s,
                "wire_bytes_per_gpu": t.wire_bytes,
                "tokens_per_s": t.tokens_per_s,
                "tokens_per_s_per_gpu": t.tokens_per_s / max(1, self.layout.gpus),
                "scaling_efficiency": t.efficiency,
                "compute_parts_s": None
                if t.work is None
                else {
                    "matmuls": t.work.matmul_s,
                    "attention": t.work.attention_s,
                    "elementwise": t.work.elementwise_s,
                    "loss": t.work.loss_s,
                    "optimizer": t.work.optimizer_s,
                    "recomputed": t.work.recompute_s,
                },
            },
        }


def on_device(states: MemoryBreakdown, device: str = GPU) -> dict[str, int]:
    """Bytes per category that live on `device` ("cuda" or "cpu")."""
    return {c: getattr(states, c).get(device, 0) for c in CATEGORIES}


def on_host_bytes(states: MemoryBreakdown, acts: Activations | None) -> int:
    """Bytes one GPU's process keeps in host memory: its model states on the CPU and saved activations sent there."""
    return sum(on_device(states, "cpu").values()) + (acts.host if acts is not None else 0)


def plan_fits(room: Headroom, peak: int | None, host: HostRoom | None, on_host: int) -> bool | None:
    """Whether a plan fits: its peak on the card (None where unknown) and, where the host is checked,
    what its GPUs keep in host memory; a host that cannot hold it fails the plan whatever the card."""
    if host is not None and not host.fits(on_host):
        return False
    return None if peak is None else room.fits(peak)


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


def communicators(layout: Layout, gpus: int) -> int:
    """NCCL communicators a rank holds: the data-parallel one, and one per further mesh dimension."""
    if gpus <= 1:
        return 0
    return 1 + (layout.tp > 1) + (layout.replicas > 1) + (layout.hpz > 1)


def batching(q: Question, layout: Layout) -> tuple[int, int]:
    """(micro-batch, micro-steps per step) of this layout: as asked, or what the global batch
    takes over its data-parallel ranks (a tensor-parallel group shares one micro-batch)."""
    if q.global_batch is None:
        return q.micro_batch, q.grad_accum
    if q.split_global_batch:
        return split(q.global_batch, layout.data_parallel, None, layout.tp)
    if q.nearest_split:
        return nearest_split(q.global_batch, layout.data_parallel, q.micro_batch, layout.tp)
    return split(q.global_batch, layout.data_parallel, q.micro_batch, layout.tp)


def storage_precision(precision: str) -> str:
    """What parameters, activations and collectives are held in: fp8 and fp4 runs keep bf16 beside their matmuls."""
    return "bf16" if precision in LOW_PRECISION else precision


def _fused_loss(backend: Backend, q: Question) -> bool:
    """Whether the cross-entropy runs fused: asked for (fused_loss=), or compiled with the whole
    model, as a strategy that shards no blocks compiles it (sharding strategies, and replicate's units,
    compile each block, leaving the head and loss eager: strategies/base.py compile_blocks, torchtitan
    alike)."""
    return q.fused_loss or _whole_model_compiled(backend, q)


def _whole_model_compiled(backend: Backend, q: Question) -> bool:
    """Whether the final norm, the head and the loss are compiled in one graph with the blocks (see _fused_loss)."""
    return q.compiled and backend.stage == 0 and not backend.fsdp2_units


def params_held(shape: ModelShape, backend: Backend, layout: Layout) -> float:
    """The parameters one GPU keeps at rest: its shard under ZeRO-3 and FSDP, its tensor-parallel
    part under the others, none where they are offloaded to the host."""
    if backend.offload_params:
        return 0.0
    return shape.params / (layout.shard * layout.tp if backend.stage == 3 else layout.tp)


def plan_backend(backend: Backend, q: Question) -> StrategyPlan:
    """The plan of one strategy (its Backend: a registered PlanModel, options filled in)."""
    layout = layout_of(backend, q.shape, q.topology)
    check_what_ifs_apply(backend, layout)
    if layout.pp > 1 and q.recipe.activation_offload_layers:  # as Megatron-core's TransformerConfig refuses it
        raise LayoutError(
            f"{backend.name}: activation_offload_layers= (Megatron-core's CPU offloading) does not run beside a "
            f"pipeline: give pp_size=1 or leave the offload out"
        )
    micro_batch, grad_accum = batching(q, layout)
    q = replace(q, micro_batch=micro_batch, grad_accum=grad_accum)
    if layout.pp > 1 or layout.cp > 1:
        from harness.plan.parallel.pipeline_context import plan_split_model  # it plans each stage through here

        plan = plan_split_model(backend, q, layout)
        return plan if plan.time is None else replace(plan, time=waiting_on(plan.time, q.gpus))
    held = storage_precision(q.precision)
    backend, q = prepared(backend, q)
    states, memory = held_memory(backend, q, layout)
    room = headroom(q.capacity_bytes, communicators(layout, q.gpus), q.topology.library)
    fit = plan_fits(room, memory.peak, q.host, on_host_bytes(states, memory.activations))
    fp8 = q.precision in LOW_PRECISION
    tokens = q.micro_batch * q.seq_len
    pipelined = async_tp_of(backend, layout, q.compiled)
    comms: list[Collective] = []
    if q.timed:
        comms = collectives(
            q.shape, backend, layout, held, q.gpus, tokens, q.topology.world(), q.checkpointing, fp8, pipelined
        )
        comms = recipe_collectives(comms, q.shape, backend, q.recipe, memory.activations)
        comms += all_to_alls(q.shape, backend, layout.experts, tokens, layout.tp, held, q.checkpointing, q.recipe)
        comms += expert_gradient_collectives(q.shape, backend, layout.experts, held, q.gpus, q.topology.world())
        comms += shared_cards(comms)
    timing = _time(backend, q, layout, comms, pipelined) if q.gpu is not None and q.timed else None
    acts, buffers, peak = memory.activations, memory.buffers, memory.peak
    split = (q.micro_batch, q.grad_accum)
    return StrategyPlan(
        backend.name, backend, layout, states, acts, buffers, peak, room, fit, comms, timing, *split, q.host
    )


def prepared(backend: Backend, q: Question) -> tuple[Backend, Question]:
    """`backend` with the recipe's buffers and `q` with the experts as this backend holds them."""
    backend = with_recipe(backend, q.recipe)
    if not backend.expert_parallel:  # its experts held, reduced and stepped among the rest (expert_memory.py)
        held = with_experts_held(q.shape)
        q = q if held is q.shape else replace(q, shape=held)  # a dense model's shape is its own
    return backend, q


def held_memory(backend: Backend, q: Question, layout: Layout, head: bool = True) -> tuple[MemoryBreakdown, Memory]:
    """The model states one GPU holds and what a micro-batch adds to them (`prepared`'s backend and
    q); `head`: whether this GPU runs the head and the loss (a pipeline's last stage alone does)."""
    held = storage_precision(q.precision)
    states = model_states(q.shape, backend, held, layout.shard, layout.tp, layout.hpz, q.recipe)
    states = added(states, expert_states(q.shape, backend, held, layout.experts, q.recipe))
    return states, memory_at(backend, q, layout, states, head)


@dataclass(frozen=True)
class Memory:
    """What a micro-batch adds to the model states: its activations, the backend's buffers, the peak."""

    activations: Activations | None
    buffers: Buffers
    peak: int | None  # None where the activations are unknown


def memory_at(backend: Backend, q: Question, layout: Layout, states: MemoryBreakdown, head: bool = True) -> Memory:
    """Activations, buffers and peak of `q`'s micro-batch and accumulation beside `states`; without
    `head`, none of the final norm's, the head's and the loss's (a pipeline's stages before the last)."""
    held = storage_precision(q.precision)
    acts = activations(
        q.shape,
        micro_batch=q.micro_batch,
        seq_len=q.seq_len,
        precision=held,
        mixed_precision=backend.mixed_precision,
        checkpointing=q.checkpointing,
        fused_loss=_fused_loss(backend, q),
        tp=layout.tp,
        attention=q.attention,
        fused_norm=q.fused_norm,
        qk_norm=q.recipe.qk_norm,
        offload=q.recipe.activation_offload,
        offload_layers=q.recipe.activation_offload_layers,
        fp8_inputs=q.recipe.fp8_saved_inputs,
        megatron=bool(backend.options.get(MEGATRON_ENGINE)),
        sequence_parallel=backend.sequence_parallel,
        core_attention_recompute=q.core_attention_recompute,
        with_head=head,
        loss_in_place=q.recipe.loss_in_place,
        linear_loss=q.recipe.fused_linear_loss,
        attention_dropout=q.recipe.attention_dropout > 0,
        hidden_dropout=q.recipe.hidden_dropout > 0,
        compiled=q.compiled,
        head_compiled=_whole_model_compiled(backend, q),
    )
    acts = _with_experts(acts, backend, q, layout)
    buffers = backend_buffers(q.shape, backend, held, layout, q.grad_accum, q.micro_batch * q.seq_len, q.recipe)
    tokens = q.micro_batch * q.seq_len / layout.tp
    ffn_buffers = expert_buffers(q.shape, backend, held, layout.experts, q.grad_accum, q.recipe, tokens)
    buffers = replace(
        buffers,
        backward={**buffers.backward, **ffn_buffers.backward},
        hooks={**buffers.hooks, **ffn_buffers.hooks},
        step={**buffers.step, **ffn_buffers.step},
    )
    if acts is not None and q.recipe.fragmentation:
        lost = {FRAGMENTATION: int(q.recipe.fragmentation * acts.total)}
        buffers = replace(buffers, backward={**buffers.backward, **lost})
    grads_held = buffers.grads_resident or q.grad_accum > 1
    gpu = on_device(states)
    peak = peak_allocated(gpu, acts, buffers, grads_held)
    correction = q.factors.memory.get(backend.measured_as)
    if peak is not None and acts is not None and correction is not None:
        # What a calibration found the model to miss, each kind carried by what it grows with,
        # never below the model states this GPU holds (memory_correction.py).
        peak = corrected_peak(peak, sum(gpu.values()), correction, acts.total, params_held(q.shape, backend, layout))
    return Memory(acts, buffers, peak)


def _with_experts(acts: Activations | None, backend: Backend, q: Question, layout: Layout) -> Activations | None:
    """The dense part's activations with a mixture of experts' FFNs (expert_memory.py) added."""
    if acts is None:
        return None
    ffn = expert_activations(
        q.shape,
        micro_batch=q.micro_batch,
        seq_len=q.seq_len,
        tp=layout.tp,
        experts=layout.experts,
        precision=storage_precision(q.precision),
        mixed_precision=backend.mixed_precision,
        checkpointing=q.checkpointing,
        megatron=_megatron_moe_layer(backend),
        sequence_parallel=backend.sequence_parallel,
        recipe=q.recipe,
    )
    if ffn is None:
        return acts
    on_gpu = acts.blocks / max(1, acts.blocks + acts.host)  # activation offload keeps some blocks on the host
    blocks = ffn.kept - ffn.dropped
    return replace(
        acts,
        blocks=acts.blocks + int(on_gpu * blocks),
        host=acts.host + int((1 - on_gpu) * blocks),
        rebuilt=acts.rebuilt + ffn.rebuilt,
    )


def _async_tp(q: Question, layout: Layout, backend: Backend) -> AsyncTensorParallel | None:
    """What async TP's pipelines add to a micro-step, the matmuls timed as the compute model times
    them (or at the fixed MFU); None for a model without transformer sizes (no fused collectives)."""
    assert q.gpu is not None
    dims = q.shape.dims
    if dims is None:
        return None
    held = storage_precision(q.precision)
    gpu, mfu = q.gpu, q.factors.fixed_mfu

    def matmul(m: float, n: float, k: float) -> float:
        if mfu is not None:
            return 2 * m * n * k / (gpu.peak_flops[held] * mfu)
        return gemm_seconds(m, n, k, gpu, q.precision)

    return async_tp_cost(
        fused_collectives(dims, layout.tp, q.checkpointing),
        layers=dims.layers,
        micro_batch=q.micro_batch,
        seq_len=q.seq_len,
        tp=layout.tp,
        width=dims.width,
        checkpointing=q.checkpointing,
        matmul=matmul,
        copy_bytes_per_s=q.topology.intra.ring_busbw,
        memory_bytes_per_s=memory_bytes_per_s(gpu),
        held_bytes=compute_bytes(held),
        fp8=q.precision in LOW_PRECISION,
        sms=gpu.sms if backend.options.get(MEGATRON_ENGINE) else None,  # TransformerEngine's userbuffers
    )


def _time(backend: Backend, q: Question, layout: Layout, comms: list[Collective], pipelined: bool) -> StepTime:
    assert q.gpu is not None
    params = q.shape.params / layout.tp
    shard_params = params / layout.shard if backend.stage else params
    if backend.offload_optimizer:
        optimizer_params = 0.0
    elif backend.replicas == "threads":
        optimizer_params = q.shape.params  # GPU 0 steps the whole model
    else:
        optimizer_params = shard_params
    work, fixed = None, None
    if q.factors.fixed_mfu is not None:
        again = 4 / 3 if q.checkpointing != "none" else 1.0
        flops = q.shape.flops_per_token(q.seq_len) * q.micro_batch * q.seq_len * again / layout.tp
        if q.core_attention_recompute and q.shape.dims is not None:
            flops += recomputed_attention_flops(q.shape.dims, q.micro_batch, q.seq_len, layout.tp)
        fixed = flops / (q.gpu.peak_flops[storage_precision(q.precision)] * q.factors.fixed_mfu)
    else:
        work = compute_work(
            q.shape,
            micro_batch=q.micro_batch,
            seq_len=q.seq_len,
            precision=storage_precision(q.precision),
            matmul_precision=q.precision,
            mixed_precision=backend.mixed_precision,
            compiled=q.compiled,
            checkpointing=q.checkpointing,
            fused_loss=_fused_loss(backend, q),
            attention=q.attention,
            gpu=q.gpu,
            tp=layout.tp,
            optimizer_params=optimizer_params,
            engine=backend.engine,
            fused_norm=q.fused_norm,
            complex_rope=q.complex_rope,
            qk_norm=q.recipe.qk_norm,
            te_fp8=q.recipe.te_fp8,
            sequence_parallel=backend.sequence_parallel,
            fp8_block_scaling=q.recipe.fp8_block_scaling,
            fp8_attention=q.recipe.fp8_attention,
            accumulate=_fused_accumulation(backend, q),
            copy_bytes=local_copy_bytes(
                q.shape,
                backend,
                layout,
                storage_precision(q.precision),
                q.micro_batch * q.seq_len,
                q.checkpointing,
                q.precision in LOW_PRECISION,
                pipelined,
            ),
        )
        ffn = expert_work(
            q.shape,
            micro_batch=q.micro_batch,
            seq_len=q.seq_len,
            tp=layout.tp,
            experts=layout.experts,
            gpu=q.gpu,
            precision=storage_precision(q.precision),
            matmul_precision=q.precision,
            fused=q.compiled,
            checkpointing=q.checkpointing,
            attention=q.attention,
            engine=backend.engine,
            stage=backend.stage,
            recipe=q.recipe,
            megatron=_megatron_moe_layer(backend),
            held_apart=backend.expert_parallel,
            accumulate=_fused_accumulation(backend, q),
        )
        work = ffn.added_to(work) if ffn is not None else work
        if q.core_attention_recompute and q.shape.dims is not None:
            work = with_core_attention_recomputed(
                work,
                q.shape.dims,
                q.gpu,
                q.attention,
                storage_precision(q.precision),
                micro_batch=q.micro_batch,
                seq_len=q.seq_len,
                tp=layout.tp,
                fp8_attention=q.recipe.fp8_attention,
            )
        if backend.options.get(NANOTRON_ENGINE) and q.shape.dims is not None:
            work = with_nanotron_step(
                work,
                q.shape.dims,
                tokens=q.micro_batch * q.seq_len,
                tp=layout.tp,
                params=params,
                optimizer_params=optimizer_params,
                data_parallel=layout.data_parallel,
                bandwidth=memory_bytes_per_s(q.gpu),
            )
        if q.attention in UNFUSED and q.shape.dims is not None:
            forward_bytes, backward_bytes = _unfused_score_bytes(backend, q, layout.tp)
            work = with_score_traffic(
                work,
                q.shape.dims,
                q.gpu,
                forward_bytes=forward_bytes,
                backward_bytes=backward_bytes,
                micro_batch=q.micro_batch,
                seq_len=q.seq_len,
                tp=layout.tp,
                recomputed=q.checkpointing == "full" or q.core_attention_recompute,
            )
        if q.shape.dims is not None:
            work = with_dropout(
                work,
                q.shape.dims,
                q.gpu,
                _dropout(backend, q),
                kernel=q.attention,
                element_bytes=Regime.of(storage_precision(q.precision), backend.mixed_precision).matmul,
                micro_batch=q.micro_batch,
                seq_len=q.seq_len,
                tp=layout.tp,
                sequence_parallel=backend.sequence_parallel,
                recompute_block=q.checkpointing == "full",
                recompute_attention=q.core_attention_recompute,
            )
    return step_time(
        work=work,
        fixed_compute_s=fixed,
        collectives=comms,
        topology=q.topology,
        host_bytes_per_s=host_bytes_per_s(q.gpu),
        backend=backend,
        micro_tokens=q.micro_batch * q.seq_len,
        grad_accum=q.grad_accum,
        data_parallel=layout.data_parallel,
        shard_params=shard_params,
        factors=q.factors,
        launches=kernel_launches(q.shape, q.checkpointing),
        sms=q.gpu.sms,
        memory_bytes_per_s=memory_bytes_per_s(q.gpu),
        pipelined=_async_tp(q, layout, backend) if pipelined else None,
        host=_host(backend, q, layout, comms),
        gpus=layout.gpus,
        host_scale=1.0 if q.factors.measured else host_slowdown(q.gpu),
    )


def _host(backend: Backend, q: Question, layout: Layout, comms: list[Collective]) -> HostIssue:
    """What the host issues in one micro-step: the model's kernels as this backend runs them, and
    the collectives (host_issue.py)."""
    kernels = micro_step_kernels(
        q.shape,
        q.checkpointing,
        compiled=q.compiled,
        autocast=backend.mixed_precision == "autocast",
        attention=q.attention,
        fused_norm=q.fused_norm,
        complex_rope=q.complex_rope,
    )
    if q.shape.dims is not None:
        kernels += dropout_kernels(q.shape.dims, _dropout(backend, q), q.attention, q.checkpointing)
        kernels += _softmax_fallback_kernels(backend, q, layout.tp)
        if q.attention in UNFUSED and backend.options.get(SCALED_SCORES):
            kernels += scaled_scores_kernels(q.shape.dims.layers, q.checkpointing == "full")
    grouped = _megatron_moe_layer(backend)  # grouped matmuls, not a Python loop
    kernels += expert_kernels(q.shape, layout.experts, grouped, q.checkpointing, q.recipe.recompute_modules)
    layer_syncs = bool(backend.options.get(LAYER_SYNCS)) and q.shape.dims is not None
    if layer_syncs:
        kernels += layer_sync_copies(q.shape.dims.layers, q.checkpointing == "full")
    compiled = q.compiled and not q.eager_launches
    measured = issue_rates(q.gpu)[0] if q.gpu is not None else None
    if backend.options.get(FULL_ITERATION_GRAPH):  # the step replayed from one graph, nothing read back mid-way
        replay = {"eager": GRAPH_REPLAY_S_PER_KERNEL, "compiled": GRAPH_REPLAY_S_PER_KERNEL}
        return host_issue(kernels, comms, compiled, q.grad_accum, replay)
    if backend.options.get(LAYER_GRAPHS) and q.shape.dims is not None:  # each layer's passes a graph's replay
        rate = (measured or HOST_S_PER_KERNEL)["compiled" if compiled else "eager"]
        return layer_graph_issue(kernels, Kernels(*ROOT_KERNELS), comms, q.grad_accum, rate, q.shape.dims.layers)
    blocking = bool(backend.options.get(LAUNCH_BLOCKING))
    synced = _synced_long_forward(q, layout, grouped, layer_syncs)
    again = None if synced is None else _synced_long_again(q, layout, grouped, synced)
    return host_issue(kernels, comms, compiled, q.grad_accum, measured, synced, blocking, again)


def _synced_long_again(q: Question, layout: Layout, grouped: bool, synced_forward: float) -> float | None:
    """Of the kernels checkpointing runs again, how many are long, where the recomputed forward reaches the
    experts' sync: full checkpointing's (the forward's own), Megatron-core's `moe` module's (the MoE blocks'
    router and experts' matmuls); None where nothing recomputed syncs."""
    if q.checkpointing == "full":
        return synced_forward
    moe = q.shape.dims.moe if q.shape.dims is not None else None
    if moe is None or "moe" not in q.recipe.recompute_modules:
        return None
    return expert_long_forward(q.shape, layout.experts, grouped) - 2 * moe.dense_layers


def _softmax_fallback_kernels(backend: Backend, q: Question, tp: int) -> Kernels:
    """The kernels Megatron's softmax launches op by op where its fused kernel is refused
    (masked_softmax.py), in every layer's forward, backward and, under full checkpointing, its
    recomputed forward."""
    if q.attention != FUSED_SOFTMAX or q.shape.dims is None:
        return Kernels()
    swapped = bool(backend.options.get(SWAPPED_SOFTMAX_CHECK))
    forward, backward = fused_softmax_kernels(q.micro_batch, q.shape.dims.heads // tp, q.seq_len, swapped)
    layers = q.shape.dims.layers
    return Kernels(forward * layers, backward * layers, forward * layers if q.checkpointing == "full" else 0)


def _unfused_score_bytes(backend: Backend, q: Question, tp: int) -> tuple[float, float]:
    """(forward, backward) bytes a score element the unfused attention moves beyond its rate: Megatron's
    softmax as its kernel runs (masked_softmax.py), ALiBi's bias through the scores' matmul (alibi_scores.py),
    a scale and a mask applied as passes of their own (scaled_scores.py)."""
    forward, backward = 0.0, 0.0
    if q.attention == FUSED_SOFTMAX:
        heads = q.shape.dims.heads // tp
        swapped = bool(backend.options.get(SWAPPED_SOFTMAX_CHECK))
        forward, backward = fused_softmax_bytes(q.micro_batch, heads, q.seq_len, swapped)
    if backend.options.get(ALIBI):
        forward += ALIBI_SCORE_BYTES
    if backend.options.get(SCALED_SCORES):
        forward += SCALED_SCORES_FORWARD_BYTES
        backward += SCALED_SCORES_BACKWARD_BYTES
    return forward, backward


def _dropout(backend: Backend, q: Question) -> Dropout:
    """The run's dropouts, and where its kernels fuse them (speed/dropout.py): into the add under
    Megatron-LM's engine, OneFlow's and a compiled model, into the softmax under OneFlow's and a
    compiled model."""
    softmax_fused = q.compiled or bool(backend.options.get(SOFTMAX_DROPOUT_FUSION))
    return Dropout(
        attention=q.recipe.attention_dropout > 0,
        hidden=q.recipe.hidden_dropout > 0,
        hidden_fused=softmax_fused or bool(backend.options.get(MEGATRON_ENGINE)),
        attention_fused=softmax_fused,
    )


def _fused_accumulation(backend: Backend, q: Question) -> bool:
    """Whether the weight gradients are added into fp32 buffers by the matmuls that compute them: Megatron-LM
    accumulating in fp32 (--bf16's default) with its gradient_accumulation_fusion, on by default (gemm.py);
    not nanotron, whose matmuls write bf16 gradients that its accumulator adds after (nanotron_step.py)."""
    engine = backend.options.get(MEGATRON_ENGINE) and not backend.options.get(NANOTRON_ENGINE)
    return bool(engine) and q.recipe.fp32_grad_accum


def _megatron_moe_layer(backend: Backend) -> bool:
    """Whether a mixture's layer is Megatron-core's: on Megatron-LM's engine, or a published run's
    (expert_compute.py's MEGATRON_MOE_LAYER)."""
    return bool(backend.options.get(MEGATRON_ENGINE) or backend.options.get(MEGATRON_MOE_LAYER))


def _synced_long_forward(q: Question, layout: Layout, grouped: bool, layer_syncs: bool) -> float | None:
    """Where the forward waits on the host (host_issue.py), how many of its forward kernels are long ones:
    the blocks' projections and attention, the head, the experts' matmuls. Each layer of `layer_syncs`
    waits on its blocking copies (LAYER_SYNCS); a mixture of experts' forward waits for its experts' token
    counts. Megatron-core's layer skips that wait only with its experts' inputs padded to their
    capacity, whose sizes are then fixed: a capacity that drops makes its sizes dynamic ("Need to sync
    output size GPU->CPU before allocating output buffer"), and its flex dispatcher, which cannot pad, reads
    the received count with `.item()` (megatron/core/transformer/moe/token_dispatcher.py @ 6a6cd478,
    MoEAlltoAllTokenDispatcher.preprocess, _DeepepManager.get_permuted_hidden_states_by_experts). The
    zoo's experts read the counts whatever the capacity."""
    dims = q.shape.dims
    moe = dims.moe if dims is not None else None
    has_experts = moe is not None and bool(moe.moe_layers)
    experts_wait = has_experts and not (moe.capacity is not None and moe.padded and grouped)
    if not (experts_wait or layer_syncs):
        return None
    dense = dims.layers * (len(block_projections(dims, 1)) + 1) + 1
    return dense + (expert_long_forward(q.shape, layout.experts, grouped) if has_experts else 0)


def plan_strategy(name: str, q: Question) -> StrategyPlan:
    """The plan of the registered strategy `name`, with the options of `q` it takes (planned_options.py:
    the compare-wide ones it has, then its own section)."""
    options = options_of(name, q.strategy_options)
    check_priced(name, options)
    return plan_backend(backend_for(name, q.shape, storage_precision(q.precision), q.gpus, options), q)


def plan_all(names: list[str], q: Question, *, asked: bool = True) -> tuple[list[StrategyPlan], dict[str, str]]:
    """The plans of `names`, and the strategies that cannot lay this question out, with why (a
    tp_size that does not divide the heads, a global batch that does not split): a strategy the
    user asked for raises that one-line error; one planned by default is left out and listed."""
    plans: list[StrategyPlan] = []
    not_planned: dict[str, str] = {}
    dense = q.shape.dims is None or q.shape.dims.moe is None
    for name in names:
        if dense and not asked and model_of(name) is not None and model_of(name).expert_parallel:
            continue  # an expert-parallel strategy is planned by default for a mixture of experts only
        try:
            plans.append(plan_default(name, q))
        except LayoutError as exc:
            if asked:
                raise
            not_planned[name] = reason_of(name, exc)
    return plans, not_planned


def plan_default(name: str, q: Question) -> StrategyPlan:
    """`name` as the default plan lays it out: where a global batch is given without micro_batch=, each
    data-parallel rank's share at once, or where that does not fit the largest micro-batch dividing it
    that does, the rest accumulated (batch_limit.accumulated); a pipeline strategy, or a tensor-parallel
    layout too large even so, over the fewest stages that fit (pipeline_default.py); a LayoutError where
    it cannot be laid out."""
    from harness.plan.memory.batch_limit import accumulated
    from harness.plan.parallel.pipeline_default import fewest_stages, staged_instead, takes_default_pipeline

    try:
        plan = plan_strategy(name, q)
    except LayoutError:
        staged = staged_instead(name, q)
        if staged is None:
            raise
        return staged
    if tries_accumulation(plan, q):
        plan = accumulated(name, q, plan) or plan
    return (fewest_stages(plan, q) or plan) if takes_default_pipeline(plan, q) else plan


def tries_accumulation(plan: StrategyPlan, q: Question) -> bool:
    """Whether plan_default, with `plan` not fitting its rank's share of the global batch at once, looks
    for a smaller micro-batch and accumulation instead (a pipeline's split stays its schedule's); a plan
    for which this holds and which still does not fit has no micro-batch that splits the batch and fits."""
    return q.split_global_batch and plan.fits is False and plan.layout.pp == 1
