"""bench/host_pace.py plans published runs at each host pace the planner's sources measured."""

from __future__ import annotations

import pytest

from bench.host_pace import PACES, pace_table
from bench.plan_vs_published import DATA, plan_rows, read_rows


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    every = read_rows(DATA / "small_model_tp.csv")
    small = [r for r in every if r["d_model"] == "1024" and "tp=8 " in r["sharding"] and r["micro_batch"] == "1"]
    large = [r for r in read_rows(DATA / "torchtitan_llama_fsdp.csv") if r["gpu"].startswith("H100")]
    return small[:3] + large[:3]


def test_a_slower_host_slows_only_the_host_bound_runs(rows):
    """vTrain's width-1,024 runs at TP 8 and micro-batch 1 wait on the host: at 45 us a kernel they plan
    slower in proportion; torchtitan's FSDP runs of 8B and more do not wait on it and barely move."""
    fast, slow = plan_rows(rows, host_us_per_kernel=24.0), plan_rows(rows, host_us_per_kernel=45.0)
    for default, slower in zip(fast[:3], slow[:3], strict=True):
        assert slower.predicted < 0.7 * default.predicted
    for default, slower in zip(fast[3:], slow[3:], strict=True):
        assert slower.predicted == pytest.approx(default.predicted, rel=0.02)
    assert [o.predicted for o in plan_rows(rows)] == [o.predicted for o in fast]  # 24 us: the default


def test_the_table_has_a_column_a_pace_and_the_goals_rows(rows):
    by_pace = {pace: plan_rows(rows, host_us_per_kernel=pace) for pace, _ in PACES}
    table = pace_table(by_pace)
    assert table[0].count("us a kernel") == len(PACES)
    assert table[2].startswith("| every CSV |") and table[-2].startswith("| runs within 15% |")
    assert all(line.count("|") == len(PACES) + 2 for line in table)
