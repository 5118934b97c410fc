"""bench/plan_search.py answers a plain question in-process and stops at one that fails."""

from __future__ import annotations

import pytest

from bench.plan_search import in_process


def test_a_question_is_timed_and_a_bad_one_stops_the_benchmark():
    assert 0 < in_process("model=gpt-nano gpus=2", repeats=1) < 60
    with pytest.raises(SystemExit, match="exit status"):
        in_process("model=gpt-nano gpus=2 strategies=[ddp] batch_size=3", repeats=1)
