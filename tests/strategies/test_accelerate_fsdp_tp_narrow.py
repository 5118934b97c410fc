"""accelerate-fsdp-tp on 2 processes: its tensor parallel would leave Accelerate's FSDP2 no rank to shard
over, so it runs at tp 1 (strategies/accelerate/fsdp_tp_mode.py), and at tp 1 Accelerate's mesh has no
"tp" dimension for the model's plan: the run is FSDP2 alone, and matches single, the GPT's fused q;k;v
included (split by nothing before FSDP2's own split)."""

from __future__ import annotations

import pytest

from strategies.registry import default_registry
from tests.helpers import max_rel_diff, train

pytestmark = pytest.mark.skipif(
    bool(default_registry().get("accelerate-fsdp-tp").unavailable_reason), reason="accelerate-fsdp-tp unavailable"
)
STEPS = ["steps=2", "log_every=1"]


def test_two_processes_run_it_at_tp_1_and_match_single(tmp_path):
    summary, rows = train(tmp_path / "narrow", "accelerate-fsdp-tp", nproc=2, extra=STEPS)
    _, reference = train(tmp_path / "single", "single", extra=STEPS)
    assert summary["mesh"]["shape"] == [2, 1]
    assert max_rel_diff(rows, reference) < 1e-5
