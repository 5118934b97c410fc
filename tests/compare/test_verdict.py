"""Loss verdicts judged against measured noise, proved on deliberately wrong plugins.

The rule itself on synthetic curves; then real compares on the CPU at world size 2 with
wrong plugins registered through the entry-point group (bench/wrong_plugins.py): each is
"differs", every built-in strategy "matches" or "within noise", in fp32 and in bf16. Also
here: the learning-rate schedule that follows the model, the rounding noise itself,
deterministic=true, and the report's figure labels.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from bench.wrong_plugins import entry_points
from configs.schema import load_config
from harness.common.colours import strategy_colours
from harness.compare.compare_config import load_compare_config
from harness.compare.results import StrategyResult
from harness.compare.verdict import MATCH_FLOOR, judge, measure_noise
from harness.report.figures import draw_memory_vs_throughput, label_box
from harness.train.noise import UNIT_ROUNDOFF, RoundingNoise
from harness.train.optimizer import GPT3_LEARNING_RATES, lr_for_model_size, resolve_schedule
from models.zoo import build_model, num_params
from tests.helpers import NANO, ROOT, env_for_tests, read_run, run_cli

RUN_TIMEOUT = 600


def curve(losses: list[float]) -> list[dict]:
    return [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]


BASE = [4.0 / (1 + 0.1 * i) for i in range(12)]


def test_the_band_is_the_largest_spread_of_any_noise_run_within_the_window():
    reference = curve(BASE)
    # One run crosses the reference at step 5 (no spread there); the other strays most at step 9.
    one = curve([v * (1 + (0 if i == 4 else 1e-4)) for i, v in enumerate(BASE)])
    two = curve([v * (1 + (3e-4 if i == 8 else 1e-5)) for i, v in enumerate(BASE)])
    band = measure_noise(reference, [one, two], window=1)
    assert band.runs == 2 and band.steps == list(range(1, 13))
    assert band.spread[4] == pytest.approx(1e-5) and band.band[4] == pytest.approx(
        1e-4
    )  # neighbours cover the crossing
    assert band.spread[8] == pytest.approx(3e-4) and band.band[7] == band.band[9] == pytest.approx(3e-4)
    assert "4x the largest spread of 2 noise runs within 1 steps" in band.as_dict()["rule"]


def test_verdict_kinds_and_what_sets_the_bound():
    reference = curve(BASE)
    band = measure_noise(reference, [curve([v * (1 + 1e-3) for v in BASE])])  # a chaotic machine: 1e-3 of noise
    exact = judge(curve([v * (1 + 2e-7) for v in BASE]), reference, band, precision="fp32", tolerance=1e-4)
    assert exact.kind == "matches" and exact.max_rel_diff <= MATCH_FLOOR
    noisy = judge(curve([v * (1 - 3e-3) for v in BASE]), reference, band, precision="fp32", tolerance=1e-4)
    assert noisy.kind == "within noise" and noisy.agrees and noisy.noise_ratio == pytest.approx(0.75)
    assert "set by the measured noise" in noisy.text
    wrong = judge(
        curve([v * (1 + 0.01 * (i >= 6)) for i, v in enumerate(BASE)]),
        reference,
        band,
        precision="fp32",
        tolerance=1e-4,
    )
    assert wrong.kind == "differs" and wrong.first_step_over == 7 and wrong.noise_ratio == pytest.approx(2.5)
    assert wrong.text.startswith("differs from step 7: up to 1.0e-02 relative, 2.5x the bound")


def test_low_precision_allows_its_rounding_and_a_low_precision_loss_its_own():
    reference = curve(BASE)
    quiet = measure_noise(reference, [curve([v * (1 + 1e-6) for v in BASE])])
    fsdp_like = curve([v * (1 + 6e-4) for v in BASE])  # bf16 residual stream against autocast's fp32 one
    assert judge(fsdp_like, reference, quiet, precision="fp32", tolerance=1e-4).kind == "differs"
    bf16 = judge(fsdp_like, reference, quiet, precision="bf16", tolerance=1e-4)
    assert bf16.kind == "within noise" and "set by bf16 rounding" in bf16.text
    assert UNIT_ROUNDOFF["bf16"] == 2**-8
    # An fp32 run whose backend hands the loss back in bf16 may differ by that rounding.
    rounded = curve([v * (1 + 2e-3) for v in BASE])
    assert judge(rounded, reference, quiet, precision="fp32", tolerance=1e-4).kind == "differs"
    assert judge(rounded, reference, quiet, precision="fp32", tolerance=1e-4, loss_dtype="bf16").kind == "within noise"


def test_without_noise_runs_the_fixed_tolerance_names_the_first_step_over_it():
    reference = curve(BASE)
    over = judge(
        curve([v * (1 + 2e-4 * (i >= 3)) for i, v in enumerate(BASE)]),
        reference,
        None,
        precision="fp32",
        tolerance=1e-4,
    )
    assert over.kind == "differs" and over.first_step_over == 4 and "over 1e-04 from step 4" in over.text
    assert judge(curve(BASE[:5]), reference, None, precision="fp32", tolerance=1e-4).kind == "not comparable"


def test_learning_rate_follows_the_model_size_and_warm_up_the_run_length():
    for params, lr in GPT3_LEARNING_RATES:
        assert lr_for_model_size(int(params)) == pytest.approx(lr)
    gpt2 = num_params(build_model("gpt2-124m"))
    assert lr_for_model_size(gpt2) == pytest.approx(6e-4, rel=0.02)
    assert lr_for_model_size(num_params(build_model("gpt-nano"))) == 3e-3  # below the table: capped
    schedule = resolve_schedule(None, None, None, params=gpt2, steps=50)
    assert (schedule.warmup_steps, schedule.min_lr) == (5, pytest.approx(schedule.lr / 10))
    assert schedule.derived == ("lr", "min_lr", "warmup_steps")
    assert schedule.at(0, 50) < schedule.at(4, 50) == pytest.approx(schedule.lr * 5 / 6)
    given = resolve_schedule(1e-3, None, 2, params=gpt2, steps=50)
    assert (given.lr, given.warmup_steps, given.derived) == (1e-3, 2, ("min_lr",))
    # The default compare leaves the schedule to the model: gpt-nano keeps 3e-3 -> 3e-4 over 3 steps.
    cfg = load_compare_config([])
    assert (cfg.lr, cfg.min_lr, cfg.warmup_steps) == (None, None, None)
    nano = resolve_schedule(
        cfg.lr, cfg.min_lr, cfg.warmup_steps, params=num_params(build_model(cfg.model)), steps=cfg.steps
    )
    assert (nano.lr, nano.min_lr, nano.warmup_steps) == (3e-3, pytest.approx(3e-4), 3)
    with pytest.raises(ValueError, match="lr=-1.0 must be positive"):
        load_config(["lr=-1"])


def test_rounding_noise_moves_every_gradient_by_up_to_one_rounding_step_of_its_tensors_scale():
    def nudged(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        param = torch.nn.Parameter(torch.ones(1001))
        param.grad = torch.linspace(-1, 1, 1001)
        optimizer = RoundingNoise("bf16", seed, rank=0).attach(torch.optim.SGD([param], lr=0.0))
        before = param.grad.clone()
        optimizer.step()
        return before, param.grad

    before, after = nudged(seed=1)
    step = UNIT_ROUNDOFF["bf16"] * float(before.pow(2).mean().sqrt())  # one rounding step of the tensor's RMS
    moved = after - before
    assert float(moved.abs().max()) <= step and float(moved.std()) > step / 4
    # As rounding inside a sum does, a small element may change sign; the large ones keep theirs.
    assert bool((torch.sign(after) != torch.sign(before))[before.abs() < step / 2].any())
    assert bool((torch.sign(after) == torch.sign(before))[before.abs() > step].all())
    assert torch.equal(nudged(seed=1)[1], after) and not torch.equal(nudged(seed=2)[1], after)


@pytest.mark.slow
def test_deterministic_runs_repeat_bit_for_bit_and_say_so(tmp_path):
    losses = []
    for run in ("a", "b"):
        proc = run_cli(
            ["train", "strategy=single", "deterministic=true", f"out_dir={tmp_path / run}", *NANO], timeout=180
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary, rows = read_run(tmp_path / run)
        assert summary["deterministic"]["use_deterministic_algorithms"] is True
        assert summary["deterministic"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        losses.append([r["loss"] for r in rows])
    assert losses[0] == losses[1]


# An H100 compare of gpt2-124m in bf16: (name, tokens/s, peak allocated bytes).
# Its labels overlapped ("single"/"ddp", "fsdp"/"accelerate-zero1").
H100_POINTS = [
    ("single", 314321, 17226365952),
    ("ddp", 313260, 17727378432),
    ("fsdp", 263934, 16425517568),
    ("fsdp-grad-op", 330324, 16601911808),
    ("fsdp-offload", 44421, 14931159040),
    ("zero1", 260981, 16594404352),
    ("zero2", 243667, 16594404352),
    ("zero3", 95960, 16845473280),
    ("zero2-offload", 85841, 15179512320),
    ("zero3-offload", 54721, 15107947008),
    ("accelerate-ddp", 310647, 17226365952),
    ("accelerate-fsdp", 238268, 16425517568),
    ("accelerate-zero1", 263324, 16594404352),
    ("accelerate-zero2", 177668, 16594404352),
    ("accelerate-zero3", 91304, 16844817920),
]


def test_memory_against_throughput_labels_cover_no_other_label_or_point():
    results = [
        StrategyResult(
            name=n,
            tokens_per_s=t,
            peak_mem_allocated_bytes=m,
            mem_params_bytes=1,
            mem_grads_bytes=1,
            mem_optimizer_bytes=1,
        )
        for n, t, m in H100_POINTS
    ]
    fig, labels = draw_memory_vs_throughput(results, strategy_colours([r.name for r in results]), "cuda")
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = [label_box(label, renderer) for label in labels]
    assert sorted(label.get_text() for label in labels) == sorted(n for n, _, _ in H100_POINTS)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    points = [ax.transData.transform((m / 2**30, t)) for _, t, m in H100_POINTS]
    assert not [p for p in points for box in boxes if box.contains(*p)]
    inside = ax.get_window_extent(renderer)
    assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for b in boxes)


# ---- real compares with wrong plugins -------------------------------------------------------

WRONG = ("lr-off", "grads-not-reduced", "drops-rank1-grads")


def plugin_env(tmp_path: Path) -> dict[str, str]:
    env = env_for_tests()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(entry_points(tmp_path / "site"))])
    return env


def compare(out: Path, strategies: list[str], extra: list[str], env: dict[str, str]) -> dict[str, dict]:
    proc = run_cli(
        ["compare", f"strategies=[{','.join(strategies)}]", "noise_runs=1", f"out_dir={out}", *NANO, *extra],
        timeout=RUN_TIMEOUT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    noise = doc["noise"]
    assert noise["skipped"] is None and [run["status"] for run in noise["runs"]] == ["ok"]
    assert len(noise["band"]["spread"]) == len(noise["band"]["steps"]) == 10 and noise["band"]["rule"]
    return {entry["name"]: entry for entry in doc["strategies"]}


@pytest.mark.slow
def test_a_real_compare_judges_built_ins_agreeing_and_wrong_plugins_differing_in_fp32(tmp_path):
    out = tmp_path / "fp32"
    # Each built-in's own agreement is the equivalence tests'; here two engines stand for them.
    built_in = ["single", "ddp", "fsdp"]
    # An option only FSDP knows, in fsdp's own section: ddp and single would refuse it.
    results = compare(
        out,
        built_in + list(WRONG),
        ["batch_search=true", "strategy_options.fsdp.prefetch_blocks=1"],
        plugin_env(tmp_path),
    )
    for name in built_in[1:]:
        assert results[name]["verdict_kind"] == "matches", (name, results[name]["verdict"])
        assert results[name]["max_rel_loss_diff"] < MATCH_FLOOR and results[name]["matches_reference"] is True
    for name in WRONG:
        entry = results[name]
        assert entry["verdict_kind"] == "differs" and entry["first_step_differs"] == 2, (name, entry["verdict"])
        assert entry["noise_ratio"] > 100 and entry["matches_reference"] is False
    doc = json.loads((out / "results.json").read_text())
    assert (
        doc["reference"] == "single"
        and doc["nproc"] == 2
        and "no device memory limit" in doc["batch_search"]["skipped"]
    )
    assert [results[n]["nproc"] for n in ("single", "ddp", "fsdp")] == [1, 2, 2]
    for name in ("ddp", "fsdp"):
        assert results[name]["tokens_per_s"] > 0 and results[name]["steps_done"] == 10
        assert (out / name / "log.txt").is_file() and (out / name / "summary.json").is_file()
    # FSDP shards what DDP replicates: about half the parameter bytes per rank on 2 ranks.
    assert results["fsdp"]["mem_params_bytes"] < 0.6 * results["ddp"]["mem_params_bytes"]
    run_options = {
        n: json.loads((out / n / "summary.json").read_text())["config"]["strategy_options"]
        for n in ("single", "ddp", "fsdp")
    }
    assert run_options == {"single": {}, "ddp": {}, "fsdp": {"prefetch_blocks": 1}}
    assert (
        results["single"]["final_loss"]
        < json.loads((out / "single" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    )
    report = (out / "report.md").read_text()
    assert "Avoid `lr-off` until its loss is explained: it differs from the reference" in report
    assert "`single` ran again 1 time with every gradient nudged by up to one rounding step of fp32" in report
    assert (out / "report.html").is_file() and len(list((out / "figures").glob("*.png"))) == 5


@pytest.mark.slow
@pytest.mark.extended  # the fp32 compare above judges on every change; this one, the bf16 bound
def test_built_ins_agree_and_a_wrong_learning_rate_differs_in_bf16(tmp_path):
    built_in = ["single", "fsdp", "zero2"]
    results = compare(tmp_path / "bf16", built_in + ["lr-off"], ["precision=bf16"], plugin_env(tmp_path))
    for name in built_in[1:]:
        assert results[name]["verdict_kind"] in ("matches", "within noise"), (name, results[name]["verdict"])
    # The dtype each backend handed the loss back in is recorded (a bf16 one would widen its bound).
    assert {results[name]["loss_dtype"] for name in built_in} == {"fp32"}
    assert results["lr-off"]["verdict_kind"] == "differs", results["lr-off"]["verdict"]


def test_the_report_says_when_the_references_start_is_unstable(tmp_path):
    from harness.report.report_cli import _unstable_start

    spike = curve([10.9, 10.95, 11.7, 10.8, 10.5])
    (warning,) = _unstable_start(spike, {"config": {"lr": 0.003, "warmup_steps": 3}})
    assert "rose from 10.9000 at step 1 to 11.7000 at step 3" in warning.text and "lr=0.003" in warning.text
    assert _unstable_start(curve([10.9, 10.92, 10.8, 10.5]), {"config": {}}) == []
