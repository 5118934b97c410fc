"""The torch layouts as one mesh: pp x replicate x shard x cp x tp, outermost first, as torchtitan's
ParallelDims lays them out (the last dimension varies fastest, so tensor parallel stays inside a
node and the pipeline crosses nodes), and the engine that runs data parallelism over replicate x
shard (x cp): FSDP2, torch's `replicate` (DDP on FSDP2's machinery) or ZeRO-1.

Plain data, no torch. `dims_for` is the one place a layout's sizes default: the runtime, the
preflight, the run's header and the planner all call it, with what they know of the model
(`ModelFacts`: its blocks, heads and experts), so that what is planned is what runs. Each preset names the
dimensions it lays out (`mesh_dims`: "shard x tp" for fsdp-tp); those default as below, any other
dimension the run may size with its option (tp_size, pp_size, cp_size, shard_size, ep_size), and the
data-parallel dimension takes the ranks left.

| dimension | option | default where the preset names it |
|---|---|---|
| tp | tp_size | a node's ranks, at most 8, dividing the heads and key/value heads |
| cp | cp_size | a node's ranks left by tp, at most 8, sharing out the heads tp leaves each rank (ring: any) |
| pp | pp_size | a stage per node, 2 on one node, never more stages than the model's blocks |
| shard (hsdp) | shard_size | a node's ranks left by tp and cp |
| ep | ep_size | the most data-parallel ranks that divide the model's experts |

Expert parallel is not a dimension of its own: as torchtitan's ParallelDims has it, ep is borrowed
from the data-parallel ranks (shard under FSDP2, replicate under the other engines), which read
different tokens; its ranks split each MoE layer's experts, and the experts' own parameters are
then sharded (or replicated) by the engine over the ranks holding the same experts. The layout
shows it inside the dimension it is borrowed from: shard x ep, the ep ranks varying fastest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from strategies.mesh_layout import MeshError, MeshLayout, check_divides, default_stages, divisors
from strategies.pipeline_parts import SCHEDULES

PIPELINE, REPLICATE, SHARD, CONTEXT, TENSOR, EXPERT = "pp", "replicate", "shard", "cp", "tp", "ep"
DIMS = (PIPELINE, REPLICATE, SHARD, CONTEXT, TENSOR)  # their product is the world
NAMED = (*DIMS, EXPERT)  # what a preset's mesh may name
DATA_DIMS = (REPLICATE, SHARD)
# The option that sizes each dimension (replicate takes the ranks left, or hsdp's shard_size says).
SIZE_OPTIONS = {TENSOR: "tp_size", CONTEXT: "cp_size", PIPELINE: "pp_size", SHARD: "shard_size"}
ENGINES = ("fsdp", "replicate", "zero1")
MAX_DEFAULT_TP = 8  # tensor parallel pays inside a node's NVLink domain, rarely past 8 GPUs
MAX_DEFAULT_CP = 8  # the all-to-alls of every layer stay inside a node's NVLink domain
DEFAULT_SCHEDULE = "1f1b"
DEFAULT_CP_ATTENTION = "all-to-all"  # models/context_parallel.py: all-to-all, or ring (GPUs only)
WHAT = {TENSOR: "tensor parallel", CONTEXT: "context parallel", PIPELINE: "pipeline"}


@dataclass(frozen=True)
class ModelFacts:
    """What the layout needs to know of the model: its blocks (the most pipeline stages), its
    attention heads (what tensor and context parallel split) and its experts (what expert parallel
    splits). None: not known, not checked."""

    blocks: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    experts: int | None = None  # the experts of each MoE layer (their greatest common divisor); None: none

    @classmethod
    def of(cls, model: Any, blocks: int | None) -> ModelFacts:
        """The facts of a built model (parabench's GPT, an `hf:` model) with `blocks` found."""
        from models.routing import experts_modules

        config = getattr(model, "config", None)
        heads = _first_int(config, "n_head", "num_attention_heads")
        kv_heads = _first_int(config, "num_key_value_heads", "n_kv_head") or heads
        experts = math.gcd(*(module.num_experts for _, module in experts_modules(model))) or None
        return cls(blocks or None, heads, kv_heads, experts)

    def head_counts(self) -> dict[str, int]:
        """{'attention heads': n, 'key/value heads': m} as far as known, the second where it differs."""
        counts = {}
        if self.heads:
            counts["attention heads"] = self.heads
        if self.kv_heads and self.kv_heads != self.heads:
            counts["key/value heads"] = self.kv_heads
        return counts


def _first_int(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1  # borrowed from the data-parallel ranks (expert_ranks), not a factor of the world

    def __post_init__(self) -> None:
        sizes = self.sizes()
        if any(size < 1 for size in sizes.values()) or math.prod(sizes.values()) != self.world_size:
            shown = " x ".join(f"{dim} {size}" for dim, size in sizes.items())
            raise MeshError(f"{shown} does not lay out {self.world_size} ranks: their product must be the world size")
        if self.ep < 1 or (self.dp_shard % self.ep and self.dp_replicate % self.ep):
            raise MeshError(f"ep {self.ep} divides neither replicate {self.dp_replicate} nor shard {self.dp_shard}")

    def sizes(self) -> dict[str, int]:
        """Each dimension's size, outermost first."""
        return {
            PIPELINE: self.pp,
            REPLICATE: self.dp_replicate,
            SHARD: self.dp_shard,
            CONTEXT: self.cp,
            TENSOR: self.tp,
        }

    @property
    def data_parallel(self) -> int:
        """Ranks that read different micro-batches."""
        return self.dp_replicate * self.dp_shard

    def expert_ranks(self, engine: str) -> int:
        """The data-parallel ranks ep is borrowed from: FSDP2's shard dimension (hsdp's replicas
        each hold every expert, as torchtitan's efsdp leaves dp_replicate out), the replicas of the
        other engines."""
        return self.dp_shard if engine == "fsdp" else self.dp_replicate

    @classmethod
    def from_layout(cls, layout: MeshLayout, engine: str) -> ParallelDims:
        """The dims a MeshLayout of `mesh_layout` lays out (the flat layout: every rank FSDP's)."""
        sizes = dict(zip(layout.dims, layout.shape, strict=True))
        data = sizes.pop("data", None)
        borrowed = SHARD if engine == "fsdp" else REPLICATE
        if data is not None:
            sizes[borrowed] = data
        ep = sizes.pop(EXPERT, 1)
        sizes[borrowed] = sizes.get(borrowed, 1) * ep
        return cls(
            layout.size,
            pp=sizes.get(PIPELINE, 1),
            dp_replicate=sizes.get(REPLICATE, 1),
            dp_shard=sizes.get(SHARD, 1),
            cp=sizes.get(CONTEXT, 1),
            tp=sizes.get(TENSOR, 1),
            ep=ep,
        )


def mesh_dims(mesh: str) -> tuple[str, ...]:
    """The dimensions a preset's `mesh` ("replicate x tp") names, each checked."""
    named = tuple(part.strip() for part in mesh.split("x"))
    unknown = [dim for dim in named if dim not in NAMED]
    if unknown or not named:
        raise MeshError(f"mesh {mesh!r} names {', '.join(unknown) or 'nothing'}: its dimensions are {', '.join(NAMED)}")
    return named


def virtual_stages(options: dict[str, Any]) -> int:
    """Stages each pipeline rank holds under the options' schedule (one for a schedule that is not
    one: the strategy refuses it in its own words)."""
    return SCHEDULES.get(options.get("schedule") or DEFAULT_SCHEDULE, ("", 1))[1]


def syncs_each_micro_step(engine: str, given: bool | None, pipelined: bool = False) -> bool:
    """Whether gradients are reduced on every micro-step of accumulation: as `given`, else FSDP's
    way (reduce-scatter each micro-step, as torchtitan and ZeRO-3 do), DDP's for replicate and zero1
    (all-reduce on the last alone), and always under a pipeline, whose schedule reduces at the end
    of each run."""
    if given is not None:
        return given
    return engine == "fsdp" or pipelined


def dims_for(
    engine: str,
    mesh: str,
    options: dict[str, Any],
    world_size: int,
    per_node: int,
    model: ModelFacts | None = None,
) -> ParallelDims:
    """The sizes of a preset (`engine` over the dimensions `mesh` names) with the run's `options` on
    `world_size` ranks, `per_node` of them on each node; a MeshError (one line, naming sizes that
    would fit) where the options do not fit the world or the model."""
    if engine not in ENGINES:
        raise MeshError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    named = mesh_dims(mesh)
    facts = model or ModelFacts()
    virtual = virtual_stages(options)
    per_node = max(1, min(per_node, world_size))
    nodes = max(1, world_size // per_node)
    given = {
        dim: check_divides(option, options[option], world_size)
        for dim, option in SIZE_OPTIONS.items()
        if options.get(option) is not None
    }
    _check_product(given, world_size)
    sizes = dict(given)
    left = world_size // math.prod(given.values())
    attention = options.get("cp_attention") or DEFAULT_CP_ATTENTION
    if TENSOR in named and TENSOR not in sizes:
        cp = sizes.get(CONTEXT, 1)  # a given cp shares out the heads tp leaves each rank

        def tp_fits(d: int) -> bool:
            return splits_heads(d, facts) and shares_heads(cp, facts, d, attention)

        sizes[TENSOR] = _largest(min(MAX_DEFAULT_TP, per_node), left, per_node, tp_fits)
        left //= sizes[TENSOR]
    tp = sizes.get(TENSOR, 1)
    if CONTEXT in named and CONTEXT not in sizes:
        cap = min(MAX_DEFAULT_CP, max(1, per_node // tp))
        sizes[CONTEXT] = _largest(cap, left, per_node, lambda d: shares_heads(d, facts, tp, attention))
        left //= sizes[CONTEXT]
    if PIPELINE in named and PIPELINE not in sizes:
        sizes[PIPELINE] = default_stages(left, nodes, facts.blocks, virtual)
        left //= sizes[PIPELINE]
    hybrid = engine == "fsdp" and REPLICATE in named
    if hybrid and SHARD not in sizes:
        inside = max(1, per_node // (tp * sizes.get(CONTEXT, 1)))
        sizes[SHARD] = max(d for d in divisors(left) if d <= inside)
        left //= sizes[SHARD]
    if engine == "fsdp" and not hybrid:
        sizes[SHARD] = sizes.get(SHARD, 1) * left
    else:
        sizes[REPLICATE] = left
    dims = ParallelDims(
        world_size,
        pp=sizes.get(PIPELINE, 1),
        dp_replicate=sizes.get(REPLICATE, 1),
        dp_shard=sizes.get(SHARD, 1),
        cp=sizes.get(CONTEXT, 1),
        tp=tp,
    )
    dims = replace(dims, ep=expert_parallel_size(engine, named, options, dims, facts))
    check_model_fits(dims, facts, virtual, attention)
    check_options(dims, options)
    return dims


def expert_parallel_size(
    engine: str, named: tuple[str, ...], options: dict[str, Any], dims: ParallelDims, facts: ModelFacts
) -> int:
    """ep: the run's ep_size, checked against the world, the engine, the data-parallel ranks it is
    borrowed from and the model's experts; else, where the preset names ep, the most of those
    ranks that divide the experts; else 1."""
    ranks = dims.expert_ranks(engine)
    fits = [d for d in divisors(ranks) if facts.experts is None or facts.experts % d == 0]
    given = options.get("ep_size")
    if given is None and EXPERT in named and dims.cp == 1:
        return max(fits)
    if given is None:
        return 1
    ep = check_divides("ep_size", given, dims.world_size)
    if ep == 1:
        return ep
    if dims.cp > 1:
        # The ranks holding the same experts would be shard x cp around ep on the device mesh,
        # which FSDP2 cannot join to the experts' ep mesh in one ordered mesh.
        raise MeshError(
            f"strategy_options.ep_size={ep} beside cp_size={dims.cp} is not laid out: expert parallel takes its "
            "ranks from the data-parallel ones alone; drop strategy_options.cp_size or ep_size"
        )
    choices = " or ".join(map(str, fits))
    if engine == "zero1":
        raise MeshError(
            f"strategy_options.ep_size={ep} does not go with the zero1 engine: its ZeroRedundancyOptimizer "
            "broadcasts each parameter to every data-parallel rank, and expert parallel gives those ranks different "
            "experts; use ddp-ep or fsdp-ep"
        )
    if ranks % ep:
        dim = SHARD if engine == "fsdp" else REPLICATE
        raise MeshError(
            f"strategy_options.ep_size={ep} does not divide the {ranks} data-parallel ranks of {dim} it is taken "
            f"from (tp, cp and pp ranks are not): use strategy_options.ep_size={choices}"
        )
    if facts.experts is not None and facts.experts % ep:
        raise MeshError(
            f"strategy_options.ep_size={ep} does not divide the model's {facts.experts} experts: use "
            f"strategy_options.ep_size={choices}"
        )
    return ep


def microbatch_count(pp: int, microbatches: Any, micro_batch: int) -> int:
    """The micro-batches one run of a pipeline's schedule takes over `pp` stages: `microbatches`, or
    one a stage; refused in one line where they do not divide the `micro_batch` sequences a pipeline
    step runs (torch's schedules and DeepSpeed's engine alike)."""
    count = pp if microbatches is None else microbatches
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise MeshError(f"strategy_options.microbatches={microbatches} must be a whole number >= 1")
    if micro_batch % count:
        raise MeshError(
            f"strategy_options.microbatches={count} does not divide the micro-batch of {micro_batch} sequences each "
            "pipeline step runs: set micro_batch= to a multiple of it"
        )
    return count


def pipeline_microbatches(pp: int, schedule: str, microbatches: Any, micro_batch: int) -> int:
    """`microbatch_count` under torch's `schedule`, refused where the schedule cannot run them (1F1B
    fewer than the stages, the looped schedules a count that is not whole rounds of them:
    torch.distributed.pipelining refuses both)."""
    count = microbatch_count(pp, microbatches, micro_batch)
    if schedule == "1f1b" and count < pp:
        raise MeshError(
            f"schedule 1f1b needs at least one micro-batch per stage: set strategy_options.microbatches >= "
            f"pp_size={pp}, or schedule=gpipe"
        )
    if SCHEDULES[schedule][1] > 1 and count % pp:
        raise MeshError(
            f"schedule {schedule} runs micro-batches in rounds of pp_size={pp}: set strategy_options.microbatches "
            f"to a multiple of {pp}"
        )
    return count


def check_options(dims: ParallelDims, options: dict[str, Any]) -> None:
    """Refuse, in one line, an option the layout has nothing to apply to (a schedule without a
    pipeline) or that contradicts it (no gradient sync on a micro-step under a pipeline, whose
    schedule reduces at the end of each run)."""
    schedule = options.get("schedule")
    if schedule is not None and schedule not in SCHEDULES:
        raise MeshError(f"strategy_options.schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
    if dims.pp == 1:
        given = [f"{key}={options[key]}" for key in ("schedule", "microbatches") if options.get(key) is not None]
        if given:
            raise MeshError(
                f"strategy_options.{given[0]} runs a pipeline, and this layout has pp 1: set strategy_options.pp_size "
                "too, or drop it"
            )
    elif options.get("sync_each_micro_step") is False:
        raise MeshError(
            "strategy_options.sync_each_micro_step=false does not apply under a pipeline: the schedule reduces the "
            "gradients at the end of each of its runs; drop it, or set pp_size=1"
        )
    attention = options.get("cp_attention") or DEFAULT_CP_ATTENTION
    if attention != DEFAULT_CP_ATTENTION and dims.cp == 1:
        raise MeshError(
            f"strategy_options.cp_attention={attention} splits sequences, and this layout has cp 1: set "
            "strategy_options.cp_size too, or drop it"
        )


def _largest(cap: int, ranks: int, per_node: int, fits: Callable[[int], bool]) -> int:
    """The largest size up to `cap` dividing the ranks left and a node's ranks that `fits`."""
    return max(d for d in divisors(ranks) if d <= cap and per_node % d == 0 and fits(d))


def splits_heads(tp: int, facts: ModelFacts) -> bool:
    """Whether tp ranks each compute whole attention and key/value heads."""
    return all(count % tp == 0 for count in facts.head_counts().values())


def shares_heads(cp: int, facts: ModelFacts, tp: int, attention: str) -> bool:
    """Whether the all-to-all gives each of cp ranks whole heads of those a tensor-parallel rank
    holds: the attention heads, and the key/value heads or, fewer than the ranks, one each repeated
    (models/all_to_all_attention.py). The ring splits the sequence, not the heads."""
    if attention == "ring" or not facts.heads:
        return True
    heads = facts.heads // tp
    kv_heads = max(1, (facts.kv_heads or facts.heads) // tp)
    return heads % cp == 0 and (kv_heads % cp == 0 or cp % kv_heads == 0)


def context_heads_error(cp: int, facts: ModelFacts, tp: int, attention: str) -> str | None:
    """Why cp ranks cannot share out the heads each tensor-parallel rank holds under `attention`
    (shares_heads), in one line; None where they can. The planner refuses with the same words."""
    if shares_heads(cp, facts, tp, attention):
        return None
    assert facts.heads is not None
    heads = facts.heads // tp
    fits = [d for d in divisors(heads) if shares_heads(d, facts, tp, attention)]
    whose = "each tensor-parallel rank's" if tp > 1 else "the model's"
    kv = f" and {max(1, facts.kv_heads // tp)} key/value heads" if "key/value heads" in facts.head_counts() else ""
    return (
        f"strategy_options.cp_size={cp} does not share out {whose} {heads} attention heads{kv} "
        f"(the all-to-all gives each rank whole heads): use strategy_options.cp_size={' or '.join(map(str, fits))}"
        ", or strategy_options.cp_attention=ring"
    )


def _check_product(given: dict[str, int], world_size: int) -> None:
    if len(given) < 2 or world_size % math.prod(given.values()) == 0:
        return
    product = math.prod(given.values())
    named = " x ".join(f"{SIZE_OPTIONS[dim]}={size}" for dim, size in given.items())
    fits = ", ".join(map(str, divisors(world_size)))
    raise MeshError(
        f"strategy_options.{named} = {product} ranks does not divide the world size {world_size}: use sizes whose "
        f"product is one of {fits} (or launch a world size that {product} divides)"
    )


def check_model_fits(dims: ParallelDims, facts: ModelFacts, virtual: int = 1, attention: str = "all-to-all") -> None:
    """Refuse, in one line, sizes the model cannot take: tp and cp must leave each rank whole
    heads, and the pipeline each stage a block."""
    counts = facts.head_counts()
    if not splits_heads(dims.tp, facts):
        fits = [d for d in divisors(max(counts.values())) if splits_heads(d, facts)]
        # Name only the counts tp leaves uneven: the ones it divides are not the trouble.
        what = " and ".join(f"{count} {name}" for name, count in counts.items() if count % dims.tp)
        raise MeshError(
            f"strategy_options.tp_size={dims.tp} does not divide the model's {what}: use strategy_options.tp_size="
            f"{' or '.join(map(str, fits))} (each rank of a tensor-parallel group computes whole heads)"
        )
    unshared = context_heads_error(dims.cp, facts, dims.tp, attention)
    if unshared is not None:
        raise MeshError(unshared)
    stages = dims.pp * virtual
    if facts.blocks is not None and stages > facts.blocks:
        each = f" ({dims.pp} ranks x {virtual} virtual stages)" if virtual > 1 else ""
        raise MeshError(
            f"{stages} pipeline stages need at least {stages} blocks{each}, and the model has {facts.blocks}: use a "
            "smaller strategy_options.pp_size, a schedule without virtual stages, or a deeper model"
        )


def mesh_layout(
    engine: str,
    mesh: str,
    options: dict[str, Any],
    world_size: int,
    per_node: int,
    model: ModelFacts | None = None,
    plain: str = "fsdp",
) -> MeshLayout:
    """The MeshLayout the run, its header and summary.json read: the preset's named dimensions and
    any other of more than one rank, with notes for a dimension of one and for a default worth
    saying. `plain`: what the engine alone is called (fsdp, ddp...), for those notes."""
    dims = dims_for(engine, mesh, options, world_size, per_node, model)
    named = mesh_dims(mesh)
    sizes = dims.sizes()
    data = (REPLICATE,) if engine != "fsdp" else tuple(d for d in DATA_DIMS if d in named) or (SHARD,)
    shown = tuple(d for d in DIMS if d in named or d in data or sizes[d] > 1)
    if shown == (SHARD,) and dims.ep == 1 and EXPERT not in named:
        return MeshLayout.flat(world_size)  # plain fsdp: every rank a data-parallel rank, as ddp's
    notes = _notes(dims, engine, named, options, per_node, plain)
    shape, laid_out = [], []
    borrowed = SHARD if engine == "fsdp" else REPLICATE
    for dim in shown:
        if dim == borrowed and (dims.ep > 1 or EXPERT in named):  # ep inside it, varying fastest
            shape += [sizes[dim] // dims.ep, dims.ep]
            laid_out += [dim, EXPERT]
        else:
            shape.append(sizes[dim])
            laid_out.append(dim)
    data_dims = tuple(d for d in laid_out if d in (*DATA_DIMS, EXPERT))
    return MeshLayout(tuple(shape), tuple(laid_out), data_dims, tuple(notes))


def _notes(
    dims: ParallelDims, engine: str, named: tuple[str, ...], options: dict[str, Any], per_node: int, plain: str
) -> list[str]:
    sizes = dims.sizes()
    notes = []
    split = [d for d in (PIPELINE, CONTEXT, TENSOR) if sizes[d] > 1]
    if dims.data_parallel == 1 and split:
        alone = " x ".join(WHAT[d] for d in split)
        inside = {"fsdp": "FSDP shards", "replicate": "gradients all-reduced", "zero1": "the optimizer state sharded"}
        over_one = dims.cp == 1 or engine != "fsdp"  # FSDP shards over the context-parallel ranks too
        suffix = f", {inside[engine]} over one rank" if over_one else ""
        notes.append(f"one data-parallel rank: {alone} alone{suffix}")
    if engine == "fsdp" and REPLICATE in named:
        if dims.dp_replicate == 1:
            notes.append("one replica: the layout of fsdp")
        if dims.dp_shard == 1:
            notes.append("shards of one rank: every rank holds the whole model, as under ddp")
    for dim in (PIPELINE, CONTEXT, TENSOR):
        if dim in named and sizes[dim] == 1:
            rest = [f"{d} {sizes[d]}" for d in split]
            without = plain + (f" ({' x '.join(rest)})" if rest else "")
            notes.append(f"{dim} 1: no {WHAT[dim]}, the layout of {without}")
    if EXPERT in named and dims.ep == 1:
        notes.append(f"ep 1: no expert parallel, the layout of {plain}")
    elif dims.ep > 1:
        borrowed = SHARD if engine == "fsdp" else REPLICATE
        verb = "sharded" if engine == "fsdp" else "replicated"
        notes.append(
            f"ep {dims.ep} of the {dims.data_parallel} data-parallel ranks: the experts split over ep and {verb} over "
            f"{borrowed}, the rest of the model {verb} over {borrowed} x ep"
        )
    nodes = max(1, dims.world_size // max(1, min(per_node, dims.world_size)))
    if PIPELINE in named and options.get("pp_size") is None and dims.pp > 1 and nodes == 1:
        notes.append(f"pp {dims.pp}: a pipeline on one node by default (a stage per node on several; set pp_size)")
    return notes
