"""A card's sustained matmul rate: SUSTAINED (the H100's clocks settling under its power limit) times
the card's long-run matmul over the H100's on Azure's cuBLASLt benchmark, applied once to every
matmul of a step."""

from __future__ import annotations

import pytest

from harness.common.hardware import GPUS
from harness.plan.speed.gemm import SUSTAINED, gemm_seconds, gemm_tflops, sustained_share

SIZE = 16384.0


def test_the_long_run_shares_are_azures_figures_over_each_cards_mamf():
    # Azure's 16384^3 after 10,000 warm-ups over the MAMF in that precision (hardware.py's _LONG_RUN)
    assert GPUS["H100"].long_run_matmul == pytest.approx(1377.3 / (0.709 * 1979), rel=2e-3)
    assert GPUS["H200"].long_run_matmul == pytest.approx(1366.3 / (0.734 * 1979), rel=2e-3)
    assert GPUS["A100"].long_run_matmul == pytest.approx(256.5 / (0.869 * 312), rel=2e-3)
    assert GPUS["GB200"].long_run_matmul == pytest.approx(2906.9 / (0.723 * 5000), rel=2e-3)
    # hipBLASLt's fp8 at 16384^3 over its best shape in the same table (ND MI300X v5)
    assert GPUS["MI300X"].long_run_matmul == pytest.approx(1015.1 / (0.444 * 2610), rel=2e-3)


def test_the_reference_card_keeps_sustained_and_a_card_without_a_measurement_too():
    assert sustained_share(GPUS["H100"], "bf16") == pytest.approx(SUSTAINED)
    for card in ("GB300", "MI325X", "MI355X", "V100-32", "H100 PCIe"):
        assert GPUS[card].long_run_matmul is None
        assert sustained_share(GPUS[card], "bf16") == SUSTAINED


def test_a_gb200_sustains_its_long_run_share_of_the_h100s_setting_once():
    gb200 = GPUS["GB200"]
    share = sustained_share(gb200, "fp8")
    assert share == pytest.approx(SUSTAINED * 0.804 / 0.982, rel=2e-3)
    lone = gemm_tflops(SIZE, SIZE, SIZE, gb200, "fp8", sustained=1.0)
    in_a_step = gemm_tflops(SIZE, SIZE, SIZE, gb200, "fp8")
    assert in_a_step / lone == pytest.approx(share, rel=1e-3)  # once, not squared
    # the same die: the B200 carries the GB200's measurement, and so does the B300 (Blackwell Ultra's die at
    # the B200's power, not the GB300's 1400 W)
    assert sustained_share(GPUS["B200"], "bf16") == pytest.approx(share)
    assert sustained_share(GPUS["B300"], "bf16") == pytest.approx(share)


def test_fp4s_rate_was_measured_after_the_long_warm_up_so_the_share_is_not_applied_again():
    gb200 = GPUS["GB200"]
    assert sustained_share(gb200, "fp4") == SUSTAINED
    lone = gemm_seconds(SIZE, SIZE, SIZE, gb200, "fp4", sustained=1.0)
    assert gemm_seconds(SIZE, SIZE, SIZE, gb200, "fp4") == pytest.approx(lone / SUSTAINED, rel=1e-3)
