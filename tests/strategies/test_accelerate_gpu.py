"""Accelerate's modes on CUDA (skipped without a GPU): bf16 through each backend, on as
many GPUs as there are (up to 2), memory measured on the device, and `accelerate launch`
choosing MULTI_GPU. The fp32 equivalence to `single` is checked on CPU (test_accelerate.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import train
from tests.strategies.test_accelerate import MODES, mode_lines, needs_backends, train_accelerate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    needs_backends,
]

NPROC = min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 1
BF16 = ["precision=bf16", "device=cuda"]
# bf16 through different backends: DeepSpeed keeps bf16 weights with an fp32 master copy,
# FSDP2 and DDP compute in bf16 from fp32 weights. Close, not equal.
BF16_TOLERANCE = 2e-2
EXPECTED_TYPE = {
    "ddp": "MULTI_GPU",
    "fsdp": "FSDP v2",
    "zero1": "DEEPSPEED",
    "zero2": "DEEPSPEED",
    "zero3": "DEEPSPEED",
}


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    out = {"single": train(tmp_path_factory.mktemp("gpu-single"), "single", extra=BF16)}
    for mode in MODES:
        out[mode] = train_accelerate(tmp_path_factory.mktemp(f"gpu-{mode}"), mode, nproc=NPROC, extra=BF16)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_bf16_on_cuda_tracks_single(gpu_runs, mode):
    summary, rows, stdout = gpu_runs[mode]
    _, reference = gpu_runs["single"]
    deviation = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(rows, reference, strict=True))
    print(f"accelerate-{mode} bf16 on {NPROC} GPU(s): largest relative loss deviation from single = {deviation:.2e}")
    assert len(rows) == len(reference) and deviation < BF16_TOLERANCE
    (line,) = mode_lines(stdout)
    assert f"{EXPECTED_TYPE[mode]}" in line and "mixed_precision bf16" in line
    held = summary["memory_by_device_rank0"]
    assert set(held["params"]) == {"cuda"} and set(held["optimizer"]) == {"cuda"}
    assert summary["peak_mem_allocated_bytes"] > 0


def test_accelerate_launch_picks_multi_gpu(tmp_path):
    summary, rows, stdout = train_accelerate(
        tmp_path, "ddp", launch_config="ddp", nproc=NPROC, extra=["precision=fp32", "device=cuda"]
    )
    (line,) = mode_lines(stdout)
    processes = f"{NPROC} process" + ("es" if NPROC != 1 else "")  # "1 process" on a one-GPU machine
    assert line.startswith(f"accelerate: mode ddp (accelerate launch config): MULTI_GPU, {processes},")
    assert summary["device_type"] == "cuda" and len(rows) == 10
