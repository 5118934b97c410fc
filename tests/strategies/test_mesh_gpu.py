"""Layouts of the torch mesh on 4 GPUs (skipped with fewer) under NCCL, in fp32 against `single` on
the same GPU: tensor parallel beside torch's ring attention (`fsdp-tp` + cp_size, cp_attention=ring:
the ring runs on GPUs only) on gpt-nano and the Hugging Face Llama of test_equivalence_cp.py, and
Megatron-LM's DDP x TP x PP (`ddp-tp` + pp_size) on a four-block GPT. The CPU's gloo runs every other
combination (test_equivalence_3d.py); these are what only NCCL and CUDA's SDPA kernels show.

The ring merges each pass's output by its log-sum-exp, in another order than one kernel's sums:
its tolerance is test_context_parallel_gpu.py's.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import NANO, env_for_tests, max_rel_diff, read_run, run_cli, succeeded
from tests.strategies.test_context_parallel_gpu import ALL_TO_ALL_TOLERANCE, RING_TOLERANCE
from tests.strategies.test_equivalence_cp import LLAMA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA devices (NCCL takes one rank per GPU)"),
]

NPROC = 4
CUDA = ["device=cuda", "precision=fp32"]
DEEP = ["model_kwargs.n_layer=4", "model_kwargs.n_head=4"]
TP = "strategy_options.tp_size=2"
# name -> (model settings, strategy, options, tolerance)
RUNS = {
    "gpt-tp-ring": (DEEP, "fsdp-tp", [TP, "strategy_options.cp_size=2", "strategy_options.cp_attention=ring"]),
    "llama-tp-ring": (LLAMA, "fsdp-tp", [TP, "strategy_options.cp_size=2", "strategy_options.cp_attention=ring"]),
    "gpt-ddp-tp-pp": (DEEP, "ddp-tp", [TP, "strategy_options.pp_size=2"]),
}


def _train(out_dir, strategy: str, nproc: int, extra: list[str]) -> tuple[dict, list[dict]]:
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *NANO, *CUDA, *extra]
    succeeded(run_cli(args, env=env_for_tests(), timeout=300))
    return read_run(out_dir)


@pytest.fixture(scope="module")
def singles(tmp_path_factory):
    """model settings -> single's rows on one GPU."""
    return {
        "gpt": _train(tmp_path_factory.mktemp("gpt-single"), "single", 1, DEEP)[1],
        "llama": _train(tmp_path_factory.mktemp("llama-single"), "single", 1, LLAMA)[1],
    }


@pytest.mark.parametrize("name", list(RUNS))
def test_loss_matches_single_on_gpus(singles, tmp_path, name, record_property):
    model, strategy, options = RUNS[name]
    summary, rows = _train(tmp_path, strategy, NPROC, [*model, *options])
    deviation = max_rel_diff(rows, singles[name.split("-")[0]])
    record_property("max_rel_loss_diff", deviation)
    print(f"{name}: largest relative loss deviation from single = {deviation:.2e}")
    assert summary["world_size"] == NPROC
    assert deviation < (RING_TOLERANCE if "ring" in name else ALL_TO_ALL_TOLERANCE)
