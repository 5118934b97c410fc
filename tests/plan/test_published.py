"""bench/plan_vs_published.py: the plan held against published training runs, from the CSVs in
bench/data, without torch and in seconds; a CSV it cannot read is a one-line error."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from bench import plan_vs_published as published
from tests.helpers import ROOT, env_for_tests


@pytest.fixture(scope="module")
def outcomes():
    return {path.name: published.plan_rows(published.read_rows(path)) for path in published.DEFAULT_CSVS}


def test_every_published_run_is_planned_to_fit_and_the_oom_one_not(outcomes):
    runs = [o for rows in outcomes.values() for o in rows if o.plan is not None]
    assert len(runs) > 200
    misses = [o for o in runs if not o.plan.fits]
    # torchtitan's llama2-13b without checkpointing at local batch 2 on 64 A100s sits 4% over the card
    # in the plan (activations counted as its RMSNorm, SwiGLU and SDPA save them); every other run fits.
    assert [(o.row["model"], o.row["activation_checkpointing"]) for o in misses] == [("llama2-13b", "false")]
    (oom,) = published.plan_rows(published.read_rows(published.OOM_CSV))
    assert oom.plan.fits is False  # llama2-70b, local batch 2, selective AC: out of memory as published


def test_the_published_memory_is_predicted_within_fifteen_percent(outcomes):
    memory = [o for rows in outcomes.values() for o in rows if o.memory_error is not None]
    assert len(memory) == 4 and all(abs(o.memory_error) < 0.15 for o in memory)


def test_the_report_states_the_figures_and_the_bias_by_gpu_nodes_and_sequence(tmp_path):
    out = tmp_path / "plan_vs_published.md"
    assert published.main(["--out", str(out)]) == 0
    text = out.read_text()
    for section in ("### torchtitan_llama_fsdp.csv", "### public_runs.csv", "### Published out-of-memory"):
        assert section in text
    assert text.count("median error") >= 2 and "within 15%" in text
    for title in ("| GPU |", "| nodes |", "| sequence length |"):
        assert text.count(title) >= 2
    assert "Command: `python bench/plan_vs_published.py --out" in text
    assert "planned not to fit: right" in text


def test_a_csv_missing_a_column_is_a_one_line_error(tmp_path):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        columns = [c for c in published.COLUMNS if c != "seq_len"]
        csv.writer(f).writerow(columns)
    proc = subprocess.run(
        [sys.executable, "bench/plan_vs_published.py", str(path), "--out", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env_for_tests(),
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no column seq_len" in proc.stderr and "give every column" in proc.stderr
