"""Stragglers: a synchronous step computes as long as the slowest of its GPUs, each a normal draw of
SPREAD about the median card's (Sinha et al.'s 8% over four interquartile ranges), so the step grows with the expected
maximum of N draws; a pipeline's step waits on every stage's GPUs, a fixed MFU on none."""

from __future__ import annotations

import math

import pytest

from harness.plan.parallel.backends import backend_for
from harness.plan.plan_cli import PlanConfig, basis_lines, question
from harness.plan.predict import plan_backend, plan_strategy
from harness.plan.speed.stragglers import SPREAD, expected_max_of_normals, straggler_share

SMALL_LLAMA = dict(layers=8, width=1024, heads=16, kv_heads=4, ffn=2816, vocab=32000, arch="llama", seq_len=2048)


@pytest.mark.parametrize(("n", "expected"), [(1, 0.0), (2, 1 / math.sqrt(math.pi)), (8, 1.4236), (1000, 3.2414)])
def test_the_expected_maximum_of_n_standard_normals(n: int, expected: float) -> None:
    # published values: 1/sqrt(pi) for two; Tippett's table for 8 and 1,000
    assert expected_max_of_normals(n) == pytest.approx(expected, abs=2e-3)


def test_the_spread_is_sinha_et_als_variation_over_four_interquartile_ranges_of_a_normal() -> None:
    assert SPREAD == pytest.approx(0.08 / 5.396, rel=1e-3)
    assert straggler_share(1) == 0.0
    assert straggler_share(1024) == pytest.approx(1 / (1 - SPREAD * 3.247) - 1, rel=2e-3)
    assert straggler_share(8) < straggler_share(64) < straggler_share(1024) < straggler_share(16384) < 0.07


def test_a_step_waits_for_the_slowest_of_its_gpus() -> None:
    one = plan_strategy("ddp", question(PlanConfig(**SMALL_LLAMA, gpus=1, micro_batch=2))).time
    many = plan_strategy("ddp", question(PlanConfig(**SMALL_LLAMA, gpus=1024, micro_batch=2))).time
    assert one.straggler_s == 0.0
    assert many.compute_s == pytest.approx(one.compute_s)  # the same work on each GPU
    assert many.straggler_s == pytest.approx(many.compute_s * straggler_share(1024))
    without = many.step_s - many.straggler_s
    assert many.tokens_per_s == pytest.approx(1024 * 2 * 2048 / (without + many.straggler_s))


def test_a_pipelines_step_waits_on_every_stages_gpus() -> None:
    q = question(PlanConfig(**SMALL_LLAMA, gpus=16, gpus_per_node=4, micro_batch=8))
    sizes = {"tp_size": 2, "pp_size": 4, "schedule": "1f1b", "microbatches": 8}
    t = plan_backend(backend_for("fsdp-tp", q.shape, "bf16", q.gpus, sizes), q).time
    assert t.straggle == pytest.approx(straggler_share(16))  # not the stage's 4
    assert t.tokens_per_s * t.step_s == pytest.approx(2 * 8 * 2048)  # the batch of each of 2 data-parallel ranks


def test_a_fixed_mfu_stands_for_every_gpu_and_the_header_names_the_wait() -> None:
    fixed = plan_strategy("ddp", question(PlanConfig(**SMALL_LLAMA, gpus=64, micro_batch=2, mfu=0.4))).time
    assert fixed.straggler_s == 0.0
    line = basis_lines(question(PlanConfig(**SMALL_LLAMA, gpus=64, micro_batch=2)))[0]
    assert f"the slowest of 64 GPUs +{straggler_share(64):.1%}" in line
