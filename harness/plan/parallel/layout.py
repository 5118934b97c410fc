"""How a strategy lays a model over the GPUs: the degree of tensor parallelism, the group
that shards the model states, hpZ's secondary group and the groups each collective runs over.

A torch mesh preset (fsdp, hsdp, fsdp-tp, ddp-tp, zero1-tp, fsdp-pp, fsdp-cp: its options name its
`mesh_dims`) is laid out by the runtime's own `dims_for` (strategies/parallel_dims.py), with the
model's blocks and heads, so the plan prices the sizes a run would take and refuses, in the same
words, the sizes a run would refuse. The other strategies' sizes come from their options (tp_size,
shard_size, zero_hpz_partition_size, a published run's pp_size and cp_size), by default one node's
GPUs. A tensor-parallel group may span the NVLink domain (a GB200 NVL72 rack's 72 GPUs, not one
tray's 4), and a group inside the domain communicates over NVLink (`Topology.per_domain`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.common.numbers import is_whole
from harness.plan.model.model_shape import ModelShape, PlanError, TransformerDims
from harness.plan.network.fabric import Group, Topology
from harness.plan.parallel.backends import Backend, planner_models
from harness.plan.parallel.expert_layout import NONE, ExpertLayout, ExpertLayoutError, expert_layout
from strategies.accelerate.fsdp_tp_mode import accelerate_tp, no_shard_ranks, shard_ranks_left
from strategies.mesh_layout import MeshError, default_stages
from strategies.parallel_dims import TENSOR, ModelFacts, dims_for, mesh_dims

MESH_OPTION = "mesh_dims"  # the option a torch mesh preset fixes: the dimensions it lays out


class LayoutError(PlanError):
    """A strategy that cannot lay this question out (its sizes do not divide the GPUs, the heads,
    the global batch): an error where the strategy was asked for, a listed omission otherwise."""


def reason_of(name: str, exc: LayoutError) -> str:
    """Why strategy `name` cannot lay a question out, without the name some reasons begin with: the
    lines that say it name the strategy once."""
    return str(exc).removeprefix(f"{name}: ")


@dataclass(frozen=True)
class Layout:
    tp: int  # GPUs splitting each matmul (1: no tensor parallelism)
    shard: int  # GPUs the model states are sharded over (the ZeRO stage's group)
    replicas: int  # copies of the sharded model (hybrid sharding; data parallel groups of the shards)
    hpz: int  # hpZ's secondary group (1: none)
    shard_group: Group
    replica_group: Group  # one GPU of every shard group: where the shards' gradients are all-reduced
    tp_group: Group
    hpz_group: Group
    pp: int = 1  # pipeline stages (pipeline_context.py)
    cp: int = 1  # GPUs each sequence is split over; they share the shard group with data parallel
    experts: ExpertLayout = NONE  # a mixture of experts' routed experts (expert_layout.py)

    @property
    def data_parallel(self) -> int:
        """GPUs each holding a different part of the batch (context parallel's share one sequence)."""
        return self.shard * self.replicas // self.cp

    @property
    def gpus(self) -> int:
        return self.tp * self.shard * self.replicas * self.pp


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _size(backend: Backend, option: str, default: int) -> int:
    if not backend.size_given(option):
        return default
    value = backend.options[option]
    if not is_whole(value):
        raise PlanError(f"{backend.name}: {option}={value!r} must be a whole number of GPUs, e.g. {option}={default}")
    return value


def _default_tp(backend: Backend, shape: ModelShape, topology: Topology) -> int:
    """tp where tp_size is not given. Accelerate's tensor parallel sizes its mesh as fsdp-tp does
    (strategies/accelerate/fsdp_tp_mode.py): dims_for's largest tp up to a node that splits the heads, lowered
    where it would leave Accelerate's FSDP2 no ranks to shard over, so that it is planned at the tp its run
    takes. A published run's layout: a node's GPUs."""
    per_node = min(topology.per_node, topology.gpus)
    if not backend.via_accelerate or shape.dims is None:
        return per_node
    return accelerate_tp(heads_tp(shape, topology), topology.gpus)


def heads_tp(shape: ModelShape, topology: Topology) -> int:
    """fsdp-tp's default tp (strategies/parallel_dims.py): the largest up to a node that splits the heads."""
    if shape.dims is None:
        return 1
    facts = ModelFacts(shape.dims.layers, shape.dims.heads, shape.dims.kv_heads)
    return dims_for("fsdp", "shard x tp", {}, topology.gpus, topology.per_node, facts).tp


def _dp_group(topology: Topology, size: int, stride: int) -> Group:
    """A group of `size` GPUs taking every `stride`-th GPU: inside a node where they fit, else the
    same number of each node's GPUs."""
    if size <= 1:
        return Group(1, 1)
    in_one_node = max(1, topology.per_domain // stride)
    return Group(size, 1) if size <= in_one_node else Group(size, -(-size // in_one_node))


def layout_of(backend: Backend, shape: ModelShape, topology: Topology) -> Layout:
    """The layout `backend` gives `shape` on `topology`; a size that does not divide is a one-line error."""
    gpus, per_node = topology.gpus, min(topology.per_node, topology.gpus)
    if backend.replicas == "threads" and topology.nodes > 1:
        raise LayoutError(
            f"{backend.name}: one process drives every GPU (its replicas are threads), so it runs inside one node: "
            f"not planned beyond {topology.per_node} GPUs (gpus={gpus} on {topology.nodes} nodes)"
        )
    if MESH_OPTION in backend.options:
        return _mesh_layout(backend, shape, topology)
    tp = _size(backend, "tp_size", _default_tp(backend, shape, topology)) if backend.tensor_parallel else 1
    if gpus % tp:
        raise LayoutError(
            f"{backend.name}: tp_size={tp} does not divide gpus={gpus}: use one of "
            f"{_tensor_parallel_sizes(shape, topology)}"
        )
    _check_tensor_parallel(backend, shape, topology, tp)
    if backend.via_accelerate and not shard_ranks_left(tp, gpus):
        raise LayoutError(no_shard_ranks(tp, gpus))
    # DeepSpeed's pipeline and a published run's pipeline and context-parallel sizes (others leave
    # them, as tp_size is left by a strategy without tensor parallelism).
    pp = cp = 1
    if pipelines(backend):  # zero1-pp defaults as its run does: a stage per node, two on one
        registered = "pp_size" in backend.options
        layers = shape.dims.layers if shape.dims else None
        pp = _size(backend, "pp_size", default_stages(gpus, topology.nodes, layers) if registered else 1)
    if splits_sequences(backend):
        cp = _size(backend, "cp_size", 1)
    if gpus % (tp * pp * cp):
        raise LayoutError(
            f"{backend.name}: tp_size={tp} x pp_size={pp} x cp_size={cp} does not divide gpus={gpus}: "
            f"use sizes whose product is one of {_divisors(gpus)}"
        )
    data_parallel = gpus // (tp * pp)  # FSDP shards over the data-parallel and context-parallel ranks
    shard = data_parallel
    if backend.hybrid_shard:
        shard = _size(backend, "shard_size", max(1, per_node // tp))
        if data_parallel % shard:
            raise LayoutError(
                f"{backend.name}: shard_size={shard} does not divide the {data_parallel} data-parallel GPUs "
                f"(gpus={gpus} / tp {tp}): use one of {_divisors(data_parallel)}"
            )
    hpz = 1
    if backend.secondary_partition:
        hpz = _size(backend, "zero_hpz_partition_size", per_node)
        domain = min(topology.per_domain, gpus)  # a node's GPUs, or an NVL72 rack's: the copy's gathers on NVLink
        if gpus % hpz or domain % hpz:
            where = "a node" if domain == per_node else "an NVLink domain"
            raise LayoutError(
                f"{backend.name}: zero_hpz_partition_size={hpz} must divide gpus={gpus} and tile {where} of {domain}: "
                f"use one of {_divisors(domain)}"
            )
    replicas = data_parallel // shard
    _check_mixture_split(backend, shape, max(tp, pp, cp))
    return Layout(
        experts=_experts(backend, shape, topology, gpus // pp, tp),
        tp=tp,
        shard=shard,
        replicas=replicas,
        hpz=hpz,
        shard_group=topology.block(shard, tp),
        replica_group=_dp_group(topology, replicas, tp * shard) if replicas > 1 else Group(1, 1),
        tp_group=topology.consecutive(tp),
        hpz_group=topology.block(hpz),
        pp=pp,
        cp=cp,
    )


def _check_mixture_split(backend: Backend, shape: ModelShape, largest: int) -> None:
    """A registered strategy does not cut a mixture of experts for tensor, pipeline or context
    parallel (models/moe.py: its experts have no tensor-parallel plan, and the pipeline and
    context-parallel cuts take the GPT alone); a published run's layout (Megatron-core's) is planned
    as it ran."""
    mixture = shape.dims is not None and shape.dims.moe is not None
    if largest > 1 and mixture and backend.measured_as in planner_models():
        raise LayoutError(
            f"{backend.name}: tensor, pipeline or context parallel beside a mixture of experts is not planned yet: "
            "plan its experts with expert parallel alone (ddp-ep, fsdp-ep, zero1-ep, zero2-ep) or fsdp or zero3"
        )


def _experts(backend: Backend, shape: ModelShape, topology: Topology, ranks: int, tp: int) -> ExpertLayout:
    try:
        return expert_layout(backend, shape, topology, ranks, tp)
    except ExpertLayoutError as exc:
        raise LayoutError(str(exc)) from None


def _check_tensor_parallel(backend: Backend, shape: ModelShape, topology: Topology, tp: int) -> None:
    """What the planner needs of a tensor-parallel group beside what the run checks: a group
    inside a node or an NVLink domain (or whole ones), a transformer it knows, whose heads and MLP
    width tp divides. Each refusal names the sizes that pass every check."""
    if _splits_domain(topology, tp):
        where = "a node's" if topology.per_domain == min(topology.per_node, topology.gpus) else "an NVLink domain's"
        raise LayoutError(
            f"{backend.name}: tp_size={tp} splits {where} {topology.per_domain} GPUs between two tensor-parallel "
            f"groups: use one of {_tensor_parallel_sizes(shape, topology)}"
        )
    if tp == 1:
        return
    if shape.dims is None:
        raise LayoutError(f"{backend.name}: tensor parallelism needs a transformer the planner knows the layers of")
    undivided = _undivided(shape.dims, tp)
    if undivided:
        raise LayoutError(
            f"{backend.name}: tp_size={tp} does not divide the model's {undivided}: "
            f"use one of {_tensor_parallel_sizes(shape, topology)}"
        )


def _splits_domain(topology: Topology, tp: int) -> bool:
    """Whether a tensor-parallel group of `tp` reaches past a node yet is neither inside one NVLink domain
    nor whole domains."""
    per_node, domain = min(topology.per_node, topology.gpus), topology.per_domain
    return tp > per_node and bool(domain % tp if tp <= domain else tp % domain)


def _undivided(dims: TransformerDims, tp: int) -> str:
    """The model's counts `tp` does not divide, named as the run's refusal names them ('2 key/value
    heads'; the key/value heads only where they differ from the heads): those it divides are no
    trouble, so naming them would mislead. Empty where tp divides all."""
    kv_heads = [("key/value heads", dims.kv_heads)] if dims.kv_heads != dims.heads else []
    counts = [("attention heads", dims.heads), *kv_heads, ("MLP width", dims.ffn_width)]
    return " and ".join(f"{count} {what}" for what, count in counts if count % tp)


def _tensor_parallel_sizes(shape: ModelShape, topology: Topology) -> str:
    """The tensor-parallel sizes `_check_tensor_parallel` takes here, among those dividing the GPUs."""
    gpus, dims = topology.gpus, shape.dims
    sizes = [
        d
        for d in range(1, gpus + 1)
        if gpus % d == 0
        and not _splits_domain(topology, d)
        and (d == 1 or (dims is not None and not _undivided(dims, d)))
    ]
    return ", ".join(map(str, sizes))


def _mesh_layout(backend: Backend, shape: ModelShape, topology: Topology) -> Layout:
    """A torch mesh preset's layout, sized by the runtime's dims_for; FSDP shards over the data- and
    context-parallel ranks (replicated across hsdp's replicas), replicate and zero1 reduce over them."""
    moe = shape.dims.moe if shape.dims else None
    facts = (
        ModelFacts(shape.dims.layers, shape.dims.heads, shape.dims.kv_heads, moe.experts if moe else None)
        if shape.dims
        else None
    )
    # The planner's options may say a size is its default as 0 or "auto" too.
    options = {k: None if k.endswith("_size") and v in (0, "auto") else v for k, v in backend.options.items()}
    tp = options.get("tp_size")
    if is_whole(tp) and topology.gpus % tp:
        # In the run's words, but naming the sizes every check here takes: the run's own list (the
        # world's divisors) has sizes the heads or an NVLink domain refuse next.
        raise LayoutError(
            f"{backend.name}: strategy_options.tp_size={tp} does not divide the world size {topology.gpus}: use one "
            f"of {_tensor_parallel_sizes(shape, topology)}"
        )
    try:
        dims = dims_for(options["engine"], options[MESH_OPTION], options, topology.gpus, topology.per_node, facts)
    except MeshError as exc:
        raise LayoutError(f"{backend.name}: {exc}") from None
    _check_tensor_parallel(backend, shape, topology, dims.tp)
    hybrid = options["engine"] == "fsdp" and dims.dp_replicate > 1
    shard = dims.dp_shard * dims.cp if hybrid else dims.data_parallel * dims.cp
    replicas = dims.dp_replicate if hybrid else 1
    _check_mixture_split(backend, shape, max(dims.tp, dims.pp, dims.cp))
    mesh_ep = {**backend.options, "ep_size": dims.ep} if backend.expert_parallel else backend.options
    return Layout(
        experts=_experts(replace(backend, options=mesh_ep), shape, topology, topology.gpus // dims.pp, dims.tp),
        tp=dims.tp,
        shard=shard,
        replicas=replicas,
        hpz=1,
        shard_group=topology.block(shard, dims.tp),
        replica_group=_dp_group(topology, replicas, dims.tp * shard) if replicas > 1 else Group(1, 1),
        tp_group=topology.consecutive(dims.tp),
        hpz_group=topology.in_node(1),
        pp=dims.pp,
        cp=dims.cp,
    )


def _mesh_of(backend: Backend) -> str | None:
    """A torch mesh preset's `mesh_dims` (strategies/torch_mesh.py): its options say it once filled in
    (backend_for), the registry of a bare model_of; None for any other strategy."""
    if MESH_OPTION in backend.options:
        return backend.options[MESH_OPTION]
    from strategies.registry import default_registry

    registry = default_registry()
    name = backend.measured_as
    return registry.get(name).options.get(MESH_OPTION) if name in registry.names() else None


def is_mesh_preset(backend: Backend) -> bool:
    """A torch mesh preset (strategies/torch_mesh.py): it takes any size that divides the world."""
    return _mesh_of(backend) is not None


def sizes_tp_itself(backend: Backend) -> bool:
    """Whether `backend` lays out tensor parallel where no tp_size is given: any tensor-parallel
    strategy but a mesh preset whose mesh does not name tp (fsdp-ep's "shard x ep" and ddp-ep's
    "replicate x ep" take tp_size, yet without it run at tp 1 whatever the model's heads)."""
    mesh = _mesh_of(backend)
    return backend.tensor_parallel and (mesh is None or TENSOR in mesh_dims(mesh))


def splits_model(backend: Backend) -> bool:
    """Whether pipeline and context parallelism are planned for `backend`: a torch mesh preset, or a
    published run's FSDP2 sharding the whole model over its ranks, as torchtitan composes them."""
    return is_mesh_preset(backend) or (
        backend.fsdp2_units
        and backend.stage == 3
        and not backend.hybrid_shard
        and not backend.secondary_partition
        and not backend.via_accelerate
    )


def splits_sequences(backend: Backend) -> bool:
    """Whether context parallelism is planned for `backend`: the FSDP2 layouts above, and Megatron-LM's
    context parallel in a published run."""
    return splits_model(backend) or backend.context_parallel_engine


def replicates_tensor_parallel(backend: Backend) -> bool:
    """Megatron-LM's layout on FSDP2's machinery: tensor parallel beside replicated (ddp-tp) or
    ZeRO-1 (zero1-tp) data parallelism."""
    return backend.fsdp2_units and backend.stage in (0, 1) and backend.tensor_parallel and not backend.via_accelerate


def pipelines(backend: Backend) -> bool:
    """Whether pipeline parallelism is planned for `backend`: the layouts above (ddp-tp and zero1-tp
    with pp_size are Megatron-LM's layout, priced as a published Megatron-LM run's pipeline),
    Megatron-LM's layouts declared by a plugin (DDP or ZeRO-1 with tensor parallel inside each
    stage), and DeepSpeed's pipeline engine with ZeRO-1 inside each stage (zero1-pp); the last two
    take no context parallelism."""
    return splits_model(backend) or backend.pipeline_engine or replicates_tensor_parallel(backend)
