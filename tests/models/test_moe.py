"""The zoo's MoE GPT and the routing pieces (models/moe.py, models/routing.py) in one process: active
parameters, the balance loss and capacity per sequence, the router tally, one-line refusals."""

from __future__ import annotations

import pytest
import torch

from models.deepspeed_moe_layers import refusal
from models.moe import MoEGPT
from models.routing import balance_loss, experts_modules, over_capacity, router_tallies
from models.tensor_parallel import TensorParallelError
from models.zoo import ModelError, build_model

MIXTRAL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 128,
}


def test_the_parameter_count_is_of_the_active_experts():
    model = build_model("moe-nano")
    c = model.config
    total = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    inactive = c.n_layer * (c.n_experts - c.top_k) * 3 * c.n_embd * c.expert_hidden
    assert model.num_params() == total - inactive
    assert model.flops_per_token(32) == 6 * model.num_params() + 12 * c.n_layer * c.n_embd * 32


def test_every_other_block_has_experts_with_moe_every_2():
    model = build_model("moe-micro", {"moe_every": 2})
    assert [hasattr(b.mlp, "router") for b in model.blocks] == [False, True, False, True]
    assert len(experts_modules(model)) == 2


def test_the_balance_loss_is_one_when_balanced_and_a_mean_over_sequences():
    probs = torch.full((2, 4, 4), 0.25)
    balanced = torch.tensor([[[0, 1], [2, 3], [0, 1], [2, 3]]] * 2)
    assert balance_loss(probs, balanced, 4).item() == pytest.approx(1.0)
    logits = torch.randn(6, 8, 4)
    probs, indices = logits.softmax(-1), logits.topk(2, dim=-1).indices
    whole = balance_loss(probs, indices, 4)
    halves = (balance_loss(probs[:3], indices[:3], 4) + balance_loss(probs[3:], indices[3:], 4)) / 2
    assert whole.item() == pytest.approx(halves.item(), rel=1e-6)


def test_capacity_keeps_first_choices_ahead_of_second_then_by_position():
    # One sequence of 3 tokens, top-2 over 2 experts; expert 0 takes 2.
    indices = torch.tensor([[[1, 0], [0, 1], [0, 1]]])
    dropped = over_capacity(indices, 2, 2)
    # Expert 0: first choices of tokens 1 and 2 kept, token 0's second choice dropped; expert 1: token
    # 0's first choice, then token 1's second; token 2's second dropped.
    assert dropped.tolist() == [[[False, True], [False, False], [False, True]]]


def test_the_tally_counts_each_routed_token_once_under_activation_checkpointing():
    model = build_model("moe-nano")
    model.activation_checkpointing = True
    tokens = torch.randint(0, 128, (3, 17))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    for tally in router_tallies(model):
        counts = tally.take(torch.device("cpu"))
        assert counts[:-1].sum().item() == 3 * 16 * 2 and counts[-1].item() == 0


def test_a_capacity_drops_and_the_tally_says_how_many():
    model = build_model("moe-nano", {"capacity_factor": 0.5})
    tokens = torch.randint(0, 128, (2, 33))
    model(tokens[:, :-1], tokens[:, 1:])
    dropped = sum(t.take(torch.device("cpu"))[-1].item() for t in router_tallies(model))
    # Capacity ceil(0.5 x 2 x 32 / 4) = 8: of a sequence's 64 assignments a layer keeps 4 x 8 at most.
    assert dropped >= 2 * 2 * (64 - 4 * 8)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"top_k": 5}, "top_k=5 must be between 1 and n_experts=4"),
        ({"capacity_factor": 0.0}, "capacity_factor=0.0 must be above 0"),
        ({"moe_every": 3}, "moe_every=3 must be between 1 and n_layer=2"),
    ],
)
def test_a_bad_routing_option_is_one_line(kwargs, says):
    with pytest.raises(ModelError, match=says):
        build_model("moe-nano", kwargs)


def test_tensor_parallel_splits_the_attention_and_leaves_the_moe_layers_whole():
    assert build_model("moe-nano").tensor_parallel_plan(2, True) == {
        "blocks.*.attn.c_attn": "packed_colwise_qkv",
        "blocks.*.attn.c_proj": "rowwise",
    }
    plan = build_model("hf:MixtralConfig", MIXTRAL).tensor_parallel_plan(2, False)
    assert "hf.model.layers.*.self_attn.q_proj" in plan and not any(".mlp" in pattern for pattern in plan)
    with pytest.raises(TensorParallelError, match="does not divide the 2 attention heads"):
        build_model("moe-nano").tensor_parallel_plan(4, True)


def test_a_transformers_mixtral_counts_active_parameters_and_tallies_its_routing():
    model = build_model("hf:MixtralConfig", MIXTRAL)
    experts = [m for _, m in experts_modules(model)]
    assert len(experts) == 2
    per_expert = sum(p.numel() for p in experts[0].parameters()) // 4
    assert model.num_params() == sum(p.numel() for p in model.parameters()) - 2 * 2 * per_expert
    tokens = torch.randint(0, 128, (2, 9))
    model(tokens[:, :-1], tokens[:, 1:])
    assert [t.take(torch.device("cpu"))[:-1].sum().item() for t in router_tallies(model)] == [32, 32]


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"top_k": 1}, "top-1 gate weights the expert by its softmax probability"),
        ({"norm_topk_prob": False}, "top-2 gate renormalises"),
        ({"capacity_factor": 1.25}, "capacity over each rank's whole micro-batch"),
    ],
)
def test_deepspeed_refuses_routing_its_gate_cannot_reproduce(kwargs, says):
    assert says in refusal(build_model("moe-nano", kwargs))
    assert refusal(build_model("moe-nano")) is None
    assert refusal(build_model("hf:MixtralConfig", MIXTRAL)) is None
    assert "no MoE layers" in refusal(build_model("gpt-nano"))


def test_the_moe_gpt_is_not_cut_by_the_gpt_only_strategies():
    assert not isinstance(build_model("moe-nano"), type(build_model("gpt-nano")))
    assert isinstance(build_model("moe-nano"), MoEGPT)
