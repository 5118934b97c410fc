"""fsdp-cp on 2 GPUs (skipped with fewer): torch's ring attention, which does not run on the CPU,
and the all-to-all under NCCL, each over the 2 ranks of one context-parallel group, for gpt-nano and
the Hugging Face Llama of test_equivalence_cp.py (4 heads, 2 key/value heads: the ring's function
repeats them to the 4), in fp32 against `single` on the same GPU.

fp32 on CUDA: SDPA takes the memory-efficient kernel, which torch's ring dispatches too (flash
needs 16-bit). The ring merges each pass's output by its log-sum-exp, in another order than one
kernel's sums, hence a tolerance above the CPU runs' 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import NANO, env_for_tests, max_rel_diff, read_run, run_cli, succeeded
from tests.strategies.test_equivalence_cp import LLAMA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL takes one rank per GPU)"),
]

NPROC = 2
CUDA = ["device=cuda", "precision=fp32"]
RING_TOLERANCE = 1e-4
ALL_TO_ALL_TOLERANCE = 1e-5


def _train(out_dir, strategy: str, nproc: int, extra: list[str]) -> tuple[dict, list[dict]]:
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, *CUDA, *extra]
    succeeded(run_cli(args, env=env_for_tests(), timeout=300))
    return read_run(out_dir)


@pytest.fixture(scope="module")
def singles(tmp_path_factory):
    """model -> single's (summary, rows) on one GPU."""
    return {
        "gpt": _train(tmp_path_factory.mktemp("gpt-single"), "single", 1, []),
        "llama": _train(tmp_path_factory.mktemp("llama-single"), "single", 1, LLAMA),
    }


@pytest.mark.parametrize("attention, tolerance", [("ring", RING_TOLERANCE), ("all-to-all", ALL_TO_ALL_TOLERANCE)])
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_loss_matches_single_on_gpus(singles, tmp_path, model, attention, tolerance, record_property):
    options = ["strategy_options.cp_size=2", f"strategy_options.cp_attention={attention}"]
    summary, rows = _train(tmp_path, "fsdp-cp", NPROC, [*options, *(LLAMA if model == "llama" else [])])
    deviation = max_rel_diff(rows, singles[model][1])
    record_property("max_rel_loss_diff", deviation)
    print(f"fsdp-cp {attention}, {model}: largest relative loss deviation from single = {deviation:.2e}")
    assert f"context parallel over 2 ({attention} attention)" in summary["blocks"]["units"]
    assert summary["mesh"]["shape"] == [1, 2] and summary["mesh"]["dims"] == ["shard", "cp"]
    assert deviation < tolerance
