"""A mixture-of-experts compare in the report: the Routing section from each run's summary.json, and
the verdicts of runs whose experts drop tokens over a capacity. Built from a synthetic compare folder
(no training)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.compare.results import StrategyResult, assign_verdicts, write_results
from harness.report.report_cli import build_report

LOSSES = [4.0, 3.5, 3.2, 3.0]


def _run(compare_dir: Path, name: str, router: dict | None) -> StrategyResult:
    run = compare_dir / name
    run.mkdir(parents=True)
    rows = [{"step": i + 1, "loss": loss} for i, loss in enumerate(LOSSES)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"router": router}))
    return StrategyResult(
        name=name, nproc=4, run_dir=name, steps_done=4, final_loss=LOSSES[-1], tokens_per_s=1000.0, mem_params_bytes=1
    )


def _router(capacity: float | None, a2a: float | None) -> dict:
    return {
        "router_tokens_per_expert": [[30, 10, 20, 20], [20, 20, 20, 20]],
        "router_imbalance": [1.5, 1.0],
        "router_max_imbalance": 1.5,
        "router_dropped_fraction": 0.0 if capacity is None else 0.025,
        "capacity_factor": capacity,
        "all_to_all_ms_per_step": a2a,
    }


def _report(compare_dir: Path, capacities: dict[str, float | None]) -> tuple[list[StrategyResult], str]:
    results = [
        _run(compare_dir, name, _router(cap, None if name == "single" else 2.5)) for name, cap in capacities.items()
    ]
    reference = assign_verdicts(results, compare_dir, precision="fp32", tolerance=1e-4, band=None)
    facts = {"config": {}, "precision": "fp32", "reference": reference, "device_type": "cpu", "nproc": 4}
    write_results(compare_dir, facts, results)
    md_path, _ = build_report(compare_dir)
    return results, md_path.read_text()


def test_the_routing_section_gives_each_runs_router_figures(tmp_path):
    _, report = _report(tmp_path, {"single": None, "ddp-ep": None})
    section = report.split("## Routing", 1)[1].split("\n## ", 1)[0]
    assert "| `ddp-ep` |" in section and "| 2 x 4 | 1.50 / 1.00 | 0.0% | none | 2.5 |" in section
    single = next(line for line in section.splitlines() if line.startswith("| `single` |"))
    assert single.endswith("| none | n/a |")


def test_no_routing_section_without_experts(tmp_path):
    _, report = _report(tmp_path, {})
    assert "## Routing" not in report


def test_a_capacity_run_is_judged_at_the_references_capacity_or_not_at_all(tmp_path):
    results, _ = _report(tmp_path / "same", {"single": 1.25, "ddp-ep": 1.25})
    assert results[1].verdict == "matches (max rel. diff 0.0e+00), at the reference's capacity factor 1.25"
    results, _ = _report(tmp_path / "other", {"single": None, "ddp-ep": 1.25})
    assert results[1].verdict_kind == "not comparable"
    assert results[1].verdict == "not comparable: capacity factor 1.25, the reference's none (dropless)"
