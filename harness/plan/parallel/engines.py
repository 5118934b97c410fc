"""Where two strategies drive the same engine (fsdp and accelerate-fsdp, zero1 and
accelerate-zero1) yet are planned differently, the plan says why, in its own words: which
setting differs, what that costs on the wire and in memory, and what the calibration measured
apart for each (a plan never calls two strategies alike while pricing them apart)."""

from __future__ import annotations

from harness.common.units import GB, milliseconds
from harness.plan.parallel.backends import counterpart
from harness.plan.predict import Question, StrategyPlan


def _settings(plan: StrategyPlan, q: Question) -> dict[str, str]:
    """The settings the planner models for a strategy, in words."""
    b = plan.backend
    if b.engine == "deepspeed":
        return {
            "gradients reduced in": str(b.option("communication_data_type")),
            "reduction bucket": f"{int(b.option('reduce_bucket_size')):,} elements",
            "overlap_comm": str(b.option("overlap_comm")),
        }
    if b.stage == 3:
        settings = {"gradients reduced in": "fp32" if b.reduce_in_fp32 or q.precision == "fp32" else q.precision}
        if q.grad_accum > 1:  # only then does it matter when gradients are synchronised
            settings["gradient sync"] = (
                "every micro-step" if b.sharded_grads_every_micro_step else "the last micro-step"
            )
        return settings
    return {
        "model wrapper": "DistributedDataParallel"
        if b.ddp_wrapped(plan.layout.data_parallel)
        else "none (one process)",
        "gradient_as_bucket_view": str(b.option("gradient_as_bucket_view")),
        "DDP bucket": f"{b.option('bucket_cap_mb'):g} MB",
    }


def engine_differences(plans: list[StrategyPlan], q: Question) -> list[str]:
    """One sentence per Accelerate strategy planned beside its native counterpart."""
    by_name = {p.name: p for p in plans}
    lines = []
    for plan in plans:
        b = plan.backend
        native = counterpart(b, offload=b.offload_optimizer, via_accelerate=False) if b.via_accelerate else None
        if native not in by_name:
            continue
        theirs, ours = _settings(by_name[native], q), _settings(plan, q)
        differing = [f"{key}: {ours[key]} (not {theirs[key]})" for key in ours if ours[key] != theirs[key]]
        measured = _measured_apart(plan, by_name[native], q)
        if not differing:
            lines.append(
                f"{plan.name} and {native} drive the same engine with the same settings: "
                + (measured if measured else "planned alike.")
            )
            continue
        effects = []
        if plan.time and by_name[native].time:
            wire = plan.time.wire_bytes - by_name[native].time.wire_bytes
            if abs(wire) >= 0.005 * GB:
                effects.append(f"{abs(wire) / GB:.2f} GB {'more' if wire > 0 else 'less'} on the wire per step")
        if plan.peak_bytes is not None and by_name[native].peak_bytes is not None:
            peak = plan.peak_bytes - by_name[native].peak_bytes
            if abs(peak) >= 0.005 * GB:
                effects.append(f"{abs(peak) / GB:.2f} GB {'more' if peak > 0 else 'less'} at peak")
        lines.append(
            f"{plan.name} differs from {native}, the engine it drives: "
            + "; ".join(differing)
            + (": " + ", ".join(effects) if effects else "")
            + "."
            + (f" {measured}" if measured else "")
        )
    return lines


def _measured_apart(plan: StrategyPlan, native: StrategyPlan, q: Question) -> str:
    """What the calibration measured of each beyond the model, wherever the two differ: the plan carries
    any difference, so a difference too small for whole milliseconds is still told."""
    ours = q.factors.overhead_s.get(plan.backend.measured_as)
    theirs = q.factors.overhead_s.get(native.backend.measured_as)
    if ours is None or theirs is None or ours == theirs:
        return ""
    more = ours - theirs
    return (
        f"measured apart, {milliseconds(abs(more))} ms per micro-step {'more' if more > 0 else 'less'} of the "
        f"backend's own work in {plan.name} ({q.factors.basis}), which the plan carries."
    )
