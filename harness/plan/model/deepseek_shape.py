"""DeepSeek-V3's family (DeepSeek-V3, Kimi-K2) read from its sizes without torch: a mixture of
experts whose blocks run multi-head latent attention (mla_shape.py), whose first
`first_k_dense_replace` blocks have a dense SwiGLU FFN, and whose MoE blocks route each token to
top_k of `n_routed_experts` among the experts of its best `topk_group` of `n_group` groups
(group-limited routing; moe_shape.py's MoEDims.groups), beside `n_shared_experts` shared experts.

The parameters are transformers 5's DeepseekV3ForCausalLM's, in its order: per block the latent
attention, then (MoE blocks) the router `gate.weight` (E, H) (its e_score_correction_bias is a
buffer), the stacked experts and the shared experts' SwiGLU, or (dense blocks) the SwiGLU, then the
two RMSNorms; the final norm and an untied head. config.json's `num_nextn_predict_layers` counts
DeepSeek-V3's multi-token-prediction modules (arXiv 2412.19437, Section 2.2: each a block, a
2H x H projection and two RMSNorms, sharing the embedding and head), which transformers does not
build and the planner leaves out, saying so in the plan's note.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.common.numbers import is_whole
from harness.plan.model.mla_shape import DOWN_PROJECTIONS, mla_of, mla_tensors
from harness.plan.model.model_shape import ModelShape, PlanError, TransformerDims, _shape
from harness.plan.model.moe_shape import _INERT, MoEDims, with_experts

# `hf:` names of the family: the config class, and the model types of DeepSeek-V3's and Kimi-K2's config.json.
DEEPSEEK_NAMES = ("DeepseekV3Config", "deepseek_v3", "kimi_k2")
SCORING = {"sigmoid": "sigmoid", "softmax": "softmax"}
MTP_FIELD = "num_nextn_predict_layers"

# transformers 5's DeepseekV3Config defaults (DeepSeek-V3's own sizes), the fields that shape the model.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "attention_bias": False,
    MTP_FIELD: 0,
}
# Fields that shape nothing the planner models: routing's weights and losses (the routed scaling, the
# top-k renormalisation, the auxiliary-loss-free bias's method), rotary's layout, the weights' storage.
INERT = _INERT | {
    "routed_scaling_factor",
    "rope_interleave",
    "pretraining_tp",
    "topk_method",
    "seq_aux",
    "aux_loss_alpha",
    "ep_size",
    "quantization_config",
    "head_dim",  # transformers sets it to qk_rope_head_dim; the latent sizes say every width
}


def _whole(spec: str, s: dict[str, Any], key: str, least: int = 1) -> int:
    value = s[key]
    if not is_whole(value, least):
        raise PlanError(f"model {spec}: {key}={value!r} must be a whole number of at least {least}")
    return value


def deepseek_shape(spec: str, kwargs: dict[str, Any]) -> ModelShape:
    """The shape of a DeepSeek-V3-family model with `kwargs` over DeepseekV3Config's defaults."""
    unknown = sorted(k for k in kwargs if k not in DEFAULTS and k not in INERT)
    if unknown:
        raise PlanError(
            f"model {spec}: DeepseekV3Config field {', '.join(unknown)} is not one the planner reads: give the "
            f"sizes it knows ({', '.join(sorted(DEFAULTS))})"
        )
    s = {**DEFAULTS, **{k: v for k, v in kwargs.items() if k in DEFAULTS}}
    if s["attention_bias"]:
        raise PlanError(f"model {spec}: attention_bias=true (biases on the latent projections) is not read")
    if s["scoring_func"] not in SCORING:
        raise PlanError(f"model {spec}: scoring_func={s['scoring_func']!r} is not one of {', '.join(SCORING)}")
    h, heads, layers, vocab = (
        _whole(spec, s, k) for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
    )
    mla = mla_of(s, spec)
    experts, top_k = _whole(spec, s, "n_routed_experts"), _whole(spec, s, "num_experts_per_tok")
    expert_ffn, dense_ffn = _whole(spec, s, "moe_intermediate_size"), _whole(spec, s, "intermediate_size")
    shared = _whole(spec, s, "n_shared_experts", 0) * expert_ffn
    first_dense, step = _whole(spec, s, "first_k_dense_replace", 0), _whole(spec, s, "moe_layer_freq")
    blocks = tuple(i >= first_dense and i % step == 0 for i in range(layers))
    named: list[tuple[str, tuple[int, ...], int | None]] = [("embed_tokens", (vocab, h), None)]
    for i in range(layers):
        named += mla_tensors(h, heads, mla, i)
        if blocks[i]:
            named.append(("mlp.gate", (experts, h), i))
            if shared:
                named += [
                    ("mlp.shared_experts.gate_proj", (shared, h), i),
                    ("mlp.shared_experts.up_proj", (shared, h), i),
                    ("mlp.shared_experts.down_proj", (h, shared), i),
                ]
        else:
            named += [("mlp.gate_proj", (dense_ffn, h), i), ("mlp.up_proj", (dense_ffn, h), i)]
            named.append(("mlp.down_proj", (h, dense_ffn), i))
        named += [("input_layernorm", (h,), i), ("post_attention_layernorm", (h,), i)]
    named.append(("norm", (h,), None))
    tied = bool(s["tie_word_embeddings"])
    if not tied:
        named.append(("lm_head", (vocab, h), None))
    dims = TransformerDims(
        layers,
        h,
        heads,
        mla.v_head,
        heads,
        0,
        vocab,
        gated_mlp=True,
        fused_qkv=False,
        rms_norm=True,
        rotary=True,
        mla=mla,
    )
    moe = MoEDims(
        experts,
        top_k,
        expert_ffn,
        blocks,
        shared_ffn=shared,
        dense_ffn=dense_ffn,
        router=SCORING[s["scoring_func"]],
        groups=_whole(spec, s, "n_group"),
        topk_groups=_whole(spec, s, "topk_group"),
    )
    carrier = _shape(spec, named, dims, tied_head=tied)
    assert carrier.tensors is not None
    whole = [name in DOWN_PROJECTIONS for name, _, _ in named]
    tensors = tuple(
        dataclasses.replace(t, tp_whole=True) if w else t for t, w in zip(carrier.tensors, whole, strict=True)
    )
    shape = with_experts(dataclasses.replace(carrier, tensors=tensors), moe)
    mtp = _whole(spec, s, MTP_FIELD, 0)
    if mtp:
        note = (
            f"its {mtp} multi-token-prediction module{'s' if mtp > 1 else ''} ({MTP_FIELD}: a block, a 2H x H "
            "projection and two norms each, sharing the embedding and head) left out"
        )
        shape = dataclasses.replace(shape, note=note)
    return shape


def is_deepseek(name: str) -> bool:
    """Whether `hf:<name>` (a config class or a model type) is of this family."""
    return name in DEEPSEEK_NAMES
