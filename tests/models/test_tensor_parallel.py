"""Tensor-parallel plans: the GPT's own, Hugging Face's passed on, one-line refusals for a model
with no plan, a bad style, a pattern that matches nothing and a tp_size that splits heads; and
applying a plan (in a one-rank process group) keeps the model's function and its tied weights."""

from __future__ import annotations

import sys

import pytest
import torch.nn as nn

from harness.train.distributed import free_port
from models.tensor_parallel import TensorParallelError, plan_of, uses_sequence_parallel
from models.zoo import build_model
from tests.helpers import ROOT, env_for_tests, run_bounded

LLAMA_KWARGS = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def test_the_gpt_splits_attention_by_heads_and_the_mlp_column_then_row_wise():
    plan = plan_of(build_model("gpt-nano"), 2, sequence_parallel=False)
    assert plan == {
        "blocks.*.attn.c_attn": "packed_colwise_qkv",
        "blocks.*.attn.c_proj": "rowwise",
        "blocks.*.mlp.c_fc": "colwise",
        "blocks.*.mlp.c_proj": "rowwise",
    }
    with_sequence = plan_of(build_model("gpt-nano"), 2, sequence_parallel=True)
    assert uses_sequence_parallel(with_sequence) and not uses_sequence_parallel(plan)
    assert with_sequence["blocks.*.attn.c_proj"] == "rowwise_to_sequence"


def test_a_tp_size_that_splits_heads_is_refused_with_the_sizes_that_would_not():
    with pytest.raises(TensorParallelError, match="tp_size=4 does not divide the 2 attention heads of this GPT: use "):
        plan_of(build_model("gpt-nano"), 4, sequence_parallel=False)


def test_hugging_face_models_bring_their_own_plan():
    pytest.importorskip("transformers")
    model = build_model("hf:LlamaConfig", LLAMA_KWARGS)
    plan = plan_of(model, 2, sequence_parallel=True)
    assert plan["hf.model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["hf.model.layers.*.self_attn.o_proj"] == "rowwise"
    assert plan["hf.lm_head"] == "colwise_rep"  # transformers' colwise_gather_output
    assert not uses_sequence_parallel(plan)
    with pytest.raises(TensorParallelError, match="does not divide the 2 key/value heads of LlamaConfig"):
        plan_of(model, 4, sequence_parallel=False)


class NoPlan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)


class WithPlan(NoPlan):
    def __init__(self, plan: dict[str, str]) -> None:
        super().__init__()
        self.plan = plan

    def tensor_parallel_plan(self, tp_size: int, sequence_parallel: bool) -> dict[str, str]:
        return self.plan


@pytest.mark.parametrize(
    "model, expected",
    [
        (NoPlan(), "model NoPlan has no tensor-parallel plan: give the model a method tensor_parallel_plan("),
        (WithPlan({}), "plan is empty"),
        (WithPlan({"layer": "diagonal"}), "splits layer by style 'diagonal', which parabench does not run"),
        (WithPlan({"layers.*.proj": "colwise"}), "names layers.*.proj, which matches no module of it"),
    ],
)
def test_a_plan_that_cannot_run_is_one_line(model, expected):
    with pytest.raises(TensorParallelError, match=expected.replace("(", r"\(")) as err:
        plan_of(model, 2, sequence_parallel=False)
    assert "\n" not in str(err.value)


# One process, a one-rank tensor-parallel mesh: every style applies, DTensor computes, and the
# model must give the unsplit model's loss and keep its tied head and embedding one parameter.
APPLY_PROBE = """
import os, sys, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from torch.distributed.device_mesh import init_device_mesh
from models.tensor_parallel import parallelize, plan_of, TensorParallelError
from models.zoo import build_model
mesh = init_device_mesh("cpu", (1,))
tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))
for sequence_parallel in (False, True):
    torch.manual_seed(0)
    model = build_model("gpt-nano")
    expected = model(tokens[:, :-1], tokens[:, 1:]).item()
    parallelize(model, mesh, plan_of(model, 1, sequence_parallel))
    got = model(tokens[:, :-1], tokens[:, 1:])
    got.backward()
    print(abs(got.item() - expected) < 1e-6, model.lm_head.weight is model.wte.weight,
          type(model.blocks[0].attn.c_attn.weight).__name__)
model = build_model("gpt-nano")
try:
    parallelize(model, mesh, {"wte": "embedding_rowwise"})
except TensorParallelError as exc:
    print(exc)
dist.destroy_process_group()
"""


def test_a_plan_applied_keeps_the_function_and_the_ties():
    proc = run_bounded(
        [sys.executable, "-c", APPLY_PROBE, str(free_port())],
        timeout=120,
        env=env_for_tests(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["True True DTensor", "True True DTensor"]
    assert lines[2].startswith(
        "wte.weight and lm_head.weight are one tied parameter, but the tensor-parallel plan splits them differently"
    )
