"""The calibration that cannot contradict itself: every strategy the shipped H100 compare measured
reproduced at gpt2-124m, each one's efficiency against `single` carried to gpt2-350m, no
negative overheads, strategies priced apart never called alike, an implausible fit reported and
not used; and a compare calibrating the plan for another size."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness.plan.memory.memory_correction import MemoryCorrection
from harness.plan.model.model_shape import PlanError
from harness.plan.parallel.engines import engine_differences
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from harness.plan.speed.calibration import (
    CURRENT_REFERENCE,
    REFERENCE,
    Measurement,
    RunSettings,
    _read_results,
    calibrate_from,
    calibration_for_report,
    default_factors,
    fit,
    question_for,
)
from harness.plan.speed.step_time import SpeedFactors
from harness.report.report_cli import build_report
from tests.helpers import run_cli

H100 = "NVIDIA H100 80GB HBM3"
GIB = 2**30


@pytest.fixture(scope="module")
def reference():
    settings, measurements, _ = _read_results(json.loads(REFERENCE.read_text()), REFERENCE)
    return settings, measurements, default_factors()


def test_every_strategy_of_the_reference_runs_is_reproduced(reference):
    """The H200's runs of the current code set each backend's overhead and memory correction; the H100
    compare, which predates its DeepSpeed and Accelerate configurations, only the compute scale and
    what the H200's runs did not measure (the offload strategies)."""
    _, _, factors = reference
    assert factors.measured is False and "2026-11-30" in factors.basis and "2026-11-23" in factors.basis
    assert 0.9 < factors.compute_scale < 1.1  # the compute model describes the H100 it was derived on
    assert all(v >= 0 for v in factors.overhead_s.values())
    current = _read_results(json.loads(CURRENT_REFERENCE.read_text()), CURRENT_REFERENCE)
    older = _read_results(json.loads(REFERENCE.read_text()), REFERENCE)
    held = [(current[0], m) for m in current[1]]
    held += [(older[0], m) for m in older[1] if m.strategy not in {n.strategy for n in current[1]}]
    assert len(current[1]) == 12 and len(held) == 15
    for settings, m in held:
        plan = plan_strategy(m.strategy, question_for(settings, m, factors))
        assert plan.time.step_s == pytest.approx(m.step_s, rel=0.05), m.strategy
        assert plan.peak_bytes == pytest.approx(m.peak_bytes, rel=0.05), m.strategy


def test_each_efficiency_against_single_carries_to_gpt2_350m(reference):
    """The H100 compare's factors alone, carried to gpt2-350m on the same H100, micro-batch 16 x 1024
    at the same code (the measurements' batch-search compare): single 146,479 and zero3 64,086
    tokens/s, peaks 27.5 and 26.7 GiB."""
    settings, measurements, _ = reference
    factors, _ = fit(settings, measurements, "the H100 compare")
    bigger = replace(settings, model="gpt2-350m")
    single = plan_strategy("single", question_for(bigger, Measurement("single", 0), factors))
    zero3 = plan_strategy("zero3", question_for(bigger, Measurement("zero3", 0), factors))
    assert single.time.tokens_per_s == pytest.approx(146_479, rel=0.10)
    assert zero3.time.tokens_per_s / single.time.tokens_per_s == pytest.approx(64_086 / 146_479, rel=0.25)
    assert single.peak_bytes / GIB == pytest.approx(27.5, rel=0.05)
    assert zero3.peak_bytes / GIB == pytest.approx(26.7, rel=0.05)


def test_strategies_measured_apart_are_never_called_alike(reference):
    settings, _, factors = reference
    q = question_for(settings, Measurement("zero3", 0), factors)
    plans = [
        plan_strategy(n, q)
        for n in ("zero3", "accelerate-zero3", "zero2", "accelerate-zero2", "zero1", "accelerate-zero1", "ddp")
        + ("accelerate-ddp", "hsdp", "accelerate-hsdp")
    ]
    said = "\n".join(engine_differences(plans, q))
    assert "accelerate-zero3 and zero3 drive the same engine with the same settings: measured apart" in said
    assert "accelerate-zero2 and zero2 drive the same engine with the same settings: measured apart" in said
    by_name = {p.name: p for p in plans}
    for native in ("zero3", "zero2"):
        ours, theirs = by_name[f"accelerate-{native}"].time.step_s, by_name[native].time.step_s
        assert (ours > theirs) == ("more of the backend's own work in accelerate-" + native in said)
    # A pair called alike is priced alike, to the last digit.
    for line in (line for line in said.splitlines() if line.endswith("planned alike.")):
        ours, native = line.split(" drive ")[0].split(" and ")
        assert by_name[ours].time.step_s == by_name[native].time.step_s, line


SETTINGS = RunSettings(
    model="gpt2-124m", seq_len=1024, micro_batch=8, grad_accum=1, precision="bf16", world_size=1, device=H100
)
# What a made-up machine "measures": each figure the fit should recover.
TRUE = SpeedFactors(
    compute_scale=1.25,
    overhead_s={"zero3": 0.11, "fsdp": 0.02, "zero3-offload": 0.11},
    host_s_per_param={"zero3-offload": 3e-9},
    memory={"zero3": MemoryCorrection(fixed_bytes=0.3 * GIB), "single": MemoryCorrection(fixed_bytes=-0.1 * GIB)},
)
STRATEGIES = ("single", "fsdp", "zero3", "zero3-offload", "ddp")


def write_compare(
    out: Path,
    model: str = "gpt2-124m",
    machine: SpeedFactors = TRUE,
    steps: dict | None = None,
    micro_batch: int = 8,
) -> None:
    """A compare folder whose figures are what `machine` predicts (as a machine with those costs
    would measure); `steps` overrides a strategy's step time."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    settings = replace(SETTINGS, model=model, micro_batch=micro_batch)
    for name in STRATEGIES:
        plan = plan_strategy(name, question_for(settings, Measurement(name, 0.0), machine))
        step = (steps or {}).get(name, plan.time.step_s)
        entries.append(
            {
                "name": name,
                "status": "ok",
                "nproc": 1,
                "run_dir": name,
                "step_time_s": step,
                "tokens_per_s": micro_batch * 1024 / step,
                "peak_mem_allocated_bytes": plan.peak_bytes,
            }
        )
    doc = {
        "format": 2,
        "config": {
            "model": model,
            "model_kwargs": {},
            "seq_len": 1024,
            "batch_size": micro_batch,
            "micro_batch": None,
            "precision": "bf16",
            "compile": False,
            "activation_checkpointing": False,
            "strategy_options": {},
            "steps": 10,
        },
        "nproc": 1,
        "precision": "bf16",
        "device_type": "cuda",
        "reference": "single",
        "tolerance": 2e-2,
        "environment": {"device": H100, "devices": 1, "world_size": 1, "host": "test", "versions": {}},
        "model": {"name": model},
        "strategies": entries,
    }
    (out / "results.json").write_text(json.dumps(doc))


def test_a_compare_calibrates_the_plan_for_another_model_size(tmp_path):
    write_compare(tmp_path / "compare")
    factors, rows = calibrate_from(tmp_path / "compare")
    assert factors.measured and H100 in factors.basis
    assert factors.compute_scale == pytest.approx(TRUE.compute_scale)
    for name in ("zero3", "fsdp"):
        assert factors.overhead_s[name] == pytest.approx(TRUE.overhead_s[name]), name
    assert factors.host_s_per_param["zero3-offload"] == pytest.approx(3e-9)  # after zero3's own overhead
    for name in ("zero3", "single"):  # one size and micro-batch: a miss is carried as fixed bytes
        assert factors.memory[name].fixed_bytes == pytest.approx(TRUE.memory[name].fixed_bytes, abs=1), name
    assert {r.strategy: r.fitted for r in rows}["ddp"].startswith("0.0 ms per micro-step")
    # The calibrated plan for gpt2-350m uses the measured figures and says so.
    calibrated = question(PlanConfig(model="gpt2-350m", gpus=1, micro_batch=8, calibrate=str(tmp_path / "compare")))
    assumed = question(PlanConfig(model="gpt2-350m", gpus=1, micro_batch=8))
    for name in ("single", "zero3", "zero3-offload"):
        true_machine = question_for(replace(SETTINGS, model="gpt2-350m"), Measurement(name, 0.0), TRUE)
        assert plan_strategy(name, calibrated).time.step_s == pytest.approx(
            plan_strategy(name, true_machine).time.step_s, rel=1e-9
        ), name
    assert plan_strategy("zero3", calibrated).time.step_s != pytest.approx(plan_strategy("zero3", assumed).time.step_s)
    proc = run_cli(["plan", "model=gpt2-350m", "gpus=1", f"calibrate={tmp_path / 'compare'}"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"measured from {H100}" in proc.stdout and "x 1.25 (measured)" in proc.stdout
    assert "calibrate=<out_dir" not in proc.stdout  # nothing left assumed but the links
    # The compare records the same fit in results.json, and its report shows it.
    results = tmp_path / "compare" / "results.json"
    doc = json.loads(results.read_text())
    doc["calibration"] = calibration_for_report(tmp_path / "compare")
    results.write_text(json.dumps(doc))
    build_report(tmp_path / "compare")
    calibration = (tmp_path / "compare" / "report.md").read_text().split("## Calibration")[1]
    assert "compute scale 1.25" in calibration and "`zero3`" in calibration and "plan calibrate=" in calibration


def test_a_strategy_faster_than_the_model_is_priced_at_nothing_and_said_so(tmp_path):
    write_compare(tmp_path / "fast", machine=replace(TRUE, overhead_s={}), steps={"fsdp": 0.001})
    factors, rows = calibrate_from(tmp_path / "fast")
    assert factors.overhead_s["fsdp"] == 0.0 and min(factors.overhead_s.values()) >= 0
    fsdp = next(r for r in rows if r.strategy == "fsdp")
    assert fsdp.fitted.startswith("nothing: measured") and "faster than the model" in fsdp.fitted


def test_an_implausible_compute_scale_is_reported_not_used(tmp_path):
    slow = plan_strategy("single", question_for(SETTINGS, Measurement("single", 0.0), TRUE)).time.step_s * 10
    write_compare(tmp_path / "odd", steps={"single": slow})
    factors, _ = calibrate_from(tmp_path / "odd")
    assert factors.compute_scale == 1.0 and "outside 0.5-2.0" in factors.unused[0]
    proc = run_cli(["plan", "model=gpt2-124m", "gpus=1", f"calibrate={tmp_path / 'odd'}"], timeout=120)
    assert proc.returncode == 0 and "calibration not used: compute scale" in proc.stdout


def test_calibrating_from_what_cannot_calibrate_is_one_line(tmp_path):
    proc = run_cli(["plan", "model=gpt2-124m", f"calibrate={tmp_path}"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no results.json or summary.json" in proc.stderr
    write_compare(tmp_path / "cpu")
    doc = json.loads((tmp_path / "cpu" / "results.json").read_text())
    doc["environment"]["device"] = "cpu"
    (tmp_path / "cpu" / "results.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="not a GPU the planner knows"):
        calibrate_from(tmp_path / "cpu")
    doc["environment"]["device"] = H100
    doc["strategies"] = [e for e in doc["strategies"] if e["name"] != "single"]
    (tmp_path / "cpu" / "results.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="needs a run of a one-GPU strategy such as 'single'"):
        calibrate_from(tmp_path / "cpu")


def test_strategies_sharing_an_engine_say_what_differs():
    # Four micro-steps: Accelerate keeps FSDP2's gradients unsharded until the last (its no_sync), fsdp reduces each.
    q = question(PlanConfig(model="gpt2-1.5b", gpus=8, micro_batch=2, batch_size=64))
    plans = [plan_strategy(n, q) for n in ("ddp", "accelerate-ddp", "fsdp", "accelerate-fsdp")]
    said = "\n".join(engine_differences(plans, q))
    assert (
        "accelerate-fsdp differs from fsdp, the engine it drives: gradient sync: the last micro-step (not every "
        "micro-step)"
    ) in said
    assert "GB less on the wire per step" in said and "GB more at peak" in said
    assert "accelerate-ddp and ddp drive the same engine with the same settings" in said
    one = question(PlanConfig(model="gpt2-124m", gpus=1, micro_batch=4))
    alone = engine_differences([plan_strategy("ddp", one), plan_strategy("accelerate-ddp", one)], one)
    assert "model wrapper: none (one process) (not DistributedDataParallel)" in alone[0]


def test_the_calibration_check_holds_a_calibrated_plan_to_another_size(tmp_path):
    from bench.calibration_check import check

    write_compare(tmp_path / "124m")
    write_compare(tmp_path / "350m", model="gpt2-350m")  # the same machine at another size: predicted exactly
    lines, met = check(tmp_path / "124m", tmp_path / "350m")
    assert met and len([line for line in lines if line.startswith("| zero3 ")]) == 1
    assert "| single | " in "\n".join(lines) and "+0.0%" in "\n".join(lines)
    # A machine whose ZeRO-3 costs four times as much at 350m as the calibration saw: missed, and said.
    slower = replace(TRUE, overhead_s={**TRUE.overhead_s, "zero3": 0.44})
    write_compare(tmp_path / "350m-slow", model="gpt2-350m", machine=slower)
    lines, met = check(tmp_path / "124m", tmp_path / "350m-slow")
    zero3 = next(line for line in lines if line.startswith("| zero3 |"))
    assert not met and zero3.endswith("missed |") and "not met" in lines[-1]


def test_a_memory_miss_is_split_by_kind_where_the_compares_tell_the_kinds_apart(tmp_path):
    """Peaks measured at two micro-batches of gpt2-124m and at gpt2-350m: the fixed part, the share
    of the activations and the bytes per parameter held are each recovered, and carried to 70B
    by what each grows with."""
    kinds = MemoryCorrection(fixed_bytes=0.2 * GIB, activation_share=0.03, bytes_per_param=0.5)
    machine = replace(TRUE, memory={"zero3": kinds, "fsdp": kinds})
    write_compare(tmp_path / "124m-8", machine=machine)
    write_compare(tmp_path / "124m-4", machine=machine, micro_batch=4)
    write_compare(tmp_path / "350m-8", model="gpt2-350m", machine=machine)
    factors, _ = calibrate_from(tmp_path / "124m-8", tmp_path / "124m-4", tmp_path / "350m-8")
    for name in ("zero3", "fsdp"):
        fitted = factors.memory[name]
        assert fitted.fixed_bytes == pytest.approx(kinds.fixed_bytes, rel=1e-3), name
        assert fitted.activation_share == pytest.approx(kinds.activation_share, rel=1e-3), name
        assert fitted.bytes_per_param == pytest.approx(kinds.bytes_per_param, rel=1e-3), name
    # The same machine planned at 70B on 64 GPUs: the fitted plan is the machine's.
    big = question(PlanConfig(params=70e9, gpus=64, micro_batch=2, seq_len=4096, strategies=["zero3"]))
    assert plan_strategy("zero3", replace(big, factors=factors)).peak_bytes == pytest.approx(
        plan_strategy("zero3", replace(big, factors=machine)).peak_bytes, rel=1e-3
    )


def test_a_memory_correction_follows_the_parameters_each_gpu_holds():
    """A miss per parameter is carried by what each GPU keeps: under ZeRO-3 on 64 GPUs a 64th of
    the model's, so an over-prediction found at one size cannot turn a peak at another negative."""
    q = question(PlanConfig(model="gpt2-1.5b", gpus=64, strategies=["zero3", "ddp"]))
    per_param = -0.1  # bytes: the model held a tenth of a byte a parameter more than measured
    uncorrected = replace(q, factors=replace(q.factors, memory={}))
    correction = MemoryCorrection(bytes_per_param=per_param)
    corrected = replace(q, factors=replace(q.factors, memory={"zero3": correction, "ddp": correction}))
    for name, share in (("zero3", 1 / 64), ("ddp", 1.0)):
        plain, fitted = plan_strategy(name, uncorrected), plan_strategy(name, corrected)
        assert fitted.peak_bytes - plain.peak_bytes == pytest.approx(per_param * q.shape.params * share, rel=1e-6)


def test_a_memory_correction_never_takes_the_peak_below_the_model_states():
    """However large the miss a calibration carries, it takes at most a quarter of what is transient
    at the peak: the model states a GPU holds stay under the peak."""
    q = question(PlanConfig(model="gpt2-1.5b", gpus=8, strategies=["zero2"]))
    plain = plan_strategy("zero2", replace(q, factors=replace(q.factors, memory={})))
    huge = MemoryCorrection(fixed_bytes=-1e12, activation_share=-0.25, bytes_per_param=-100.0)
    fitted = plan_strategy("zero2", replace(q, factors=replace(q.factors, memory={"zero2": huge})))
    resident = sum(fitted.states_on().values())
    assert fitted.peak_bytes == pytest.approx(resident + 0.75 * (plain.peak_bytes - resident), abs=1)


def test_a_7b_and_a_70b_planned_from_a_124m_calibration_hold_their_model_states(tmp_path):
    """A machine whose every peak at gpt2-124m sits 1.2 GB under the model's (what a per-parameter
    carry would have made 70 GB at 70B): each plan at 7B and 70B keeps every term possible, and
    carries the miss as the fixed bytes it was measured as."""
    miss = MemoryCorrection(fixed_bytes=-1.2e9)
    write_compare(tmp_path / "124m", machine=replace(TRUE, memory=dict.fromkeys(STRATEGIES, miss)))
    factors, _ = calibrate_from(tmp_path / "124m")
    for params, gpus in ((7e9, 8), (70e9, 64)):
        q = question(PlanConfig(params=params, gpus=gpus, micro_batch=1, seq_len=4096, activation_checkpointing=True))
        for name in ("fsdp", "zero3", "zero3-offload", "ddp"):
            plain = plan_strategy(name, replace(q, factors=replace(factors, memory={})))
            fitted = plan_strategy(name, replace(q, factors=factors))
            resident = sum(fitted.states_on().values())
            transient = plain.peak_bytes - resident
            assert fitted.peak_bytes >= resident >= 0, (name, params)
            assert fitted.peak_bytes - plain.peak_bytes == pytest.approx(max(-1.2e9, -0.25 * transient), abs=2), name


def test_each_gpu_steps_its_offloaded_shard_on_its_share_of_the_host():
    """The host step of optimizer offload is one GPU's shard at the per-GPU rate: a host is built
    with its GPUs' count of cores, so 8 GPUs on one host step their shards at once, as 8 GPUs on
    8 hosts do, not one after another on one GPU's worth of cores."""
    factors = default_factors()
    rate = factors.host_s_per_param["zero3-offload"]
    steps = {}
    for per_node in (1, 8):
        q = question(PlanConfig(model="gpt2-1.5b", gpus=8, gpus_per_node=per_node, micro_batch=2))
        steps[per_node] = plan_strategy("zero3-offload", q).time.offload_step_s
    assert steps[8] == pytest.approx(steps[1])
    assert steps[8] == pytest.approx(q.shape.params / 8 * rate, rel=0.01)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: d.__setitem__("nproc", 0), "its results are incomplete (ZeroDivisionError"),
        (
            lambda d: d["config"].__setitem__("precision", "fp4"),
            "its run's settings are not parabench's (KeyError: 'fp4')",
        ),
        (
            lambda d: d["config"].__setitem__("activation_checkpointing", "weird"),
            "its run's settings are not parabench's (KeyError: 'weird')",
        ),
    ],
)
def test_a_hand_edited_results_file_is_one_line(tmp_path, edit, says):
    # Each was a traceback from deep in the fit.
    write_compare(tmp_path / "c")
    doc = json.loads((tmp_path / "c" / "results.json").read_text())
    edit(doc)
    (tmp_path / "c" / "results.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=re.escape(says)):
        calibrate_from(tmp_path / "c")


def test_the_compute_scale_stays_on_the_card_it_was_measured_on():
    reference = default_factors()
    assert reference.card == "H100 SXM 80GB" and reference.compute_scale != 1.0
    on = {gpu: question(PlanConfig(model="gpt2-124m", gpus=1, gpu=gpu)) for gpu in ("H100", "MI300X", "GB200")}
    assert on["H100"].factors.compute_scale == reference.compute_scale
    # Another card's compute is its own figures': the H100's measured correction is not carried to it,
    # while the backends' own work, a property of the software, is.
    for gpu in ("MI300X", "GB200"):
        assert on[gpu].factors.compute_scale == 1.0 and on[gpu].factors.overhead_s == reference.overhead_s
    proc = run_cli(["plan", "model=gpt2-124m", "gpus=1", "gpu=MI300X"], timeout=120)
    assert proc.returncode == 0 and "unscaled (the compute scale measured is the H100 SXM 80GB's" in proc.stdout
