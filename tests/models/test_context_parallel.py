"""models/context_parallel.py composed with tensor parallel, without FSDP (what a mesh of pp x dp x
cp x tp calls): tests/models/context_parallel_worker.py on 4 gloo ranks, each case's loss and
every gradient against the whole model in one process. The GPT under sequence parallel and the
Hugging Face Llama on cp 2 x tp 2 (the all-to-all sharing out the heads each tensor-parallel rank
holds, its one key/value head repeated), and the Llama on cp 4 (each of 2 key/value heads repeated
for the 2 ranks whose queries read it); transformers' registry left as it was for other models;
the head-and-tail shares of torch's ring attention. fsdp-cp's runs against `single` are in
tests/strategies/test_equivalence_cp.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ROOT, env_for_tests, forked_torchrun, run_bounded

pytestmark = pytest.mark.timeout(300)

NPROC = 4
CASES = ("gpt, cp 2 x tp 2, sequence parallel", "llama, cp 2 x tp 2", "llama, cp 4")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    path = tmp_path_factory.mktemp("context-parallel") / "results.json"
    worker = ROOT / "tests" / "models" / "context_parallel_worker.py"
    proc = run_bounded(forked_torchrun(NPROC, worker, str(path)), timeout=240, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return [json.loads(Path(f"{path}.rank{rank}").read_text()) for rank in range(NPROC)]


@pytest.mark.parametrize("case", CASES)
def test_loss_and_every_gradient_match_the_whole_model(ranks, case):
    for rank, results in enumerate(ranks):
        result = results[case]
        assert "error" not in result, f"rank {rank}: {result}"
        assert result["loss_difference"] < 1e-5, f"rank {rank}: {result}"
        # fp32 sums in another order; a head or position mixed up moves gradients by about their size.
        assert result["largest_gradient_difference"] < 1e-6 * max(1.0, result["largest_gradient"]), f"rank {rank}"


def test_the_split_leaves_transformers_registry_to_other_models(ranks):
    for results in ranks:
        assert results["registry"] == {"sdpa entry": "transformers'", "a new model's attention": "sdpa"}


def test_ring_shares_are_head_and_tail(ranks):
    """Over cp 2, 16 tokens in chunks of 4: rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2,
    tokens and positions alike."""
    for results in ranks:
        shares = results["ring shares"]
        want = {0: [0, 1, 2, 3, 12, 13, 14, 15], 1: [4, 5, 6, 7, 8, 9, 10, 11]}[shares["cp_rank"]]
        assert shares["positions"] == want and shares["tokens_match"]
