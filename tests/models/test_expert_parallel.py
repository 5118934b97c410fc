"""Expert parallel (models/expert_parallel.py) against one process, over gloo at world size 4 (a 2 x 2
mesh dp x ep): the loss and every gradient of the global batch, the zoo's MoE GPT and a
transformers Mixtral, with the experts' weights sharded in half over each ep pair."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, env_for_tests, forked_torchrun, run_bounded

pytestmark = pytest.mark.timeout(600)

WORKER = ROOT / "tests" / "models" / "expert_parallel_worker.py"
TOLERANCE = 1e-5
MODELS = {
    "moe-nano": ("moe-nano", {}),
    "moe-nano-capacity": ("moe-nano", {"capacity_factor": 1.0}),
    "mixtral": (
        "hf:MixtralConfig",
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "vocab_size": 128,
        },
    ),
}


@pytest.fixture(
    scope="module", params=[pytest.param(m, marks=pytest.mark.extended) if m == "mixtral" else m for m in MODELS]
)
def ranks(request, tmp_path_factory) -> list[dict]:
    spec, kwargs = MODELS[request.param]
    out = tmp_path_factory.mktemp(request.param) / "result.json"
    cmd = forked_torchrun(4, WORKER, str(out), spec, json.dumps(kwargs))
    proc = run_bounded(cmd, timeout=300, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return [json.loads(out.with_name(f"{out.name}.rank{r}").read_text()) for r in range(4)]


def test_the_loss_is_the_global_batch_loss(ranks):
    for result in ranks:
        assert result["loss_rel_diff"] < TOLERANCE


def test_every_gradient_matches_one_process(ranks):
    for result in ranks:
        worst = max(result["grad_rel_diff"].items(), key=lambda kv: kv[1])
        assert worst[1] < TOLERANCE, worst


def test_each_rank_holds_half_the_experts(ranks):
    for result in ranks:
        assert result["sharded"], "no expert weights were sharded"
        assert all(shape[0] == 2 for shape in result["local_shapes"]), result["local_shapes"]
