"""The speed model's factors fitted to what a machine measured (speed.SpeedFactors).

From a compare's results.json (or a train run's summary.json) the planner rebuilds each run's
question (model, micro-batch, precision, world size, device) and predicts it with neutral
factors; then, in this order:
  compute scale   `single`'s measured step over its predicted compute (the model's efficiency
                  on this GPU, relative to the compute model's);
  overheads       for each other strategy, what it measured beyond the scaled compute and the
                  communication no compute hides, per unit of its backend's own work (FSDP's
                  collective calls, ZeRO-3's parameter fetches, ZeRO-1/2's parameters);
  host step       for each offload strategy, what remains after its sibling's overhead
                  (zero3-offload after zero3's), per parameter stepped on the host;
  memory          each strategy's measured peak allocated over the predicted one, per parameter
                  (what the memory model missed, assumed to scale with the model).
Without a measurement of its own the planner uses the factors fitted the same way to a
reference run shipped with parabench (reference_h100.json), and says they are assumed. A
strategy Accelerate drives and the reference did not measure is priced as its native
counterpart: Accelerate adds nothing measurable to the engine it drives (issue 12's bench
holds it to 3%).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.common.hardware import gpu_spec
from harness.plan.backends import counterpart, planner_models
from harness.plan.comm import INTER_NODE, INTERCONNECTS, Topology
from harness.plan.model_shape import ModelShape, PlanError, shape_of_spec
from harness.plan.predict import Question, StrategyPlan, plan_strategy
from harness.plan.speed import HOST_ADAM_S_PER_PARAM, SpeedFactors

REFERENCE = Path(__file__).with_name("reference_h100.json")
REFERENCE_NAME = "single"  # the strategy whose step is all compute: it fixes the compute scale


@dataclass(frozen=True)
class RunSettings:
    """What the measured runs shared."""

    model: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    precision: str
    world_size: int
    device: str
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    model_blocks: list[str] | None = None
    compiled: bool = False
    checkpointing: bool = False
    nodes: int = 1
    strategy_options: dict[str, Any] = field(default_factory=dict)  # flat ones and per-strategy sections


@dataclass(frozen=True)
class Measurement:
    strategy: str
    step_s: float
    peak_bytes: int | None = None
    world_size: int | None = None  # None: the settings' (a compare runs `single` on one process)


@dataclass(frozen=True)
class FitRow:
    """One strategy's measured step beside the model's parts, and what was fitted from it."""

    strategy: str
    measured_s: float
    compute_s: float  # scaled
    exposed_comm_s: float
    overhead_units: float
    overhead_what: str
    fitted: str  # what this row set, in words
    memory_missed_bytes: float | None = None


def default_factors() -> SpeedFactors:
    """The factors fitted to the reference run shipped with parabench (assumed elsewhere)."""
    return _reference_factors()


@lru_cache(maxsize=1)
def _reference_factors() -> SpeedFactors:
    doc = json.loads(REFERENCE.read_text())
    settings = RunSettings(**doc["settings"])
    measurements = [Measurement(m["strategy"], m["step_s"]) for m in doc["measurements"]]
    factors, _ = fit(settings, measurements, doc["basis"])
    return replace(factors, measured=False)


def calibrate_from(path: Path) -> tuple[SpeedFactors, list[FitRow]]:
    """Fit to a compare folder (results.json) or a train folder (summary.json)."""
    settings, measurements, basis = read_measurements(path)
    return fit(settings, measurements, basis)


def calibration_for_report(compare_dir: Path) -> dict[str, Any]:
    """The fit to a compare's results.json as plain data for its report: the compute scale and a
    row per strategy, or why there is none."""
    try:
        factors, rows = calibrate_from(compare_dir)
    except PlanError as exc:  # a CPU run, or no `single`: nothing the planner can calibrate from
        return {"error": str(exc)}
    return {"compute_scale": factors.compute_scale, "rows": [asdict(row) for row in rows]}


def read_measurements(path: Path) -> tuple[RunSettings, list[Measurement], str]:
    try:
        return _read_measurements(path)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, PlanError):
            raise
        raise PlanError(
            f"calibrate={path}: its results are incomplete ({type(exc).__name__}: {exc}): "
            "give the out_dir of a finished compare or train run"
        ) from None


def _read_measurements(path: Path) -> tuple[RunSettings, list[Measurement], str]:
    results, summary = path / "results.json", path / "summary.json"
    if results.is_file():
        doc = json.loads(results.read_text())
        config, nproc = doc["config"], doc["nproc"]
        device = (doc.get("environment") or {}).get("device") or ""
        measured = [
            Measurement(e["name"], e["step_time_s"], e.get("peak_mem_allocated_bytes"), e.get("nproc"))
            for e in doc["strategies"]
            if e.get("status") == "ok" and e.get("step_time_s")
        ]
    elif summary.is_file():
        doc = json.loads(summary.read_text())
        config, nproc, device = doc["config"], doc["world_size"], doc.get("device") or ""
        measured = (
            [Measurement(config["strategy"], doc["step_time_s"], doc.get("peak_mem_allocated_bytes"), nproc)]
            if doc.get("step_time_s")
            else []
        )
    else:
        raise PlanError(
            f"calibrate={path}: no results.json or summary.json there: give the out_dir of a "
            "`runner.py compare` or `runner.py train` run"
        )
    if gpu_spec(device) is None:
        raise PlanError(
            f"calibrate={path}: it ran on {device or 'an unknown device'}, not a GPU the planner knows: "
            "calibrate from a run on a GPU"
        )
    if not measured:
        raise PlanError(f"calibrate={path}: no run there finished with a step time: run it to the end first")
    micro_batch = config.get("micro_batch") or config["batch_size"] // nproc
    settings = RunSettings(
        model=config["model"],
        model_kwargs=config.get("model_kwargs") or {},
        model_blocks=config.get("model_blocks"),
        seq_len=config["seq_len"],
        micro_batch=micro_batch,
        grad_accum=config["batch_size"] // (nproc * micro_batch),
        precision=config["precision"],
        world_size=nproc,
        device=device,
        compiled=bool(config.get("compile")),
        checkpointing=bool(config.get("activation_checkpointing")),
        nodes=doc.get("nodes") or 1,
        strategy_options=config.get("strategy_options") or {},
    )
    return settings, measured, f"{device}, {path}"


@lru_cache(maxsize=8)
def _shape(model: str, model_kwargs: str, model_blocks: tuple[str, ...] | None) -> ModelShape:
    """Built once per model for all the runs of a calibration (a meta-device build takes a while)."""
    return shape_of_spec(model, json.loads(model_kwargs), list(model_blocks) if model_blocks else None)


def shape_of(settings: RunSettings) -> ModelShape:
    blocks = tuple(settings.model_blocks) if settings.model_blocks else None
    return _shape(settings.model, json.dumps(settings.model_kwargs, sort_keys=True), blocks)


def question_for(settings: RunSettings, measurement: Measurement, factors: SpeedFactors) -> Question:
    """The planning question one measured run answered."""
    spec = gpu_spec(settings.device)
    assert spec is not None, settings.device
    world = measurement.world_size or settings.world_size
    per_rank = settings.micro_batch * settings.grad_accum * settings.world_size // world
    options = {k: v for k, v in settings.strategy_options.items() if not isinstance(v, dict)}
    options.update(settings.strategy_options.get(measurement.strategy) or {})
    return Question(
        shape=shape_of(settings),
        gpus=world,
        nodes=min(settings.nodes, world),
        gpu_mem_bytes=spec.memory_gb * 1e9,
        micro_batch=settings.micro_batch,
        grad_accum=per_rank // settings.micro_batch,
        seq_len=settings.seq_len,
        precision=settings.precision,
        checkpointing=settings.checkpointing,
        topology=Topology(world, min(settings.nodes, world), INTERCONNECTS["nvlink"], INTER_NODE["infiniband"]),
        peak_flops=spec.peak_flops[settings.precision],
        hbm_bytes_per_s=spec.hbm_bytes_per_s,
        factors=factors,
        strategy_options=options,
        compiled=settings.compiled,
    )


def fit(settings: RunSettings, measurements: list[Measurement], basis: str) -> tuple[SpeedFactors, list[FitRow]]:
    models = planner_models()
    known = {m.strategy: m for m in measurements if m.strategy in models}
    if REFERENCE_NAME not in known:
        raise PlanError(
            f"calibration needs a run of {REFERENCE_NAME!r} (it fixes the compute scale): include it in the compare"
        )
    reference = _plan(settings, known[REFERENCE_NAME], SpeedFactors(basis=basis))
    scale = known[REFERENCE_NAME].step_s / reference.time.compute_s
    factors = SpeedFactors(compute_scale=scale, basis=basis, measured=True)
    params = shape_of(settings).params
    rows: list[FitRow] = []
    # The reference first (its step is the scale); offload strategies last: they take their
    # sibling's overhead price before the host's share.
    ordered = sorted(known.values(), key=lambda m: (m.strategy != REFERENCE_NAME, models[m.strategy].offload_optimizer))
    for m in ordered:
        backend = models[m.strategy]
        plan = _plan(settings, m, factors)
        t = plan.time
        if m.strategy == REFERENCE_NAME:
            fitted = f"compute scale {scale:.3f} (the model's compute, measured against the compute model's)"
        elif backend.offload_optimizer:
            sibling = counterpart(backend, offload=False, via_accelerate=False)
            price = factors.overhead_s.get(sibling, 0.0) if sibling else 0.0
            rate = factors.host_s_per_param.get(m.strategy, HOST_ADAM_S_PER_PARAM)
            stepped = t.offload_step_s / rate  # parameters a node's host steps
            host_work = m.step_s - (t.step_s - t.offload_step_s - t.overhead_s) - t.overhead_units * price
            factors = replace(
                factors,
                overhead_s={**factors.overhead_s, m.strategy: price},
                host_s_per_param={**factors.host_s_per_param, m.strategy: max(host_work, 0.0) / stepped},
            )
            fitted = f"host step {factors.host_s_per_param[m.strategy] * 1e9:.2f} ns per parameter" + (
                f" (after {sibling}'s overhead)" if sibling else ""
            )
        elif t.overhead_units:
            price = max(m.step_s - t.step_s, 0.0) / t.overhead_units
            factors = replace(factors, overhead_s={**factors.overhead_s, m.strategy: price})
            fitted = f"{price * 1e6:.3g} us per unit of {t.overhead_what}"
        else:
            fitted = f"nothing to fit ({(m.step_s - t.step_s) / t.step_s:+.1%} against the model)"
        missed = None if m.peak_bytes is None or plan.peak_bytes is None else m.peak_bytes - plan.peak_bytes
        if missed is not None:
            factors = replace(factors, memory_per_param={**factors.memory_per_param, m.strategy: missed / params})
        rows.append(
            FitRow(
                m.strategy, m.step_s, t.compute_s, t.exposed_comm_s, t.overhead_units, t.overhead_what, fitted, missed
            )
        )
    return factors, rows


def _plan(settings: RunSettings, measurement: Measurement, factors: SpeedFactors) -> StrategyPlan:
    return plan_strategy(measurement.strategy, question_for(settings, measurement, factors))
