"""bench/overhead.py must not rot before a GPU machine runs it: its dry run (tiny model,
CPU, fp32) goes through the same code paths, and its table must come out with both
columns for each run. No speed is asserted here; the figures belong to the GPU run."""

from __future__ import annotations

import json
import re
import sys

import pytest

from bench import overhead
from bench.overhead_table import COLUMNS, GIB, Measured, Side, findings, table
from bench.runs import DEFAULT_RUNS, GROUPS, RUN_NAMES, RUNS, select
from tests.helpers import ROOT, env_for_tests, run_bounded

# On every change ddp and accelerate-ddp (one hand-written process serving both); single's and
# fsdp's dry runs under --all.
DRY_RUN_SETS = [("ddp", "accelerate-ddp"), pytest.param(("single", "fsdp"), marks=pytest.mark.extended)]


def _table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """Each run's row of a table, cell by column name."""
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in RUN_NAMES:
            rows[cells[0]] = dict(zip(COLUMNS, cells, strict=True))
    return rows


def _number(cell: str) -> float:
    assert re.fullmatch(r"[\d,]+(\.\d+)?", cell), f"not a figure: {cell!r}"
    return float(cell.replace(",", ""))


@pytest.mark.slow
@pytest.mark.parametrize("dry_runs", DRY_RUN_SETS, ids=",".join)
def test_dry_run_prints_both_columns_for_each_strategy(tmp_path, dry_runs):
    out, raw, work = tmp_path / "benchmarks.md", tmp_path / "results.json", tmp_path / "work"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "overhead.py"),
        "--dry-run",
        "--only",
        ",".join(dry_runs),
        "--jobs",
        "2",
        "--out",
        str(out),
        "--json",
        str(raw),
        "--work-dir",
        str(work),
    ]
    proc = run_bounded(cmd, timeout=240, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    rows = _table_rows(proc.stdout)
    assert set(rows) == set(dry_runs), proc.stdout
    for row in rows.values():
        for column in ("tok/s parabench", "tok/s hand-written", "speed ratio (goal >= 0.97)"):
            assert _number(row[column]) > 0, row
        runner_loss, hand_loss = (float(x) for x in row["final loss parabench / hand-written"].split(" / "))
        assert runner_loss > 0 and hand_loss > 0, row
        assert row["verdict"] == "dry run: not judged", row
    if "accelerate-ddp" in dry_runs:
        # accelerate-ddp is held to ddp's parabench figure as well.
        assert _number(rows["accelerate-ddp"]["tok/s vs native, parabench (goal >= 0.97)"].split()[0]) > 0
        assert rows["ddp"]["tok/s vs native, parabench (goal >= 0.97)"] == ""

    # The section that goes into docs/benchmarks.md: dated, with the command and the device.
    written = out.read_text()
    assert written.startswith("# Benchmarks")
    assert "framework overhead on cpu (dry run" in written and "Command: `python bench/overhead.py --dry-run" in written
    assert set(_table_rows(written)) == set(dry_runs)

    # Both sides trained the same model on the same data from the same weights: in fp32
    # on the CPU the final losses agree (a check that the comparison is like for like).
    results = json.loads(raw.read_text())["runs"]
    for name in dry_runs:
        (runner,), (hand,) = results[name]["runner"], results[name]["hand"]
        assert runner["status"] == hand["status"] == "ok"
        assert hand["figures"]["backend"] in ("plain", "ddp", "fsdp")
        assert runner["figures"]["final_loss"] == pytest.approx(hand["figures"]["final_loss"], rel=1e-4)
    if "accelerate-ddp" in dry_runs:
        # One hand-written ddp process served both ddp and accelerate-ddp.
        assert results["accelerate-ddp"]["hand"] == results["ddp"]["hand"]
        assert not list(work.glob("accelerate-ddp/handwritten*")) and len(list(work.glob("ddp/handwritten*"))) == 1


def test_plan_shares_hand_written_processes_and_interleaves_repeats():
    runs = select("zero2,accelerate-zero2,zero3")
    order = [(which, run.name, r) for which, run, r in overhead.plan(runs, repeat=2)]
    once = [
        ("hand", "zero2"),
        ("runner", "zero2"),
        ("runner", "accelerate-zero2"),
        ("hand", "zero3"),
        ("runner", "zero3"),
    ]
    assert order == [(w, n, 1) for w, n in once] + [(w, n, 2) for w, n in once]


def test_shared_hand_written_outcomes_are_one_list(monkeypatch, tmp_path):
    """execute() gives accelerate-X the very outcomes of X's hand-written processes."""
    calls = []

    def fake(which):
        def run(run, s, log, clock, timeout, env):
            calls.append((which, run.name))
            return Side(status="ok", figures={"tokens_per_s": 100.0 + len(calls)})

        return run

    monkeypatch.setattr(overhead, "run_hand", fake("hand"))
    monkeypatch.setattr(overhead, "run_runner", fake("runner"))
    s = overhead.settings_from(overhead.parse_args(["--dry-run"]))
    results = overhead.execute(
        select("fsdp,accelerate-fsdp"), s, tmp_path, overhead.Clock(None), 10, 1, 3, True, lambda *a: None
    )
    assert calls.count(("hand", "fsdp")) == 3 and ("hand", "accelerate-fsdp") not in calls
    assert results["accelerate-fsdp"]["hand"] is results["fsdp"]["hand"] and len(results["fsdp"]["hand"]) == 3
    assert len(results["accelerate-fsdp"]["runner"]) == 3


def _side(tok: float, mem: float | None = None, mfu: float | None = None) -> Side:
    return Side(
        status="ok", figures={"tokens_per_s": tok, "peak_mem_allocated_bytes": mem, "mfu": mfu, "final_loss": 3.0}
    )


def test_verdicts_and_findings_follow_the_goals():
    runs = [RUN_NAMES[n] for n in ("single", "zero2", "zero3", "zero3-tuned", "single+compile", "accelerate-zero2")]
    results = {
        "single": {"hand": [_side(100.0, 16 * GIB)], "runner": [_side(99.0, 16.1 * GIB)]},
        "zero2": {"hand": [_side(100.0, 16 * GIB)], "runner": [_side(90.0, 17 * GIB)]},
        "zero3": {"hand": [_side(60.0, 16 * GIB)], "runner": [_side(60.0, 16 * GIB)]},
        "zero3-tuned": {"hand": [_side(80.0, 16 * GIB)], "runner": [_side(75.0, 16 * GIB)]},
        "single+compile": {
            "hand": [_side(150.0, 8 * GIB, 0.41)],
            "runner": [Side(status="failed", reason="exit 1: boom")],
        },
    }
    # accelerate-zero2 shares zero2's hand-written processes.
    results["accelerate-zero2"] = {"hand": results["zero2"]["hand"], "runner": [_side(98.0, 16 * GIB)]}
    rows = _table_rows(table(runs, results, judged=True))
    assert rows["single"]["verdict"] == "meets the goals"
    assert "slower (0.900 < 0.97)" in rows["zero2"]["verdict"]
    assert "more memory (1.062 > 1.03)" in rows["zero2"]["verdict"]
    assert rows["single+compile"]["tok/s parabench"] == "n/a"
    assert rows["single+compile"]["verdict"] == "parabench failed: exit 1: boom"
    # accelerate-X against native X's parabench run: 98 / 90.
    assert rows["accelerate-zero2"]["tok/s vs native, parabench (goal >= 0.97)"] == "1.089 (zero2)"
    assert rows["accelerate-zero2"]["verdict"] == "meets the goals"
    results["accelerate-zero2"]["runner"] = [_side(80.0, 16 * GIB)]
    verdict = _table_rows(table(runs, results, judged=True))["accelerate-zero2"]["verdict"]
    assert "slower (0.800 < 0.97)" in verdict and "slower than zero2 (0.889 < 0.97)" in verdict
    lines = findings(runs, results)
    assert any("ZeRO-3 tuned vs untuned (parabench)" in line and "tuning closes 50%" in line for line in lines)
    # An MFU goal is judged on the parabench side.
    results["single+compile"]["runner"] = [_side(150.0, 8 * GIB, 0.30)]
    assert "MFU 30.0% < 40%" in _table_rows(table(runs, results, judged=True))["single+compile"]["verdict"]


def test_repeats_give_medians_spread_and_failures():
    sides = [_side(100.0, 4 * GIB), _side(110.0, 4 * GIB), _side(90.0, 4 * GIB), Side(status="failed", reason="boom")]
    m = Measured(sides)
    assert m.status == "ok" and m.get("tokens_per_s") == 100.0 and m.spread() == pytest.approx(0.2)
    assert Measured([_side(100.0)]).spread() is None
    assert Measured([Side(status="skipped", reason="time budget spent (520 s)")]).reason.startswith("time budget")
    results = {"ddp": {"hand": [_side(100.0), _side(102.0)], "runner": sides}}
    row = _table_rows(table([RUN_NAMES["ddp"]], results, judged=True))["ddp"]
    assert row["tok/s spread parabench / hand-written"] == "20.0% / 2.0% (n=3/2)"
    assert "1 of 4 parabench processes failed" in row["verdict"]


def test_groups_cover_the_default_set_and_hold_each_accelerate_run_with_its_native_run():
    assert sorted(DEFAULT_RUNS) == sorted(set(DEFAULT_RUNS)), "a run in two groups"
    assert {r.name for r in RUNS if r.name.startswith("accelerate-")} <= set(DEFAULT_RUNS)
    for group, names in GROUPS.items():
        for name in names:
            native = RUN_NAMES[name].native
            assert native is None or native in names, f"{name} is judged against {native}: put both in {group}"
    assert [r.name for r in select(group="zero3")] == list(GROUPS["zero3"])


def test_unknown_run_or_group_lists_what_there_is():
    with pytest.raises(SystemExit, match="unknown run nope: the runs are single, ddp"):
        select("nope")
    with pytest.raises(SystemExit, match="unknown group nope: the groups are torch, "):
        select(group="nope")
    assert [r.name for r in select(None)][:6] == ["single", "ddp", "fsdp", "zero1", "zero2", "zero3"]
    assert select("all") == RUNS
