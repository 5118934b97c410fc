"""The answer in plain words: the fastest strategy that fits, the runner-up, why each of the
others loses, and what would change the answer."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.common.units import GB
from harness.plan.predict import USABLE_FRACTION, Question, StrategyPlan, plan_strategy

MAX_GPUS = 1024
TIE = 0.02  # speeds this close are a tie within the model's accuracy: the one with more headroom wins


@dataclass(frozen=True)
class Recommendation:
    best: str | None
    runner_up: str | None
    lines: list[str]

    def as_dict(self) -> dict:
        return {"best": self.best, "runner_up": self.runner_up, "text": self.lines}


def _gb(n: float | None) -> str:
    return "?" if n is None else f"{n / GB:.1f} GB"


def _speed_key(p: StrategyPlan) -> float:
    # Without a speed prediction (no peak flops), fewer bytes on the wire is the tie-breaker.
    return -p.time.tokens_per_s if p.time else sum(c.payload_bytes for c in p.collectives)


def _tied(p: StrategyPlan, best: StrategyPlan) -> bool:
    return bool(p.time and best.time) and p.time.tokens_per_s >= (1 - TIE) * best.time.tokens_per_s


def _why_slower(p: StrategyPlan, best: StrategyPlan) -> str:
    if not (p.time and best.time):
        return "moves more bytes per step"
    if _tied(p, best):
        more = (p.peak_bytes or 0) - (best.peak_bytes or 0)
        return f"as fast (within {TIE:.0%}) but needs {_gb(abs(more))} {'more' if more >= 0 else 'less'} per GPU"
    slower = best.time.tokens_per_s / p.time.tokens_per_s - 1
    t = p.time
    largest = max(t.offload_step_s, t.exposed_comm_s - best.time.exposed_comm_s, t.overhead_s - best.time.overhead_s)
    if largest <= 0:
        cause = "more compute per step"
    elif largest == t.offload_step_s:
        cause = f"{t.offload_step_s * 1e3:.0f} ms per step in the CPU optimizer step and host copies"
    elif largest == t.overhead_s - best.time.overhead_s:
        cause = f"{t.overhead_s * 1e3:.0f} ms per step of the backend's own work ({t.overhead_what})"
    else:
        cause = f"{t.exposed_comm_s * 1e3:.0f} ms per step of communication this interconnect cannot hide"
    return f"{slower:.0%} slower: {cause}"


def _largest_part(p: StrategyPlan) -> str:
    parts = {{"optimizer": "optimizer state"}.get(c, c): b for c, b in p.states_on().items()}
    if p.activations:
        parts["activations"] = p.activations.total
    parts.update(p.buffers.backward)
    parts.update(p.buffers.hooks)
    name, nbytes = max(parts.items(), key=lambda kv: kv[1])
    return f"{name} {_gb(nbytes)}"


def _why_not(p: StrategyPlan, q: Question) -> str:
    return (
        f"does not fit: needs {_gb(p.peak_bytes)} per GPU, {_gb(USABLE_FRACTION * q.gpu_mem_bytes)} usable "
        f"(largest part: {_largest_part(p)})"
    )


def _fewest_gpus(name: str, q: Question) -> tuple[int, StrategyPlan] | None:
    """The smallest power-of-two multiple of the GPU count at which `name` fits, with its plan."""
    gpus = q.gpus * 2
    while gpus <= MAX_GPUS:
        p = plan_strategy(name, q.with_gpus(gpus))
        if p.fits:
            return gpus, p
        gpus *= 2
    return None


def _fits_with(name: str, q: Question) -> list[str]:
    """What would make a strategy that does not fit fit: checkpointing, more GPUs, both, a smaller micro-batch."""
    checkpointed = replace(q, checkpointing=True)
    if not q.checkpointing:
        p = plan_strategy(name, checkpointed)
        if p.fits:
            speed = f", {p.time.tokens_per_s:,.0f} tokens/s" if p.time else ""
            return [f"activation checkpointing on ({_gb(p.peak_bytes)} per GPU{speed})"]
    options = []
    more = _fewest_gpus(name, q)
    if more:
        options.append(f"{more[0]} GPUs ({_gb(more[1].peak_bytes)} per GPU)")
    elif not q.checkpointing:
        both = _fewest_gpus(name, checkpointed)
        if both:
            options.append(f"activation checkpointing on and {both[0]} GPUs ({_gb(both[1].peak_bytes)} per GPU)")
    if q.micro_batch > 1:
        p = plan_strategy(name, replace(checkpointed, micro_batch=1, grad_accum=q.grad_accum * q.micro_batch))
        if p.fits:
            options.append(f"micro_batch=1 with accumulation and checkpointing ({_gb(p.peak_bytes)} per GPU)")
    return options


def recommend(plans: list[StrategyPlan], q: Question) -> Recommendation:
    ranked = sorted([p for p in plans if p.fits is not False], key=_speed_key)
    if ranked:
        # Among the strategies tied for fastest, the one that leaves the most memory free;
        # among those as lean (within 2%), the first listed: the registry lists simpler ones first.
        tied = [p for p in ranked if p is ranked[0] or _tied(p, ranked[0])]
        peak = {p.name: p.peak_bytes if p.peak_bytes is not None else float("inf") for p in tied}
        least = min(peak.values())
        choice = next(p for p in plans if p.name in peak and peak[p.name] <= (1 + TIE) * least)
        ranked.remove(choice)
        ranked.insert(0, choice)
    lines: list[str] = []
    if not ranked:
        lines.append(f"Nothing fits in {q.gpus} x {q.gpu_mem_bytes / GB:.0f} GB as asked.")
        if not q.checkpointing:
            checkpointed = replace(q, checkpointing=True)
            fitting = sorted(
                (p for p in (plan_strategy(p.name, checkpointed) for p in plans) if p.fits), key=_speed_key
            )
            if fitting:
                best = fitting[0]
                speed = f" at {best.time.tokens_per_s:,.0f} tokens/s" if best.time else ""
                lines.append(
                    f"Use {best.name} with activation checkpointing on: the fastest that then fits, "
                    f"{_gb(best.peak_bytes)} per GPU{speed}."
                )
                return Recommendation(best.name, fitting[1].name if len(fitting) > 1 else None, lines)
        for p in sorted(plans, key=lambda p: p.peak_bytes or 0)[:3]:
            ways = _fits_with(p.name, q)
            lines.append(
                f"{p.name} needs {_gb(p.peak_bytes)} per GPU"
                + (f"; it fits with {' or '.join(ways)}." if ways else ".")
            )
        return Recommendation(None, None, lines)
    best = ranked[0]
    unknown = " (activations unknown for this model: model states and buffers only)" if best.fits is None else ""
    speed = (
        f" at {best.time.tokens_per_s:,.0f} tokens/s, {best.time.efficiency:.0%} scaling efficiency"
        if best.time
        else ""
    )
    lines.append(f"Use {best.name}: the fastest that fits, {_gb(best.peak_bytes)} per GPU{speed}{unknown}.")
    runner_up = ranked[1] if len(ranked) > 1 else None
    if runner_up:
        lines.append(f"Runner-up: {runner_up.name}, {_why_slower(runner_up, best)}.")
    for p in plans:
        if p is best or p is runner_up:
            continue
        reason = _why_not(p, q) if p.fits is False else _why_slower(p, best)
        lines.append(f"  {p.name}: {reason}.")
    fastest = min(plans, key=_speed_key)
    if fastest.fits is False:
        ways = _fits_with(fastest.name, q)
        if ways:
            lines.append(f"What would change the answer: {fastest.name} is faster and fits with {' or '.join(ways)}.")
    elif best.time and best.time.efficiency < 0.8:
        lines.append(
            f"What would change the answer: communication costs {best.name} {1 - best.time.efficiency:.0%} of its step "
            f"on {q.topology.describe()}; a faster interconnect, a larger micro-batch or gradient accumulation "
            "spread it over more compute."
        )
    elif q.checkpointing:
        lines.append(
            "What would change the answer: activation checkpointing costs a third more compute; "
            "turn it off where the memory allows."
        )
    else:
        lines.append(
            "What would change the answer: a larger model or micro-batch (memory), or more nodes on a "
            "slower network (communication)."
        )
    return Recommendation(best.name, runner_up.name if runner_up else None, lines)
