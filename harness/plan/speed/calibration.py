"""The speed model's factors fitted to what a machine measured (speed.SpeedFactors), so that the
plan reproduces every strategy measured there and carries each to other sizes by the model's
own terms.

From a compare's results.json (or a train run's summary.json) the planner rebuilds each run's
question (model, micro-batch, precision, world size, device) and predicts it; then, in order:
  compute scale   a one-GPU strategy's (`single`'s) measured step over its predicted one:
                  the whole compute model scaled, not replaced; a scale outside [0.5, 2] says the
                  model does not describe the machine, and is reported, not used
  overheads       for each other strategy, what it measured beyond the scaled compute and the
                  communication no compute hides, as time per micro-step (speed.py says why);
                  one measured faster than the model is priced at nothing, and said so
  host step       for each offload strategy, what remains after its sibling's overhead
                  (zero3-offload after zero3's), per parameter stepped on the host
  memory          each strategy's measured peak allocated less the predicted one, split into
                  fixed bytes, a share of the activations and bytes per parameter held as far as
                  the peaks measured (this compare's, and those of `calibrate_from`'s further
                  compares) can tell them apart (memory_correction.py), where each miss is within
                  MEMORY_CORRECTION_LIMIT of its measurement (beyond, reported)
Every strategy is priced from its own measurement, so two that drive the same engine with the
same settings but measured apart (accelerate-zero3 and zero3) are planned apart, and the plan
says by how much. Without a measurement of its own the planner uses the factors fitted the same
way to the reference runs shipped with parabench and says they are assumed: an H200's runs of
12 strategies at the current code (reference_h200.json: each backend's overhead and memory
correction), and an H100 compare of 15 strategies (reference_h100.json) for the offload strategies'
host steps and the H100's compute scale, which the H200's runs did not measure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from configs.schema import checkpointing_mode
from harness.common.hardware import gpu_spec
from harness.plan.memory.memory_correction import MemoryCorrection, MissPoint, fit_correction
from harness.plan.model.model_shape import ModelShape, PlanError, shape_of_spec
from harness.plan.network.fabric import default_fabric, topology_of
from harness.plan.parallel.backends import counterpart, planner_models
from harness.plan.predict import Question, StrategyPlan, params_held, plan_strategy
from harness.plan.speed.attention import sdpa_kernel
from harness.plan.speed.step_time import HOST_ADAM_S_PER_PARAM, SpeedFactors

REFERENCE = Path(__file__).with_name("reference_h100.json")
CURRENT_REFERENCE = Path(__file__).with_name("reference_h200.json")
REFERENCE_BASIS = (
    "parabench's reference runs (gpt2-124m, bf16, micro-batch 16 x 1024, one GPU: an H200's of 2026-11-30; "
    "an H100's of 2026-11-23 for offloading)"
)
SCALE_RANGE = (0.5, 2.0)  # a compute scale outside it means the model misdescribes the machine
MEMORY_CORRECTION_LIMIT = 0.25  # of the measured peak: a larger miss is a model to fix, not to patch


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
    checkpointing: str = "none"
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
    overhead_s: float
    fitted: str  # what this row set, in words
    memory_missed_bytes: float | None = None


def default_factors() -> SpeedFactors:
    """The factors fitted to the reference compare shipped with parabench (assumed elsewhere)."""
    return _reference_factors()


@lru_cache(maxsize=1)
def _reference_factors() -> SpeedFactors:
    """The H100 compare's compute scale (for plans on that card) and offload host steps; each backend
    the H200 runs measured takes its overhead and memory correction from them instead: they ran the
    current DeepSpeed and Accelerate configurations, which the H100 compare predates."""
    compare, _ = fit(*_read_results(json.loads(REFERENCE.read_text()), REFERENCE)[:2], "")
    runs, _ = fit(*_read_results(json.loads(CURRENT_REFERENCE.read_text()), CURRENT_REFERENCE)[:2], "")
    return replace(
        compare,
        overhead_s={**compare.overhead_s, **runs.overhead_s},
        memory={**compare.memory, **runs.memory},
        unused=compare.unused + runs.unused,
        basis=REFERENCE_BASIS,
        measured=False,
    )


def calibrate_from(path: Path, *more: Path) -> tuple[SpeedFactors, list[FitRow]]:
    """Fit to a compare folder (results.json) or a train folder (summary.json); the peaks of
    `more` (compares at other sizes or micro-batches) split each memory miss by kind."""
    settings, measurements, basis = read_measurements(path)
    others = [read_measurements(other)[:2] for other in more]
    try:
        return fit(settings, measurements, basis, others)
    except PlanError:
        raise
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:  # a hand-edited setting
        raise PlanError(
            f"calibrate={path}: its run's settings are not parabench's ({type(exc).__name__}: {exc}): "
            "give the out_dir of a finished compare or train run as it wrote it"
        ) from None


def calibration_for_report(compare_dir: Path) -> dict[str, Any]:
    """The fit to a compare's results.json as plain data for its report: the compute scale and a
    row per strategy, or why there is none."""
    try:
        factors, rows = calibrate_from(compare_dir)
    except PlanError as exc:  # a CPU run, or no `single`: nothing the planner can calibrate from
        return {"error": str(exc)}
    return {
        "compute_scale": factors.compute_scale,
        "rows": [asdict(row) for row in rows],
        "unused": list(factors.unused),
    }


def read_measurements(path: Path) -> tuple[RunSettings, list[Measurement], str]:
    """A compare's or a train run's measurements: its out_dir, or its results.json / summary.json."""
    results, summary = path / "results.json", path / "summary.json"
    if path.is_file():
        results, summary = (path, path / "-") if "summary" not in path.name else (path / "-", path)
    try:
        if results.is_file():
            return _read_results(_object_in(results, path), path)
        if summary.is_file():
            return _read_summary(_object_in(summary, path), path)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:  # a field of the wrong kind too
        if isinstance(exc, PlanError):
            raise
        raise PlanError(
            f"calibrate={path}: its results are incomplete ({type(exc).__name__}: {exc}): "
            "give the out_dir of a finished compare or train run"
        ) from None
    raise PlanError(
        f"calibrate={path}: no results.json or summary.json there: give the out_dir of a "
        "`runner.py compare` or `runner.py train` run"
    )


def _object_in(file: Path, path: Path) -> dict[str, Any]:
    """The JSON object `file` holds; anything else (a list, a number) was not written by a compare
    or a train run, and is one line naming the file rather than an AttributeError on its fields."""
    doc = json.loads(file.read_text())
    if not isinstance(doc, dict):
        raise PlanError(
            f"calibrate={path}: {file} holds no JSON object of results: give the out_dir of a finished compare "
            "(or train run)"
        )
    return doc


def _read_results(doc: dict[str, Any], path: Path) -> tuple[RunSettings, list[Measurement], str]:
    device = (doc.get("environment") or {}).get("device") or ""
    measured = [
        Measurement(e["name"], e["step_time_s"], e.get("peak_mem_allocated_bytes"), e.get("nproc"))
        for e in doc["strategies"]
        if e.get("status") == "ok" and e.get("step_time_s")
    ]
    return (
        _settings(doc["config"], doc["nproc"], device, doc.get("nodes") or 1, path),
        _checked(measured, path),
        f"{device}, {path}",
    )


def _read_summary(doc: dict[str, Any], path: Path) -> tuple[RunSettings, list[Measurement], str]:
    config, nproc, device = doc["config"], doc["world_size"], doc.get("device") or ""
    measured = (
        [Measurement(config["strategy"], doc["step_time_s"], doc.get("peak_mem_allocated_bytes"), nproc)]
        if doc.get("step_time_s")
        else []
    )
    return _settings(config, nproc, device, doc.get("nodes") or 1, path), _checked(measured, path), f"{device}, {path}"


def _checked(measured: list[Measurement], path: Path) -> list[Measurement]:
    if not measured:
        raise PlanError(f"calibrate={path}: no run there finished with a step time: run it to the end first")
    return measured


def _settings(config: dict[str, Any], nproc: int, device: str, nodes: int, path: Path) -> RunSettings:
    if gpu_spec(device) is None:
        raise PlanError(
            f"calibrate={path}: it ran on {device or 'an unknown device'}, not a GPU the planner knows: "
            "calibrate from a run on a GPU"
        )
    micro_batch = config.get("micro_batch") or config["batch_size"] // nproc
    return RunSettings(
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
        checkpointing=checkpointing_mode(config.get("activation_checkpointing"), config.get("selective_checkpointing")),
        nodes=nodes,
        strategy_options=config.get("strategy_options") or {},
    )


@lru_cache(maxsize=8)
def _shape(model: str, model_kwargs: str, model_blocks: tuple[str, ...] | None) -> ModelShape:
    """Read once per model for all the runs of a calibration."""
    return shape_of_spec(model, json.loads(model_kwargs), list(model_blocks) if model_blocks else None)


def shape_of(settings: RunSettings) -> ModelShape:
    blocks = tuple(settings.model_blocks) if settings.model_blocks else None
    return _shape(settings.model, json.dumps(settings.model_kwargs, sort_keys=True), blocks)


def question_for(settings: RunSettings, measurement: Measurement, factors: SpeedFactors) -> Question:
    """The planning question one measured run answered."""
    spec = gpu_spec(settings.device)
    assert spec is not None, settings.device
    world = measurement.world_size or settings.world_size
    nodes = min(settings.nodes, world)
    per_rank = settings.micro_batch * settings.grad_accum * settings.world_size // world
    options = {k: v for k, v in settings.strategy_options.items() if not isinstance(v, dict)}
    options.update(settings.strategy_options.get(measurement.strategy) or {})
    return Question(
        shape=shape_of(settings),
        topology=topology_of(spec, world, nodes, default_fabric(spec, spec.gpus_per_host)),
        capacity_bytes=spec.capacity_bytes,
        micro_batch=settings.micro_batch,
        grad_accum=per_rank // settings.micro_batch,
        seq_len=settings.seq_len,
        precision=settings.precision,
        gpu=spec,
        factors=factors,
        checkpointing=settings.checkpointing,
        compiled=settings.compiled,
        strategy_options=options,
        attention=sdpa_kernel(spec),  # what the measured run's SDPA ran
    )


def _plan(settings: RunSettings, measurement: Measurement, factors: SpeedFactors) -> StrategyPlan:
    return plan_strategy(measurement.strategy, question_for(settings, measurement, factors))


def fit(
    settings: RunSettings,
    measurements: list[Measurement],
    basis: str,
    more: list[tuple[RunSettings, list[Measurement]]] | None = None,
) -> tuple[SpeedFactors, list[FitRow]]:
    models = planner_models()
    known = {m.strategy: m for m in measurements if m.strategy in models}
    # The step of a strategy that runs the model alone on one GPU is all compute: it fixes the scale.
    alone = [n for n in known if models[n].one_process and not models[n].via_accelerate]
    if not alone:
        raise PlanError(
            "calibration needs a run of a one-GPU strategy such as 'single' (it fixes the compute scale): "
            "include it in the compare"
        )
    reference_name = alone[0]
    reference = _plan(settings, known[reference_name], SpeedFactors(basis=basis))
    scale = known[reference_name].step_s / reference.time.step_s
    unused: list[str] = []
    if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
        unused.append(
            f"compute scale {scale:.2f} ({reference_name} measured {known[reference_name].step_s * 1e3:.1f} ms "
            f"against the model's {reference.time.step_s * 1e3:.1f} ms): outside {SCALE_RANGE[0]}-{SCALE_RANGE[1]}, "
            "the model is kept unscaled"
        )
        scale = 1.0
    factors = SpeedFactors(compute_scale=scale, basis=basis, measured=True, card=gpu_spec(settings.device).name)
    rows: list[FitRow] = []
    # The reference first (its step is the scale); offload strategies last: they take their
    # sibling's overhead before the host's share.
    ordered = sorted(known.values(), key=lambda m: (m.strategy != reference_name, models[m.strategy].offload_optimizer))
    for m in ordered:
        backend = models[m.strategy]
        # Priced at nothing of its own while fitted (not at an engine it shares with one fitted before).
        factors = replace(factors, overhead_s={**factors.overhead_s, m.strategy: 0.0})
        plan = _plan(settings, m, factors)
        t = plan.time
        accum = question_for(settings, m, factors).grad_accum
        if m.strategy == reference_name:
            fitted = f"compute scale {factors.compute_scale:.3f} (the measured step over the compute model's)"
        elif backend.offload_optimizer:
            sibling = counterpart(backend, offload=False, via_accelerate=backend.via_accelerate)
            price = factors.overhead_s.get(sibling, 0.0) if sibling else 0.0
            rate = factors.host_s_per_param.get(m.strategy, HOST_ADAM_S_PER_PARAM)
            stepped = t.offload_step_s / rate  # parameters of one GPU's shard
            host_work = m.step_s - (t.step_s - t.offload_step_s) - accum * price
            factors = replace(
                factors,
                overhead_s={**factors.overhead_s, m.strategy: price},
                host_s_per_param={**factors.host_s_per_param, m.strategy: max(host_work, 0.0) / stepped},
            )
            fitted = f"host step {factors.host_s_per_param[m.strategy] * 1e9:.2f} ns per parameter" + (
                f" (after {sibling}'s overhead)" if sibling else ""
            )
        else:
            residual = m.step_s - t.step_s
            factors = replace(factors, overhead_s={**factors.overhead_s, m.strategy: max(residual, 0.0) / accum})
            fitted = (
                f"{residual / accum * 1e3:.1f} ms per micro-step of the backend's own work"
                if residual >= 0
                else f"nothing: measured {-residual / t.step_s:.1%} faster than the model, priced at the model's speed"
            )
        # The layout and the time do not depend on a memory correction: one plan serves both.
        final = _plan(settings, m, factors).time
        point = _memory_missed(settings, m, factors)
        rows.append(
            FitRow(
                m.strategy,
                m.step_s,
                final.compute_s,
                final.exposed_comm_s,
                final.overhead_s,
                fitted,
                None if point is None else point.missed,
            )
        )
    memory, too_far = _memory_corrections([(settings, measurements), *(more or [])], factors)
    return replace(factors, memory=memory, unused=tuple(unused + too_far)), rows


def _memory_corrections(
    compares: list[tuple[RunSettings, list[Measurement]]], factors: SpeedFactors
) -> tuple[dict[str, MemoryCorrection], list[str]]:
    """Each measured strategy's memory miss, by kind, over every peak measured of it; a miss
    beyond MEMORY_CORRECTION_LIMIT of its peak is reported and left out."""
    models = planner_models()
    points: dict[str, list[MissPoint]] = {}
    too_far: list[str] = []
    for settings, measurements in compares:
        for m in measurements:
            point = _memory_missed(settings, m, factors) if m.strategy in models else None
            if point is None:
                continue
            if abs(point.missed) > MEMORY_CORRECTION_LIMIT * m.peak_bytes:
                too_far.append(
                    f"{m.strategy}: peak {m.peak_bytes / 2**30:.2f} GiB measured at {settings.model}, "
                    f"{(m.peak_bytes - point.missed) / 2**30:.2f} predicted: too far apart to correct, "
                    "planned as the model has it"
                )
                continue
            points.setdefault(m.strategy, []).append(point)
    return {name: fit_correction(p) for name, p in points.items()}, too_far


def _memory_missed(settings: RunSettings, m: Measurement, factors: SpeedFactors) -> MissPoint | None:
    """The measured peak allocated less the model's (before any correction of its own), beside
    the activations and parameters the plan has there."""
    if m.peak_bytes is None:
        return None
    plain = replace(factors, memory={k: v for k, v in factors.memory.items() if k != m.strategy})
    plan = _plan(settings, m, plain)
    if plan.peak_bytes is None or plan.activations is None:
        return None
    held = params_held(shape_of(settings), plan.backend, plan.layout)
    tokens = settings.micro_batch * settings.seq_len
    return MissPoint(m.peak_bytes - plan.peak_bytes, plan.activations.total, held, tokens)
