"""bench/kernel_table.py must write what the planner reads: its dry run (tiny sizes, CPU) goes
through the same code, and on a GPU its quick run writes a table the planner takes. No figure is
asserted: they belong to the card."""

from __future__ import annotations

import sys

import pytest
import torch

from harness.plan.speed.kernel_table import _read
from tests.helpers import ROOT, run_bounded


def _run(tmp_path, *args: str):
    out = tmp_path / "H100.json"
    proc = run_bounded([sys.executable, "bench/kernel_table.py", *args, "--out", str(out)], timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _read(out, "H100")


@pytest.mark.slow
def test_the_dry_run_writes_a_table_the_planner_reads(tmp_path):
    table = _run(tmp_path, "--dry-run")
    assert table.matmuls and min(table.host_s_per_kernel.values()) > 0 and 0 < table.memory_efficiency <= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_quick_run_measures_every_part_on_a_gpu(tmp_path):
    table = _run(tmp_path, "--quick")
    assert table.host_s_per_kernel["compiled"] < table.host_s_per_kernel["eager"]
    assert len(table.matmuls) > 20 and {"flash", "cudnn"} & set(table.attention)
