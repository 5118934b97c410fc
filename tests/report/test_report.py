"""The compare report: figures rendered, Markdown and self-contained HTML written,
rebuilt by `runner.py report <dir>`, and a recommendation drawn from the numbers.

Built from a synthetic compare folder (no training): a GPU-shaped sweep with a
reference, its noise run, a faster strategy whose loss differs, a sharded one, a failure
and a skip.
"""

from __future__ import annotations

import base64
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest

import runner
from harness.common.colours import strategy_colours
from harness.common.units import GIB
from harness.compare.batch_search import FITS, OOM, Probe, Search
from harness.compare.results import StrategyResult, assign_verdicts, load_metrics, read_results, write_results
from harness.compare.sweep_plan import PlannedStrategy, SweepPlan
from harness.compare.verdict import measure_noise
from harness.report import figures
from harness.report.advice import advice_from_results
from harness.report.document import FIGURE_WIDTH_PX
from harness.report.report_cli import build_report
from strategies.registry import default_registry
from tests.helpers import run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(compare_dir: Path, name: str, losses: list[float]) -> None:
    run = compare_dir / name
    run.mkdir(parents=True)
    rows = [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_compare_dir(compare_dir: Path, device_type: str) -> list[StrategyResult]:
    base = [4.0 * math.exp(-0.1 * step) + 1.0 for step in range(20)]
    write_run(compare_dir, "single", base)
    write_run(compare_dir, "ddp", [v * (1 + 3e-7) for v in base])
    write_run(compare_dir, "zero3", [v * (1 + 1e-7) for v in base])
    write_run(compare_dir, "fast-but-wrong", [v * (1 + 0.02 * (i >= 12)) for i, v in enumerate(base)])
    write_run(compare_dir, "noise/1", [v * (1 + 2e-7 * (-1) ** i) for i, v in enumerate(base)])
    on_gpu = device_type == "cuda"

    def ran(name, nproc, tokens, params, grads, optim, peak, prediction=None):
        return StrategyResult(
            name=name,
            nproc=nproc,
            run_dir=name,
            steps_done=20,
            final_loss=1.5,
            tokens_per_s=tokens,
            step_time_s=4096 / tokens,
            mfu=0.3 if on_gpu else None,
            mem_params_bytes=params,
            mem_grads_bytes=grads,
            mem_optimizer_bytes=optim,
            peak_mem_allocated_bytes=peak if on_gpu else None,
            peak_mem_reserved_bytes=int(peak * 1.1) if on_gpu else None,
            prediction=prediction,
        )

    results = [
        ran("single", 1, 40_000, 1 * GIB, 1 * GIB, 2 * GIB, 6 * GIB),
        ran(
            "ddp",
            2,
            70_000,
            1 * GIB,
            1 * GIB,
            2 * GIB,
            6 * GIB,
            prediction={"mem_params_bytes": 1.1 * GIB, "tokens_per_s": 63_000},
        ),
        ran("zero3", 2, 50_000, GIB // 2, GIB // 2, 1 * GIB, 3 * GIB),
        ran("fast-but-wrong", 2, 90_000, 1 * GIB, 1 * GIB, 2 * GIB, 6 * GIB),
        StrategyResult(
            name="broken",
            nproc=2,
            run_dir="broken",
            status="failed",
            error_kind="oom",
            error="torch.OutOfMemoryError: CUDA out of memory",
            log_tail=["Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory"],
        ),
        StrategyResult(name="needs-gpu", status="skipped", error="unsupported on cpu: needs CUDA"),
    ]
    # ddp at 2 ranks: a process per probe; the prediction one too high.
    searched = Search(
        "ddp",
        2,
        8,
        120.0,
        in_process=False,
        note="2 ranks: each probe is a job of its own",
        predicted=49,
        start=49,
        jobs=2,
        wall_time_s=41.0,
        probes=[Probe(49, OOM, True, 20.0), Probe(48, FITS, True, 21.0, 81_000, 70 * GIB)],
    )
    band = measure_noise(load_metrics(compare_dir / "single"), [load_metrics(compare_dir / "noise" / "1")])
    reference = assign_verdicts(results, compare_dir, precision="fp32", tolerance=1e-4, band=band)
    env = {
        "device": "NVIDIA H100 80GB HBM3" if on_gpu else "cpu",
        "devices": 2,
        "world_size": 2,
        "host": "test",
        "versions": {"torch": "2.13.0", "deepspeed": "0.19.8", "accelerate": None, "python": "3.11"},
    }
    facts = {
        "command": "python runner.py compare",
        "config": {"batch_size": 16, "seq_len": 64, "steps": 20},
        "precision": "fp32",
        "tolerance": 1e-4,
        "reference": reference,
        "device_type": device_type,
        "nproc": 2,
        "loss_floor": 1.0,
        "model": {"name": "gpt-nano", "num_params": 110_000},
        "environment": env,
        "wall_time_s": 12.0,
        "started_at": "2026-01-01T00:00:00+00:00",
        "interrupted": False,
        "noise": {
            "reference": "single",
            "skipped": None,
            "band": band.as_dict(),
            "runs": [{"seed": 1, "run_dir": "noise/1", "status": "ok", "wall_time_s": 3.0}],
        },
        "batch_search": {
            "results": [searched.as_result()],
            "wall_time_s": 95.0,
            "predicted_within": 0.95,
            "interrupted": None,
        },
    }
    write_results(compare_dir, facts, results)
    return results


class ImageCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.headings: list[str] = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        self._in_heading = tag in ("h1", "h2")

    def handle_data(self, data):
        if self._in_heading:
            self.headings.append(data)

    def handle_endtag(self, tag):
        self._in_heading = False


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory):
    compare_dir = tmp_path_factory.mktemp("gpu_compare")
    make_compare_dir(compare_dir, "cuda")
    md_path, html_path = build_report(compare_dir)
    return compare_dir, md_path.read_text(), html_path.read_text()


def test_figures_are_rendered_and_embedded(gpu_report):
    compare_dir, markdown, page = gpu_report
    pngs = sorted((compare_dir / "figures").glob("*.png"))
    assert {p.stem for p in pngs} == {"loss", "loss_vs_reference", "memory", "throughput", "memory_vs_throughput"}
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000, png
        assert int.from_bytes(data[16:20], "big") == FIGURE_WIDTH_PX, png  # shown at its own size
        assert f"(figures/{png.name})" in markdown
    parser = ImageCollector()
    parser.feed(page)
    parser.close()
    assert len(parser.images) == len(pngs)
    embedded = sorted(base64.b64decode(src.split(",", 1)[1]) for src in parser.images)
    assert all(src.startswith("data:image/png;base64,") for src in parser.images)
    assert embedded == sorted(p.read_bytes() for p in pngs)  # every figure, inline, byte for byte
    assert "Recommendation" in parser.headings[-1] and "Environment" in parser.headings


def test_summary_table_verdicts_and_failures(gpu_report):
    _, markdown, _ = gpu_report
    summary = markdown.split("## Summary")[1].split("##")[0]
    # Fastest first.
    assert (
        summary.index("`fast-but-wrong`")
        < summary.index("`ddp`")
        < summary.index("`zero3`")
        < summary.index("`single`")
    )
    assert "differs from step 13: up to 2.0e-02 relative" in summary and "set by the fp32 floor" in summary
    assert summary.count("matches (max rel. diff") == 2
    # How the verdicts were judged, with the noise the compare measured.
    assert "`single` ran again 1 time with every gradient nudged by up to one rounding step of fp32" in summary
    assert "strayed from itself by up to 2.0e-07" in summary
    problems = markdown.split("## Failed and skipped strategies")[1].split("## ")[0]
    assert "`broken`" in problems and "oom" in problems and "needs CUDA" in problems
    assert "torch.OutOfMemoryError" in problems  # its log tail
    predicted = markdown.split("## Predicted against measured")[1].split("## ")[0]
    assert "| `ddp` | 1.1 GiB / 1 GiB (+10.0%) | 63,000 / 70,000 (-10.0%) |" in predicted
    assert "`zero3`" not in predicted  # no prediction: no row
    searched = markdown.split("## Largest micro-batch per strategy")[1].split("## ")[0]
    assert "| `ddp` | 49 | 48 | 49 ✗ | [49 ✗] [48 ✓] | 81,000 | 70 GiB | 41 s | 2 ranks" in searched
    assert "The whole search took 95 s." in searched
    for version in ("2.13.0", "0.19.8", "not installed"):
        assert version in markdown.split("## Environment")[1]


def test_recommendation_is_drawn_from_the_measurements(tmp_path):
    results = make_compare_dir(tmp_path, "cuda")
    advice = " ".join(advice_from_results(results, "cuda"))
    # The fastest overall differs: the advice names the fastest that matches instead.
    assert "Fastest that matches the reference: `ddp`" in advice
    assert f"{70_000 / 50_000:.2f}x the next, `zero3`" in advice
    assert "Least memory per rank: `zero3`" in advice and "3 GiB" in advice
    assert "Avoid `fast-but-wrong`" in advice and "Avoid `broken`" in advice and "out of memory" in advice
    assert "`needs-gpu`" in advice
    assert f"`single` (by `ddp`, {70_000 / 40_000:.1f}x faster)" in advice  # beaten on speed, no less memory
    cpu_advice = advice_from_results(results, "cpu")
    assert any("CPU processes" in line for line in cpu_advice)
    assert any("Least memory per rank: `zero3`" in line and "model-state" in line for line in cpu_advice)


def test_cpu_report_says_peak_memory_is_unknown(tmp_path):
    make_compare_dir(tmp_path, "cpu")
    md_path, _ = build_report(tmp_path)
    markdown = md_path.read_text()
    assert "Peak memory is not measured on CPU" in markdown and "n/a (CPU)" in markdown


@pytest.mark.parametrize(
    "checkpointing, says",
    [
        ({"activation_checkpointing": True, "selective_checkpointing": True}, "(selective: torchtitan's op-level"),
        ({}, ""),
    ],
)
def test_the_overview_says_what_activation_checkpointing_recomputed(tmp_path, checkpointing, says):
    """The report said nothing of it: a selective compare read as one without checkpointing."""
    make_compare_dir(tmp_path, "cpu")
    doc = json.loads((tmp_path / "results.json").read_text())
    doc["config"].update(checkpointing)
    (tmp_path / "results.json").write_text(json.dumps(doc))
    md_path, _ = build_report(tmp_path)
    overview = next(line for line in md_path.read_text().splitlines() if line.startswith("Every strategy trained"))
    assert f"for 20 steps{' under activation checkpointing ' + says if says else ','}" in overview


def test_report_cli_rebuilds_and_refuses_a_folder_without_results(tmp_path):
    make_compare_dir(tmp_path / "sweep", "cuda")
    proc = run_cli(["report", str(tmp_path / "sweep")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sweep" / "report.html").stat().st_size > 50_000
    doc, results = read_results(tmp_path / "sweep")
    assert doc["reference"] == "single" and len(results) == 6
    (tmp_path / "empty").mkdir()
    proc = run_cli(["report", str(tmp_path / "empty")], timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no results.json" in proc.stderr


def test_report_takes_the_results_file_for_its_folder_and_says_a_missing_folder_is_missing(tmp_path, capsys):
    make_compare_dir(tmp_path / "sweep", "cpu")
    assert runner.main(["report", str(tmp_path / "sweep" / "results.json")]) == 0
    assert (tmp_path / "sweep" / "report.md").is_file()
    capsys.readouterr()
    assert runner.main(["report", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"parabench: error: {tmp_path / 'nope'} does not exist: give the out_dir of a `runner.py compare` run"
    )


def test_a_truncated_results_file_says_how_to_make_it_again_where_the_compare_can(tmp_path, capsys):
    """With the compare's plan beside it, the way out is the report's own rebuild from the run folders,
    not `runner.py compare` again, which refuses an out_dir holding that compare's runs."""
    make_compare_dir(tmp_path, "cuda")
    results = tmp_path / "results.json"
    results.write_text(results.read_text()[:500])
    assert runner.main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.endswith("run `runner.py compare` again\n")  # no plan: nothing to rebuild from
    strategies = [PlannedStrategy(name, name) for name in ("single", "ddp")]
    plan = SweepPlan("id", "compare", "", 0.0, {}, "fp32", 1e-4, "cuda", 2, "", {}, strategies, "single", 1)
    plan.write(tmp_path)
    assert runner.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"remove it, and `runner.py report {tmp_path}` makes it again from the run folders\n"), err
    results.unlink()
    assert runner.main(["report", str(tmp_path)]) == 0
    assert read_results(tmp_path)[0]["rebuilt"]


def test_legends_stay_inside_the_picture_with_every_strategy():
    """Every strategy parabench knows, long names and all: each figure's legends and axes (titles,
    tick labels) lie inside the figure, which is as wide as the HTML shows it."""
    names = default_registry().names()
    assert len(names) >= 15
    base = [4.0 * math.exp(-0.1 * step) + 1.0 for step in range(20)]
    curves = {
        name: [{"step": i + 1, "loss": v * (1 + 1e-7 * k * (-1) ** i)} for i, v in enumerate(base)]
        for k, name in enumerate(names)
    }
    results = [
        StrategyResult(
            name=name,
            nproc=2,
            run_dir=name,
            steps_done=20,
            final_loss=1.6,
            tokens_per_s=1000.0 * (k + 1),
            step_time_s=0.1,
            mem_params_bytes=GIB * (k + 1),
            mem_grads_bytes=GIB,
            mem_optimizer_bytes=2 * GIB,
            peak_mem_allocated_bytes=20 * GIB,
            matches_reference=k % 3 != 0,
        )
        for k, name in enumerate(names)
    ]
    bound = figures.LossBound(
        steps=list(range(1, 21)),
        allowed=[1e-6] * 20,
        label="allowed: 10x the noise runs' spread, or the fp32 floor (1e-06)",
        spread=[1e-7] * 20,
        noise_curves=[curves["ddp"]],
    )
    colour = strategy_colours(names)
    drawn = {
        "loss": figures.draw_loss_curves(curves, colour, 1.0, "single"),
        "loss_vs_reference": figures.draw_loss_vs_reference(curves, colour, "single", bound),
        "memory": figures.draw_memory_per_rank(results, "cuda"),
        "throughput": figures.draw_throughput(results, colour),
        "memory_vs_throughput": figures.draw_memory_vs_throughput(results, colour, "cuda")[0],
    }
    for name, fig in drawn.items():
        assert fig.get_size_inches()[0] * figures.DPI == pytest.approx(FIGURE_WIDTH_PX), name
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        picture = fig.bbox.padded(0.5)
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert picture.contains(box.x0, box.y0) and picture.contains(box.x1, box.y1), (name, box, fig.bbox)
        if name in ("loss", "loss_vs_reference"):  # one entry per strategy, every one of them
            assert {text.get_text() for text in fig.legends[0].get_texts()} >= set(names) - {"single"}
        for ax in fig.axes:
            box = ax.get_tightbbox(renderer)
            assert picture.contains(box.x0, box.y0) and picture.contains(box.x1, box.y1), (name, box, fig.bbox)
        figures.plt.close(fig)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda doc, d: doc.__setitem__("model", "x"), "results.json is not a parabench compare's results"),
        (lambda doc, d: doc.__setitem__("environment", []), "results.json is not a parabench compare's results"),
        (lambda doc, d: (d / "report.md").mkdir(), "the report cannot be written in"),
        (lambda doc, d: (d / "figures").write_text(""), "the report cannot be written in"),
    ],
)
def test_a_hand_edited_results_file_or_a_blocked_report_is_one_line(tmp_path, capsys, edit, says):
    # Each was a traceback: AttributeError, TypeError, IsADirectoryError, FileExistsError.
    make_compare_dir(tmp_path, "cuda")
    doc = json.loads((tmp_path / "results.json").read_text())
    edit(doc, tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert runner.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
