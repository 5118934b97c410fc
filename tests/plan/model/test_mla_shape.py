"""Multi-head latent attention and DeepSeek-V3's family in the planner (mla_shape.py, deepseek_shape.py):
the published parameter counts, the shape transformers builds, what Megatron-core's tensor parallel
splits, the attention at unequal head dims, what the module keeps for backward against autograd, and
what group-limited routing sends across nodes against a simulation of the router."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from bench import plan_vs_published as published
from bench.moe_rows import moe_shape_of_row
from harness.common.hardware import gpu_spec
from harness.plan.memory.activations import NORM_STATS_BYTES, block_bytes_per_token
from harness.plan.memory.expert_memory import expert_activations
from harness.plan.memory.model_states import tp_slice
from harness.plan.memory.recipe import Recipe
from harness.plan.model.mla_shape import DOWN_PROJECTIONS, mla_projections, mla_tensors
from harness.plan.model.model_catalogue import summary
from harness.plan.model.model_shape import PlanError, shape_of_spec
from harness.plan.model.moe_shape import total_params
from harness.plan.network.expert_comm import forwarded_copies, node_reached
from harness.plan.network.fabric import Group
from harness.plan.parallel.expert_layout import ExpertLayout
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from harness.plan.speed.attention import attention_seconds
from tests.helpers import ROOT

TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    intermediate_size=96,
    moe_intermediate_size=24,
    n_routed_experts=8,
    n_shared_experts=1,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=4,
    first_k_dense_replace=1,
    num_hidden_layers=3,
    vocab_size=128,
)


def test_the_catalogue_plans_deepseek_v3_and_kimi_k2_at_their_published_counts():
    deepseek, kimi = summary("deepseek-v3").shape, summary("kimi-k2").shape
    # arXiv 2412.19437: 671B total, 37B activated per token (the main model: its MTP module left out)
    assert round(total_params(deepseek) / 1e9) == 671 and int(deepseek.flops_params / 1e9) == 37
    # Kimi-K2's model card: 1T total, 32B activated
    assert round(total_params(kimi) / 1e12) == 1 and int(kimi.flops_params / 1e9) == 32
    assert "multi-token-prediction module" in deepseek.note and not kimi.note


def test_the_shape_read_offline_is_the_model_transformers_builds():
    import torch
    import transformers

    config = transformers.DeepseekV3Config(**TINY)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shape = shape_of_spec("hf:DeepseekV3Config", TINY)
    assert total_params(shape) == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert shape.dims.moe.routed_params(shape.dims.width) == experts
    attention = [tuple(p.shape) for n, p in model.named_parameters() if n.startswith("model.layers.0.self_attn.")]
    mla = shape.dims.mla
    assert attention == [s for _, s, _ in mla_tensors(TINY["hidden_size"], TINY["num_attention_heads"], mla, 0)]
    assert shape.dims.moe.blocks == (False, True, True) and shape.dims.moe.shared_ffn == TINY["moe_intermediate_size"]


def test_tensor_parallel_splits_what_megatron_splits():
    shape = shape_of_spec("hf:DeepseekV3Config", TINY)
    mla, h, heads = shape.dims.mla, TINY["hidden_size"], TINY["num_attention_heads"]
    named = mla_tensors(h, heads, mla, 0)
    block = [t for t in shape.tensors if t.block == 0][: len(named)]
    for (name, full, _), tensor in zip(named, block, strict=True):
        held = tp_slice(tensor, 4).shape
        if name in DOWN_PROJECTIONS:  # TELinear duplicated: whole on every GPU
            assert held == full
        elif len(full) == 2:  # the up-projections column-parallel, wo row-parallel: split by heads
            assert held[0] * held[1] * 4 == full[0] * full[1]
    # Each GPU's matmul flops a quarter of the block's: the down-projections on its sequence shard.
    whole, split = mla_projections(h, heads, mla, 1), mla_projections(h, heads, mla, 4)
    for (out, into), (out4, into4) in zip(whole, split, strict=True):
        assert out4 * into4 * 4 == out * into
    assert split[-1] == (h, heads * mla.v_head // 4)  # wo reads its heads' values, writes the whole width


def test_tensor_parallel_gathers_the_latents_into_the_up_projections():
    from harness.plan.network.comm import _tensor_parallel
    from harness.plan.parallel.layout import Layout

    shape = summary("deepseek-v3").shape
    gqa = dataclasses.replace(shape, dims=dataclasses.replace(shape.dims, mla=None))  # as if it gathered H
    one = Group(1, 1)
    layout = Layout(2, 1, 1, 1, one, one, Group(2, 2), one)

    def payload(s, kind: str) -> float:
        collectives = _tensor_parallel(s, layout, 4096, "bf16", "none", megatron=True)
        return sum(c.payload_bytes for c in collectives if c.kind == kind)

    h, layers, latent = 7168, 61, 1536 + 512 + 64
    element = 4096 * 2  # a token's element in bf16, per H
    # Megatron's gathers: the forward's and the weight gradients' on the input's side, the backward's on the output's.
    assert payload(gqa, "all-gather") - payload(shape, "all-gather") == pytest.approx(
        2 * layers * (h - latent) * element
    )
    assert payload(gqa, "reduce-scatter") - payload(shape, "reduce-scatter") == pytest.approx(
        layers * (h - latent) * element
    )


def test_the_attention_runs_queries_and_keys_at_192_and_values_at_128():
    shape = summary("deepseek-v3").shape
    d = shape.dims
    attention = shape.flops_per_token(4096) - 6 * shape.flops_params
    assert attention == pytest.approx(6 * d.layers * d.heads * (192 + 128) * 4096)
    gpu = gpu_spec("H100")
    kwargs = dict(batch=1, seq=4096, heads=128)
    latent = attention_seconds(gpu, "flash3", "bf16", head_dim=192, v_head_dim=128, **kwargs)
    equal = attention_seconds(gpu, "flash3", "bf16", head_dim=128, **kwargs)
    for unequal_s, equal_s in zip(latent, equal, strict=True):  # the same rate above 128: flops of 160 against 128
        assert unequal_s == pytest.approx(equal_s * 160 / 128)


class _KernelSaves:
    """A fused attention kernel's saves, as FlashAttention and cuDNN keep them: q, k, v (contiguous),
    the output in (B, T, H, D) and the fp32 log-sum-exp per head; computed here in eager ops."""

    @staticmethod
    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        import torch

        class Kernel(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                scores = (q.float() @ k.float().transpose(-1, -2)) * scaling
                causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
                scores = scores.masked_fill(~causal, float("-inf"))
                lse = scores.logsumexp(-1)
                out = ((scores - lse[..., None]).exp() @ v.float()).to(q.dtype).transpose(1, 2).contiguous()
                ctx.save_for_backward(q, k, v.contiguous(), out, lse)
                return out

            @staticmethod
            def backward(ctx, grad):
                raise NotImplementedError("the test counts what the forward saves")

        return Kernel.apply(query, key, value), None


def test_what_latent_attention_keeps_is_what_autograd_saves():
    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    AttentionInterface.register("kernel_saves", _KernelSaves.attention)
    config = transformers.DeepseekV3Config(**TINY)
    config._attn_implementation = "kernel_saves"
    torch.manual_seed(0)
    attention = DeepseekV3Attention(config, 0).to(torch.bfloat16).train()
    batch, seq = 3, 40
    x = torch.randn(batch, seq, TINY["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, torch.arange(seq)[None].expand(batch, seq))
    skip = {t.untyped_storage().data_ptr() for t in (*attention.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in skip and t.is_floating_point():
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attention(x, (cos, sin), None)
    dims = shape_of_spec("hf:DeepseekV3Config", TINY).dims
    block = block_bytes_per_token(dims, "bf16", "low_precision")
    h = TINY["hidden_size"]
    # The block's account less what is not the attention's: its two eager RMSNorms and the MLP's input
    # (the MoE's own activations are expert_memory.py's).
    rest = 2 * (h * (4 + 2) + NORM_STATS_BYTES[True]) + h * 2
    assert sum(saved.values()) == pytest.approx((block - rest) * batch * seq, rel=0.01)


def test_mla_up_proj_frees_q_k_and_v_and_is_refused_without_latent_attention():
    shape = shape_of_spec("hf:DeepseekV3Config", TINY)
    experts = ExpertLayout(1, 1, 1, Group(1, 1), Group(1, 1))

    def dropped(recipe: Recipe, s=shape) -> int:
        return expert_activations(
            s,
            micro_batch=2,
            seq_len=64,
            tp=1,
            experts=experts,
            precision="bf16",
            mixed_precision="low_precision",
            checkpointing="none",
            megatron=True,
            sequence_parallel=True,
            recipe=recipe,
        ).dropped

    mla = shape.dims.mla
    freed = TINY["num_hidden_layers"] * TINY["num_attention_heads"] * (2 * mla.qk_head + mla.v_head) * 2 * 128
    assert dropped(Recipe(recompute_modules=("mla_up_proj",))) - dropped(Recipe()) == freed
    with pytest.raises(PlanError, match="mla_up_proj recomputes latent attention's up-projections"):
        dropped(Recipe(recompute_modules=("mla_up_proj",)), shape_of_spec("hf:MixtralConfig", {"num_hidden_layers": 2}))
    with pytest.raises(PlanError, match="llama3.1-8b has none"):  # a dense model's plan too
        question(PlanConfig(model="llama3.1-8b", gpus=8, recompute_modules=["mla_up_proj"]))


def _deepseek_rows() -> list[dict[str, str]]:
    with (ROOT / "bench" / "data" / "moe_runs.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["arch"] == "deepseek_v3"]


def test_deepseek_and_kimi_are_planned_where_they_were_refused():
    for row in _deepseek_rows():
        assert moe_shape_of_row(row).dims.mla is not None
    assert shape_of_spec("hf:DeepseekV3Config").dims.moe.topk_groups == 4
    config = PlanConfig(model="deepseek-v3", gpus=512, gpu="H100", seq_len=4096, micro_batch=1)
    q = question(dataclasses.replace(config, activation_checkpointing="full", strategies=["fsdp-ep"]))
    assert plan_strategy("fsdp-ep", q).time.tokens_per_s > 0


def _router_reach(nodes: int, tokens: int = 4000) -> float:
    """DeepSeek-V3's routing on random scores (as force-balanced benchmarks route): each group scored by
    the sum of its best 2, the best 4 of 8 groups kept, the top 8 of their experts; the mean chance a
    node of `nodes` (holding the 256 experts in order) is reached."""
    import numpy as np

    rng = np.random.default_rng(0)
    scores = rng.random((tokens, 256))
    group_scores = np.sort(scores.reshape(tokens, 8, 32), axis=-1)[:, :, -2:].sum(-1)
    kept = np.zeros((tokens, 8), bool)
    np.put_along_axis(kept, np.argsort(-group_scores, axis=1)[:, :4], True, 1)
    chosen = np.argsort(-np.where(np.repeat(kept, 32, axis=1), scores, -1.0), axis=1)[:, :8]
    reached = np.zeros((tokens, nodes), bool)
    np.put_along_axis(reached, chosen // (256 // nodes), True, 1)
    return float(reached.mean())


@pytest.mark.parametrize("nodes", [2, 4, 8, 16])
def test_node_limited_routing_is_the_routers_reach(nodes):
    limited, unlimited = node_reached(8, nodes, 8, 4), node_reached(8, nodes, 8, 8)
    assert limited == pytest.approx(_router_reach(nodes), rel=0.05)
    assert limited < unlimited


def test_node_limited_routing_caps_what_crosses_the_network():
    ep64 = ExpertLayout(64, 1, 1, Group(64, 8), Group(1, 1))  # DeepSeek-V3's EP 64 over 8 nodes
    assert forwarded_copies(8, ep64, 8, 4) == pytest.approx(4.0)  # every token to 4 of the 8 nodes
    assert forwarded_copies(8, ep64) == pytest.approx(8 * (1 - (7 / 8) ** 8))  # unlimited top-8: 5.25
    # End to end: the published AutoModel run (DeepEP over EP 64 on 8 nodes) with its groups and without.
    row = next(r for r in _deepseek_rows() if "Automodel" in r["source"] and r["gpus"] == "256")
    unlimited = {**row, "notes": row["notes"].replace("topk_groups=4", "topk_groups=8")}

    def exchanged(r: dict[str, str]) -> float:
        _, plan, _ = published.question(r)
        return sum(c.payload_bytes for c in plan.collectives if c.kind == "all-to-all")

    assert exchanged(row) / exchanged(unlimited) == pytest.approx(4.0 / (8 * (1 - (7 / 8) ** 8)), rel=0.02)
