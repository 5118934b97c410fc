"""The matmul model on the B200 against OpenXLA's measured sm_100 table (bench/xla_sm100_check.py): at the
shapes a mixture's experts run on Blackwell, the model is not slower than the table, and its fp8 is within
a tenth of it, so the experts' matmul rate is not what plans DGX Blackwell's MoE runs fast."""

from __future__ import annotations

import statistics

from bench.xla_sm100_check import ratios


def test_the_fp8_model_is_within_a_tenth_of_sm100s_table_at_every_m():
    found = ratios()
    assert len(found) == 2 * 27
    for m in (1024, 2048, 4096):
        fp8 = [r for p, mm, _, _, r in found if p == "fp8" and mm == m]
        assert 0.95 < statistics.median(fp8) < 1.10, m
    # bf16 is modelled faster than measured, more at m = 4096 than at 1,024: no small-m penalty missing.
    bf16 = {m: statistics.median(r for p, mm, _, _, r in found if p == "bf16" and mm == m) for m in (1024, 4096)}
    assert 1.0 < bf16[1024] < bf16[4096] < 1.15
