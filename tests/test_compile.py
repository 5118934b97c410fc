"""compile=true: each backend compiles what it can take (the whole model, loss included,
where nothing hooks the blocks; per block under FSDP and ZeRO-3), says so in its summary,
and trains the same curve as eager `single`."""
from __future__ import annotations

import pytest

from tests.helpers import max_rel_diff, train

# Inductor on the CPU fuses and reorders fp32 arithmetic: close to eager, not bit-equal.
TOLERANCE = 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("strategy, nproc, compiled", [
    ("single", 1, "whole model"),
    ("ddp", 2, "whole model"),
    ("accelerate-zero2", 2, "whole model"),
    ("fsdp", 2, "per block (2 Block)"),
    ("zero3", 2, "per block (2 Block)"),
])
def test_compiled_run_matches_eager_single(tmp_path, strategy, nproc, compiled, reference_run):
    summary, rows = train(tmp_path, strategy, nproc, extra=["compile=true"])
    assert summary["compiled"] == compiled
    deviation = max_rel_diff(rows, reference_run[1])
    print(f"{strategy} compiled ({compiled}): largest relative loss deviation from eager single = {deviation:.2e}")
    assert deviation < TOLERANCE


def test_eager_run_says_it_was_not_compiled(reference_run):
    assert reference_run[0]["compiled"] is None
