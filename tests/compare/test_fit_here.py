"""Fitting a plan's layout to this machine (harness/compare/fit_here.py): the largest micro-batch that
divides the local batch and fits, by the planner's memory model, the global batch kept; none where
even one sequence does not fit."""

from __future__ import annotations

import pytest

from configs.schema import RunConfig
from harness.compare.compare_config import load_compare_config
from harness.compare.fit_here import PROCESS_BYTES, USABLE_SHARE, largest_fitting, needed_bytes, usable_bytes
from harness.compare.from_plan import PlannedLayout, fitted_here
from harness.plan import peak_for_run

SETTINGS = {"model": "gpt2-124m", "seq_len": 1024, "batch_size": 32, "precision": "fp32"}


def _need(micro: int, local: int, processes: int = 2) -> float:
    cfg = RunConfig(**SETTINGS, strategy="ddp")
    return needed_bytes(peak_for_run(cfg, processes, (micro, local // micro)), processes, "cpu")


def test_a_cpu_run_counts_every_process_and_its_interpreter():
    assert needed_bytes(1000, 1, "cpu") == 1000 + PROCESS_BYTES
    assert needed_bytes(1000, 2, "cpu") == 2 * (1000 + PROCESS_BYTES) + PROCESS_BYTES  # and torchrun's agent
    assert needed_bytes(1000, 2, "cuda") == 1000  # each GPU holds one process's
    assert usable_bytes("cpu", available=lambda: 10_000) == USABLE_SHARE * 10_000


def test_the_largest_micro_batch_that_fits_keeps_the_local_batch():
    settings = {**SETTINGS, "micro_batch": 16, "grad_accum": 1}
    usable = (_need(4, 16) + _need(8, 16)) / 2  # 4 fits, 8 does not
    fit = largest_fitting(settings, "ddp", 2, "cpu", usable)
    assert fit.fits and (fit.micro_batch, fit.grad_accum) == (4, 4)
    assert largest_fitting(settings, "ddp", 2, "cpu", _need(16, 16)).micro_batch == 16  # as planned
    none = largest_fitting(settings, "ddp", 2, "cpu", _need(1, 16) / 2)
    assert not none.fits and none.micro_batch == 1


def test_a_layout_and_the_reference_take_what_fits_and_say_so(tmp_path):
    cfg = load_compare_config([f"out_dir={tmp_path}", *(f"{k}={v}" for k, v in SETTINGS.items())])
    planned = {"rank": 1, "gpus": 2, "tp": 1, "data_parallel": 2, "micro_batch": 16, "grad_accum": 1}
    layout = PlannedLayout("ddp#1", "ddp", {}, 16, 1, "none", 2, planned)
    usable = (_need(4, 16) + _need(8, 16)) / 2
    cfg, (fitted,), note = fitted_here(cfg, [layout], "cpu", usable)
    assert (fitted.micro_batch, fitted.grad_accum) == (4, 4) and fitted.refused is None
    assert "micro-batch 16 does not fit this machine's memory" in str(fitted.scaled)
    assert "runs micro-batch 4 x accumulation 4" in str(fitted.scaled) and "the same global batch" in str(fitted.scaled)
    assert note and note.startswith("single: micro-batch 32 does not fit") and cfg.micro_batch < 32
    _, (too_big,), _ = fitted_here(cfg, [layout], "cpu", _need(1, 16) / 2)
    assert "does not fit here even at micro-batch 1" in str(too_big.refused)


@pytest.mark.gpu
def test_on_a_gpu_a_run_is_held_to_the_devices_memory():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert usable_bytes("cuda") == pytest.approx(USABLE_SHARE * torch.cuda.mem_get_info()[1])
