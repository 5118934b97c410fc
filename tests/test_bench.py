"""bench/overhead.py must not rot before a GPU session runs it: its dry run (tiny model,
CPU, fp32) goes through the same code paths, and its table must come out with both
columns for each run. No speed is asserted here; the figures belong to the GPU run."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bench import overhead
from tests.helpers import ROOT, env_for_tests

DRY_RUNS = ("single", "ddp", "fsdp")


def _table_rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in overhead.RUN_NAMES:
            rows[cells[0]] = cells
    return rows


def _number(cell: str) -> float:
    assert re.fullmatch(r"[\d,]+(\.\d+)?", cell), f"not a figure: {cell!r}"
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_dry_run_prints_both_columns_for_each_strategy(tmp_path):
    out, raw = tmp_path / "benchmarks.md", tmp_path / "results.json"
    cmd = [sys.executable, str(ROOT / "bench" / "overhead.py"), "--dry-run", "--only", ",".join(DRY_RUNS),
           "--jobs", "2", "--out", str(out), "--json", str(raw), "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    rows = _table_rows(proc.stdout)
    assert set(rows) == set(DRY_RUNS), proc.stdout
    for name, cells in rows.items():
        runner_tok, hand_tok, ratio = (_number(c) for c in cells[1:4])
        assert runner_tok > 0 and hand_tok > 0 and ratio > 0, cells
        runner_loss, hand_loss = (float(x) for x in cells[9].split(" / "))
        assert runner_loss > 0 and hand_loss > 0, cells
        assert cells[10] == "dry run: not judged", cells

    # The section that goes into docs/benchmarks.md: dated, with the command and the device.
    written = out.read_text()
    assert written.startswith("# Benchmarks")
    assert "framework overhead on cpu (dry run" in written and "Command: `python bench/overhead.py --dry-run" in written
    assert set(_table_rows(written)) == set(DRY_RUNS)

    # Both sides trained the same model on the same data from the same weights: in fp32
    # on the CPU the final losses agree (a check that the comparison is like for like).
    results = json.loads(raw.read_text())["runs"]
    for name in DRY_RUNS:
        runner, hand = results[name]["runner"], results[name]["hand"]
        assert runner["status"] == hand["status"] == "ok"
        assert hand["figures"]["backend"] in ("plain", "ddp", "fsdp")
        assert runner["figures"]["final_loss"] == pytest.approx(hand["figures"]["final_loss"], rel=1e-4)


def _side(tok: float, mem: float | None = None, mfu: float | None = None) -> overhead.Side:
    return overhead.Side(status="ok", figures={"tokens_per_s": tok, "peak_mem_allocated_bytes": mem, "mfu": mfu,
                                               "final_loss": 3.0})


def test_verdicts_and_findings_follow_the_goals():
    gib = overhead.GIB
    runs = [overhead.RUN_NAMES[n] for n in ("single", "zero2", "zero3", "zero3-tuned", "single+compile")]
    results = {
        "single": {"hand": _side(100.0, 16 * gib), "runner": _side(99.0, 16.1 * gib)},
        "zero2": {"hand": _side(100.0, 16 * gib), "runner": _side(90.0, 17 * gib)},
        "zero3": {"hand": _side(60.0, 16 * gib), "runner": _side(60.0, 16 * gib)},
        "zero3-tuned": {"hand": _side(80.0, 16 * gib), "runner": _side(75.0, 16 * gib)},
        "single+compile": {"hand": _side(150.0, 8 * gib, 0.41), "runner": overhead.Side(status="failed",
                                                                                       reason="exit 1: boom")},
    }
    rows = _table_rows(overhead.table(runs, results, judged=True))
    assert rows["single"][10] == "meets the goals"
    assert "slower (0.900 < 0.97)" in rows["zero2"][10] and "more memory (1.062 > 1.03)" in rows["zero2"][10]
    assert rows["single+compile"][1] == "n/a" and rows["single+compile"][10] == "parabench failed: exit 1: boom"
    lines = overhead.findings(runs, results)
    assert any("ZeRO-3 tuned vs untuned (parabench)" in line and "tuning closes 50%" in line for line in lines)
    # An MFU goal is judged on the parabench side.
    results["single+compile"]["runner"] = _side(150.0, 8 * gib, 0.30)
    assert "MFU 30.0% < 40%" in _table_rows(overhead.table(runs, results, judged=True))["single+compile"][10]


def test_unknown_run_lists_the_runs():
    with pytest.raises(SystemExit, match="unknown run nope: the runs are single, ddp"):
        overhead.select("nope")
    assert [r.name for r in overhead.select(None)][:6] == ["single", "ddp", "fsdp", "zero1", "zero2", "zero3"]
    assert overhead.select("all") == overhead.RUNS
