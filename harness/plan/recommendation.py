"""The answer in plain words: the fastest strategy that fits and why it wins, the runner-up, why
each of the others loses, and what would change the answer."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.common.units import GIB
from harness.plan.memory.batch_limit import fitting_micro_batch, micro_batch_limit
from harness.plan.network.comm import tensor_parallel_across_nodes
from harness.plan.network.fabric import Topology, span_words
from harness.plan.parallel.backends import counterpart, model_of
from harness.plan.parallel.layout import Layout, LayoutError
from harness.plan.parallel.planned_options import options_of
from harness.plan.predict import Question, StrategyPlan, plan_strategy
from harness.plan.published_accuracy import accuracy_line, plan_work
from harness.plan.what_if import fewest_gpus

MAX_GPUS = 1024
TIE = 0.02  # speeds this close are a tie within the model's accuracy: the one with more headroom wins
CHECKPOINTING_ORDER = ("none", "selective", "full")  # less memory, more recomputation


@dataclass(frozen=True)
class Recommendation:
    best: str | None
    runner_up: str | None
    lines: list[str]

    def as_dict(self) -> dict:
        return {"best": self.best, "runner_up": self.runner_up, "text": self.lines}


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


OWN_WORK = "the backend's own work"  # a step's overhead where no measurement names it


def _speed_key(p: StrategyPlan) -> float:
    # Without a speed prediction (no known card), fewer bytes on the wire is the tie-breaker.
    return -p.time.tokens_per_s if p.time else sum(c.payload_bytes for c in p.collectives)


def _tied(p: StrategyPlan, best: StrategyPlan) -> bool:
    return bool(p.time and best.time) and p.time.tokens_per_s >= (1 - TIE) * best.time.tokens_per_s


def _cause(p: StrategyPlan, best: StrategyPlan, topology: Topology) -> str:
    """The part of `p`'s step that most exceeds `best`'s, in words."""
    t, b = p.time, best.time
    assert t and b
    parts = {
        "offload": t.offload_step_s - b.offload_step_s,
        "comm": t.exposed_comm_s - b.exposed_comm_s,
        "overhead": t.overhead_s - b.overhead_s,
        "host": t.host_wait_s - b.host_wait_s,
        "bubble": t.bubble_s - b.bubble_s,
        "compute": t.compute_s - b.compute_s,
    }
    largest = max(parts, key=lambda k: parts[k])
    if parts[largest] <= 0:
        return "more work per token"
    if largest == "bubble":
        return f"{t.bubble_s * 1e3:.0f} ms per step of the pipeline's bubble ({t.bubble_what})"
    if largest == "offload":
        return f"{t.offload_step_s * 1e3:.0f} ms per step in the CPU optimizer step and host copies"
    if largest == "overhead":
        return f"{t.overhead_s * 1e3:.0f} ms per step of {t.overhead_what or OWN_WORK}"
    if largest == "host" and t.host is not None:
        return f"{t.host_wait_s * 1e3:.0f} ms per step waiting on the host: {t.host.describe()}"
    if largest == "comm":
        every = t.recurring_comm_s - b.recurring_comm_s
        across = tensor_parallel_across_nodes(p.collectives)
        if every > parts["comm"] / 2:  # mostly what each micro-step waits on: tensor parallelism's, the pipeline's
            return (
                f"{t.exposed_comm_s * 1e3:.0f} ms per step of communication no compute hides, "
                f"{t.recurring_comm_s * 1e3:.0f} ms of it in every micro-batch's critical path "
                f"({_per_micro_step_collectives(p)}{'; ' + across if across else ''})"
            )
        # Across the most nodes first (a node's network is several times slower than its links), then the most bytes.
        slowest = max(
            (c for c in p.collectives if c.kind != "host-copy"),
            key=lambda c: (c.group.nodes, c.wire_bytes()),
            default=None,
        )
        where = (
            f" ({slowest.what} over {slowest.group.size} GPUs on {span_words(slowest.group, topology)})"
            if slowest
            else ""
        )
        where += f"; {across}" if across else ""
        return f"{t.exposed_comm_s * 1e3:.0f} ms per step of communication no compute hides{where}"
    uneven = (
        f", {t.imbalance_s * 1e3:.0f} ms of it the slowest pipeline stage's beyond an even share (the head and "
        "loss, blocks that do not divide evenly), which the other stages wait out"
        if t.imbalance_s > (t.compute_s - b.compute_s) / 4
        else ""
    )
    return f"{t.compute_s * 1e3:.0f} ms of compute per step against {b.compute_s * 1e3:.0f} ms{uneven}"


def _largest_loss(p: StrategyPlan, q: Question) -> str:
    """What takes most of `p`'s step beyond its compute, and what would shrink it, in words."""
    t = p.time
    assert t
    losses = {
        "comm": t.exposed_comm_s + t.contention_s,
        "bubble": t.bubble_s,
        "host": t.host_wait_s,
        "offload": t.offload_step_s,
        "overhead": t.overhead_s,
        "stragglers": t.straggler_s,
    }
    largest = max(losses, key=lambda k: losses[k])
    share = f"{losses[largest] / t.step_s:.0%} of {p.name}'s step"
    if largest == "bubble":
        return (
            f"the pipeline's bubble is {share} ({t.bubble_what}); more micro-batches a step (batch_size= or "
            "global_batch_tokens=) or fewer stages (strategy_options.pp_size=) shrink it"
        )
    if largest == "host" and t.host is not None:
        return (
            f"waiting on the host is {share} ({t.host.describe()}); a larger micro-batch gives each kernel more "
            "work, compile=true issues fewer"
            + (
                ""
                if q.gpu is None or q.gpu.host_us_per_kernel is not None
                else ", host_us_per_kernel= prices your host"
            )
        )
    if largest == "offload":
        return f"the CPU optimizer step and host copies are {share}; more GPUs or no offload where it fits remove it"
    if largest == "overhead":
        what = t.overhead_what or OWN_WORK
        return f"{t.overhead_s * 1e3:.0f} ms a step of {what} ({share}); a larger micro-batch spreads it"
    if largest == "stragglers":
        return f"waiting for the slowest of {t.straggle_gpus} GPUs is {share}"
    return (
        f"communication costs {share} on {q.topology.describe()}; a faster network, a larger micro-batch or "
        "gradient accumulation spread it over more compute"
    )


def _per_micro_step_collectives(p: StrategyPlan) -> str:
    """The collectives every micro-step waits on, in words."""
    names = [c.what for c in p.collectives if c.per_micro_step and (c.window is None or "pipeline" in c.what)]
    return "; ".join(dict.fromkeys(names)) or "the per-micro-step collectives"


def _offloads(p: StrategyPlan) -> bool:
    """Whether the strategy keeps its optimizer state or parameters in host memory."""
    return p.backend.offload_optimizer or p.backend.offload_params


def _why_slower(p: StrategyPlan, best: StrategyPlan, topology: Topology) -> str:
    if not (p.time and best.time):
        return "moves more bytes per step"
    if _tied(p, best):
        more = (p.peak_bytes or 0) - (best.peak_bytes or 0)
        if abs(more) < 0.05 * GIB:
            return f"as fast (within {TIE:.0%}) and as large: no reason to prefer it"
        held = ", its state in host memory" if _offloads(p) and not _offloads(best) else ""
        return f"as fast (within {TIE:.0%}) but needs {_gib(abs(more))} {'more' if more >= 0 else 'less'} per GPU{held}"
    slower = best.time.tokens_per_s / p.time.tokens_per_s - 1
    return f"{slower:.0%} slower: {_cause(p, best, topology)}"


def _largest_part(p: StrategyPlan) -> tuple[str, float]:
    parts: dict[str, float] = {{"optimizer": "optimizer state"}.get(c, c): b for c, b in p.states_on().items()}
    if p.activations:
        parts["activations"] = p.activations.total
    parts.update(p.buffers.backward)
    parts.update(p.buffers.hooks)
    name = max(parts, key=lambda k: parts[k])
    return name, parts[name]


def shortfall(p: StrategyPlan) -> str:
    """What `p`, which does not fit, needs beyond the card, the host, or both."""
    needs = []
    if p.gpu_fits is not True:
        name, nbytes = _largest_part(p)
        needs.append(
            f"needs {_gib(p.reserved_bytes)} per GPU with the allocator's reserve, "
            f"{_gib(p.headroom.usable)} usable (largest part: {name} {_gib(nbytes)})"
        )
    if p.host_fits is False and p.host is not None:
        needs.append(p.host.shortfall(p.host_bytes))
    return "; and ".join(needs)


def _why_not(p: StrategyPlan) -> str:
    return f"does not fit: {shortfall(p)}"


def domain_lines(layout: Layout, topology: Topology) -> list[str]:
    """Where a layout's tensor-parallel (or tensor- and context-parallel) GPUs, or its experts' all-to-all
    (expert_layout.py: ep x etp neighbours), span several hosts yet stay on NVLink (a GB200/GB300 NVL72
    rack's domain of 72, not a node's 8): said, since the domain is why such a layout can win."""
    experts = layout.experts.ep_group
    groups = (
        ("tensor-parallel", layout.tp),
        ("tensor- and context-parallel", layout.tp * layout.cp),
        ("expert-parallel all-to-all", experts.size if experts.nodes == 1 else 0),
    )
    for what, size in groups:
        if max(8, topology.per_node) < size <= topology.per_domain:
            return [
                f"Its {what} group of {size} GPUs spans {size // topology.per_node} hosts but stays on NVLink: the "
                f"NVLink domain is {topology.per_domain} GPUs; on 8-GPU nodes it would cross the network."
            ]
    return []


def _numerics(p: StrategyPlan, q: Question) -> list[str]:
    """What a strategy changes in the numbers it trains with, beyond the order of sums: said wherever
    the plan points at it, since a plan prices speed and memory, not the loss curve."""
    if not p.backend.quantized_comm or q.precision == "fp32":
        return []
    return [
        f"{p.name} sends weights as int8 and gradients as int4 (ZeRO++ qwZ and qgZ): its loss can drift from "
        "zero3's; compare the two on a smaller model (runner.py compare) before a long run."
    ]


def _why_best(best: StrategyPlan, plans: list[StrategyPlan], q: Question) -> str:
    """Why the chosen strategy wins, against what it beats."""
    lost = [p for p in plans if p.fits is False]
    # Only a strategy that holds more activations than the winner shows what tensor parallelism saved.
    heavier = [p for p in lost if p.activations and best.activations and p.activations.total > best.activations.total]
    if best.layout.tp > 1 and heavier and all(p.activations for p in lost):
        others = min(heavier, key=lambda p: p.peak_bytes or 0)
        return (
            f"tensor parallelism over {best.layout.tp} GPUs keeps the per-GPU activations of seq {q.seq_len} within "
            f"the card ({_gib(best.activations.total)} against {_gib(others.activations.total)} for {others.name})"
        )
    faster_lost = [p for p in lost if p.time and best.time and p.time.tokens_per_s > best.time.tokens_per_s]
    if faster_lost:
        f = min(faster_lost, key=_speed_key)
        return f"{f.name} would be faster but does not fit ({_gib(f.reserved_bytes)} per GPU)"
    fitting = [p for p in plans if p is not best and p.fits is not False and p.time and best.time]
    if not fitting:
        return "the only one that fits"
    runner = min(fitting, key=_speed_key)
    if _tied(runner, best):
        if (runner.peak_bytes or 0) < (best.peak_bytes or 0) and _offloads(runner) and not _offloads(best):
            return f"as fast as {runner.name} within {TIE:.0%}, which keeps its state on the host"
        return f"as fast as {runner.name} within {TIE:.0%}, with the most memory to spare"
    t, r = best.time, runner.time
    assert t and r
    if r.exposed_comm_s - t.exposed_comm_s >= max(r.overhead_s - t.overhead_s, r.compute_s - t.compute_s, 0):
        return (
            f"its communication hides behind compute ({t.exposed_comm_s * 1e3:.0f} ms exposed per step against "
            f"{r.exposed_comm_s * 1e3:.0f} ms for {runner.name} on {q.topology.describe()})"
        )
    return f"{runner.name} loses {_cause(runner, best, q.topology)}"


def _fewest_gpus(name: str, q: Question) -> tuple[int, StrategyPlan] | None:
    """The smallest power-of-two multiple of the GPU count at which `name` fits, with its plan;
    None where none does or a GPU count on the way cannot be laid out (what_if.skipped says why)."""
    found = fewest_gpus(name, q, MAX_GPUS)
    return found if isinstance(found, tuple) else None


def _planned(name: str, q: Question) -> StrategyPlan | None:
    """`name`'s plan of a what-if, or None where the what-if cannot lay it out (a pipeline's micro-batches
    that micro-batch 1 does not hold): that remedy is not one."""
    try:
        return plan_strategy(name, q)
    except LayoutError:
        return None


def _more_checkpointing(q: Question) -> list[str]:
    return list(CHECKPOINTING_ORDER[CHECKPOINTING_ORDER.index(q.checkpointing) + 1 :])


def _remedy(plans: list[StrategyPlan], best: StrategyPlan, q: Question) -> tuple[StrategyPlan, list[str]] | None:
    """The fastest strategy faster than `best` that does not fit but would, with what would make it fit:
    each is tried in turn, fastest first (one may fit no way, the next with checkpointing)."""
    faster = sorted((p for p in plans if p.fits is False and _speed_key(p) < _speed_key(best)), key=_speed_key)
    for p in faster:
        ways = _fits_with(p.name, q)
        if ways:
            return p, ways
    return None


def _fits_with(name: str, q: Question) -> list[str]:
    """What would make a strategy that does not fit fit: more checkpointing, more GPUs, both, a smaller micro-batch."""
    for mode in _more_checkpointing(q):
        p = _planned(name, replace(q, checkpointing=mode))
        if p is not None and p.fits:
            speed = f", {p.time.tokens_per_s / q.gpus:,.0f} tokens/s per GPU" if p.time else ""
            return [f"activation_checkpointing={mode} ({_gib(p.peak_bytes)} per GPU{speed})"]
    options = []
    more = _fewest_gpus(name, q)
    if more:
        options.append(f"{more[0]} GPUs ({_gib(more[1].peak_bytes)} per GPU)")
    elif q.checkpointing != "full":
        both = _fewest_gpus(name, replace(q, checkpointing="full"))
        if both:
            options.append(f"activation_checkpointing=full and {both[0]} GPUs ({_gib(both[1].peak_bytes)} per GPU)")
    if q.micro_batch > 1:
        smaller = replace(q, checkpointing="full", micro_batch=1, grad_accum=q.grad_accum * q.micro_batch)
        p = _planned(name, smaller)
        if p is not None and p.fits:
            options.append(f"micro_batch=1 with accumulation and full checkpointing ({_gib(p.peak_bytes)} per GPU)")
    return options


def _more_microbatches(p: StrategyPlan, q: Question) -> str | None:
    """Where the user gave a pipeline its stages but not its micro-batches: the fewest pipeline
    micro-batches, each a smaller share of the data-parallel rank's sequences, with which `p` fits
    (1F1B keeps a micro-batch a stage in flight, so smaller ones hold fewer activations)."""
    if p.layout.pp <= 1 or "microbatches" in options_of(p.name, q.strategy_options):
        return None
    local = p.micro_batch * p.grad_accum
    runs = int(p.backend.options.get("microbatches") or p.layout.pp)
    for count in (m for m in range(runs + 1, local + 1) if local % m == 0):
        staged = _planned(p.name, replace(q, strategy_options={**q.strategy_options, "microbatches": count}))
        if staged is not None and staged.fits:
            return f"{p.name} with strategy_options.microbatches={count} ({_gib(staged.peak_bytes)} per GPU)"
    return None


def _offloaded(p: StrategyPlan, q: Question) -> str | None:
    """The offload strategy of `p`'s engine and stage, where `p` keeps its optimizer on the GPU."""
    if p.backend.offload_optimizer:
        return None
    registered = model_of(p.name) or p.backend  # as registered: a recipe may have changed its precision
    return counterpart(registered, offload=True, via_accelerate=registered.via_accelerate)


def _remedies(p: StrategyPlan, q: Question) -> list[str]:
    """What would make `p`, which does not fit, fit: more GPUs, offload, a smaller micro-batch,
    each with full checkpointing where it needs it too."""
    staged = _more_microbatches(p, q)
    ways = [staged] if staged else []
    full = replace(q, checkpointing="full")
    also = "" if q.checkpointing == "full" else " with activation_checkpointing=full"
    questions = [q] if q.checkpointing == "full" else [q, full]
    for question in questions:
        more = _fewest_gpus(p.name, question)
        if more:
            how = "" if question is q else also
            ways.append(f"{p.name}{how} on {more[0]} GPUs ({_gib(more[1].peak_bytes)} per GPU)")
            break
    offload = _offloaded(p, q)
    if offload:
        for question in questions:
            o = _planned(offload, question)
            if o is not None and o.fits:
                how = "" if question is q else also
                ways.append(f"{offload}{how}: optimizer state in host memory ({_gib(o.peak_bytes)} per GPU)")
                break
    for question in questions:
        planned = _planned(p.name, question)
        largest = fitting_micro_batch(planned, question) if planned is not None else None
        if largest and largest < q.micro_batch:
            how = "" if question is q else also
            ways.append(f"{p.name} at micro_batch={largest}{how}, with accumulation for the rest of the batch")
            break
    if not ways and q.micro_batch > 1:
        smallest = _fewest_gpus(p.name, replace(full, micro_batch=1))
        if smallest:
            gpus, plan = smallest
            ways.append(f"{p.name} at micro_batch=1{also} on {gpus} GPUs ({_gib(plan.peak_bytes)} per GPU)")
    return ways


def _nothing_fits(plans: list[StrategyPlan], q: Question) -> Recommendation:
    lean = min(plans, key=lambda p: p.peak_bytes or 0)
    asked = f"{q.gpus} x {q.capacity_bytes / GIB:.0f} GiB"
    lines = [f"Nothing fits in {asked} as asked: the leanest, {lean.name}, {shortfall(lean)}."]
    for mode in _more_checkpointing(q):
        fitting = sorted(
            (p for p in (_planned(p.name, replace(q, checkpointing=mode)) for p in plans) if p is not None and p.fits),
            key=_speed_key,
        )
        if fitting:
            best = fitting[0]
            speed = f" at {best.time.tokens_per_s / q.gpus:,.0f} tokens/s per GPU" if best.time else ""
            lines.append(
                f"Use {best.name} with activation_checkpointing={mode}: the fastest that then fits, "
                f"{_gib(best.peak_bytes)} per GPU{speed}."
            )
            lines += _numerics(best, q)
            return Recommendation(best.name, fitting[1].name if len(fitting) > 1 else None, lines)
    # The two leanest that differ in more than the launcher (accelerate-fsdp as fsdp).
    kinds = {}
    for p in sorted(plans, key=lambda p: p.peak_bytes or 0):
        kinds.setdefault((p.backend.engine, p.backend.stage, p.backend.offload_optimizer, p.layout.tp), p)
    ways = list(dict.fromkeys(w for p in list(kinds.values())[:2] for w in _remedies(p, q)))
    if ways:
        lines.append("It would fit with " + "; or ".join(ways) + ".")
    else:
        least = _planned(lean.name, replace(q, checkpointing="full", micro_batch=1).with_gpus(MAX_GPUS))
        if least is None:
            lines.append(f"Neither more GPUs, checkpointing, offload nor a smaller micro-batch makes {lean.name} fit.")
        else:
            part, nbytes = _largest_part(least)
            lines.append(
                f"Neither more GPUs, full checkpointing, offload nor a smaller micro-batch makes {lean.name} fit: at "
                f"micro-batch 1 with full checkpointing on {MAX_GPUS:,} GPUs it still needs "
                f"{_gib(least.reserved_bytes)} per GPU (largest part: {part} {_gib(nbytes)})."
            )
        lines += _other_layouts(lean, q)
    return Recommendation(None, None, lines)


def _other_layouts(lean: StrategyPlan, q: Question) -> list[str]:
    """The layouts of any strategy the planner models (tensor, pipeline, context parallel) that would fit
    the same global batch, on these GPUs or the fewest more (search/what_fits.py)."""
    if q.gpu is None:  # the search ranks by speed: without a known card, say only what the memory needs
        return ["A card with more memory, or tensor, pipeline or context parallelism (plan search=true), is needed."]
    from harness.plan.search.what_fits import what_fits  # the search imports this module

    global_batch = q.global_batch or q.micro_batch * q.grad_accum * lean.layout.data_parallel
    return what_fits(q, global_batch).lines(q.gpus)


def recommend(plans: list[StrategyPlan], q: Question) -> Recommendation:
    ranked = sorted([p for p in plans if p.fits is not False], key=_speed_key)
    if not ranked:
        return _nothing_fits(plans, q)
    # Among the strategies tied for fastest, those that keep their state on the GPU where one does
    # (offload's tie hides what it takes of the host: its pinned memory and its CPUs' step); of
    # those, the one that leaves the most memory free; among those as lean (within 2%), the first
    # listed: the registry lists simpler ones first.
    tied = [p for p in ranked if p is ranked[0] or _tied(p, ranked[0])]
    pool = [p for p in tied if not _offloads(p)] or tied
    peak = {p.name: p.peak_bytes if p.peak_bytes is not None else float("inf") for p in tied}
    least = min(peak[p.name] for p in pool)
    lean = {p.name for p in pool if peak[p.name] <= (1 + TIE) * least}
    choice = next((p for p in plans if p.name in lean), pool[0])
    if choice is tied[0]:
        lead = "the fastest that fits"
    elif peak[choice.name] < peak[tied[0].name]:
        lead = f"as fast as the fastest that fits (within {TIE:.0%}) and leaner"
    else:  # the fastest offloads to the host
        lead = f"as fast as the fastest that fits (within {TIE:.0%}), its state kept on the GPU"
    ranked.remove(choice)
    ranked.insert(0, choice)
    best = ranked[0]
    unknown = " (activations unknown for this model: model states and buffers only)" if best.fits is None else ""
    speed = (
        f" at {best.time.tokens_per_s / q.gpus:,.0f} tokens/s per GPU, {best.time.efficiency:.0%} scaling efficiency"
        if best.time
        else ""
    )
    largest = fitting_micro_batch(best, q)
    room = "" if largest is None else f"; micro-batches up to {micro_batch_limit(largest)} fit"
    work = plan_work(best.micro_batch, q.seq_len, q.shape.dims, best.layout.tp)
    lines = [
        f"Use {best.name}: {lead}, {_gib(best.peak_bytes)} per GPU{speed}{unknown}{room}; {_why_best(best, plans, q)}.",
        *domain_lines(best.layout, q.topology),
        *([accuracy_line(best.layout, q.topology, q.gpu, work)] if best.time else []),
        *_numerics(best, q),
    ]
    runner_up = ranked[1] if len(ranked) > 1 else None
    if runner_up:
        lines.append(f"Runner-up: {runner_up.name}, {_why_slower(runner_up, best, q.topology)}.")
    for p in plans:
        if p is best or p is runner_up:
            continue
        reason = _why_not(p) if p.fits is False else _why_slower(p, best, q.topology)
        lines.append(f"  {p.name}: {reason}.")
    remedy = _remedy(plans, best, q)
    if remedy is not None:
        faster, ways = remedy
        lines.append(f"What would change the answer: {faster.name} is faster and fits with {' or '.join(ways)}.")
        lines += _numerics(faster, q)
    elif best.time and best.time.efficiency < 0.8:
        lines.append(f"What would change the answer: {_largest_loss(best, q)}.")
    elif q.checkpointing != "none":
        lines.append(
            f"What would change the answer: activation_checkpointing={q.checkpointing} recomputes part of the "
            "forward; less of it where the memory allows."
        )
    else:
        lines.append(
            "What would change the answer: a larger model or micro-batch (memory), or more nodes on a "
            "slower network (communication)."
        )
    return Recommendation(best.name, runner_up.name if runner_up else None, lines)
