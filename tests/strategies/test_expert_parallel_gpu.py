"""Expert parallel on the torch mesh on 4 GPUs (skipped with fewer) under NCCL: moe-nano under fsdp-ep
(ep 2 x shard 2) in fp32 against `single` on the same GPU, which runs what only NCCL does here (the
experts' gradients divided by the data-parallel degree inside the reduce-scatter, NCCL's PREMUL_SUM,
where gloo sums and then divides), and in bf16 against single's bf16 curve within bf16's noise."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import env_for_tests, max_rel_diff, read_run, run_cli, succeeded
from tests.strategies.test_accelerate_gpu import BF16_TOLERANCE
from tests.strategies.test_context_parallel_gpu import ALL_TO_ALL_TOLERANCE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA devices (NCCL takes one rank per GPU)"),
]

RUN = ["model=moe-nano", "device=cuda", "steps=10", "batch_size=8", "seq_len=32", "data_samples=256", "log_every=5"]
EP = ["strategy_options.ep_size=2"]
TOLERANCE = {"fp32": ALL_TO_ALL_TOLERANCE, "bf16": BF16_TOLERANCE}


def _train(out_dir, strategy: str, nproc: int, extra: list[str]) -> tuple[dict, list[dict]]:
    args = ["train", f"strategy={strategy}", f"nproc={nproc}", f"out_dir={out_dir}", *RUN, *extra]
    succeeded(run_cli(args, env=env_for_tests(), timeout=300))
    return read_run(out_dir)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp_ep_matches_single_on_gpus(tmp_path, precision, record_property):
    _, reference = _train(tmp_path / "single", "single", 1, [f"precision={precision}"])
    summary, rows = _train(tmp_path / "fsdp-ep", "fsdp-ep", 4, [f"precision={precision}", *EP])
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"fsdp-ep {precision}: largest relative loss deviation from single = {deviation:.2e}")
    assert summary["mesh"]["dims"] == ["shard", "ep"] and deviation < TOLERANCE[precision]
