"""A mixture-of-experts transformer as the planner holds it: the dense part as a ModelShape of its
own (attention, norms, router, shared experts, the dense blocks' FFN, embedding and head: the
tensors every layout shards or replicates as it does a dense model's) whose MLP width is 0, and
the routed experts described by `MoEDims` beside it (dims.moe), which the layout shards over its
expert-parallel ranks (harness/plan/parallel/expert_layout.py) and the memory, compute and network
models price on their own (memory/expert_memory.py, speed/expert_compute.py, network/expert_comm.py).

Read without torch from the sizes: the zoo's MoE GPT presets (models/moe_config.py), the `hf:`
MoE configs of MOE_ARCHITECTURES (transformers 5's Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE, gpt-oss:
stacked experts, `gate_up_proj` (E, 2F, H) and `down_proj` (E, H, F)), and the catalogue's MoE
models (bench/data/moe_models.csv); DeepSeek-V3's family (DeepSeek-V3, Kimi-K2: latent attention,
group-limited routing) by deepseek_shape.py. DeepSeek-V2's routing and Llama 4's chunked attention
are refused in one line.

Parameters: `ModelShape.params` is the dense part; `total_params` adds every routed expert;
`flops_params` (N of 6N) counts the experts a token goes through (top_k of each MoE block), as
models/moe.py's `num_params` and the published "active parameters" count them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from harness.plan.model.model_shape import (
    ZOO_POSITIONS,
    ModelShape,
    PlanError,
    TransformerDims,
    _shape,
    gpt_tensors,
    whole_sizes,
)
from models.gpt_config import GPTConfig
from models.moe_config import MoEConfig

ROUTERS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEDims:
    """The routed experts of a model, and which of its blocks have them."""

    experts: int  # routed experts of each MoE block
    top_k: int  # experts each token goes through
    expert_ffn: int  # one routed expert's SwiGLU width
    blocks: tuple[bool, ...]  # per block: experts (True) or a dense FFN (False)
    shared_ffn: int = 0  # the shared experts' SwiGLU width together, on every MoE block (0: none)
    dense_ffn: int = 0  # the dense blocks' FFN width
    dense_gated: bool = True  # the dense blocks' FFN is a SwiGLU (False: a GELU MLP, the zoo's GPT)
    # None: dropless; else each expert keeps at most capacity x its even share of a rank's assignments, the
    # rest dropped (Megatron-core's topk_softmax_with_capacity, the zoo's over_capacity), and, where `padded`,
    # every expert's input filled up to that capacity (Megatron-core's --moe-pad-expert-input-to-capacity)
    capacity: float | None = None
    padded: bool = False
    router: str = "softmax"
    expert_bias: bool = False  # biases on the experts' projections (gpt-oss)
    # gpt-oss's SwiGLU: its gate and up clamped, the gate through sigmoid(1.702 x), the up offset by 1,
    # which no fused SwiGLU kernel runs (expert_compute.py prices its eager operators)
    clamped_swiglu: bool = False
    # Group-limited routing (DeepSeek-V3's node-limited routing): the experts in `groups` equal groups,
    # each token's top_k chosen among the experts of its best `topk_groups` groups (1 of 1: no limit).
    groups: int = 1
    topk_groups: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.experts:
            raise PlanError(f"top_k={self.top_k} must be between 1 and the {self.experts} experts")
        if self.groups < 1 or self.experts % self.groups or not 1 <= self.topk_groups <= self.groups:
            raise PlanError(
                f"{self.groups} expert groups, {self.topk_groups} of them a token: the groups must divide the "
                f"{self.experts} experts and topk_group be between 1 and n_group"
            )
        if self.top_k > self.topk_groups * self.experts // self.groups:
            raise PlanError(
                f"top_k={self.top_k} is more than the {self.topk_groups} groups a token reaches hold "
                f"({self.topk_groups * self.experts // self.groups} experts)"
            )
        if self.router not in ROUTERS:
            raise PlanError(f"router={self.router!r} is not one of {', '.join(ROUTERS)}")
        if self.capacity is not None and self.capacity <= 0:
            raise PlanError(f"capacity={self.capacity} must be above 0 (leave it out for dropless routing)")

    @property
    def moe_layers(self) -> int:
        return sum(self.blocks)

    @property
    def dense_layers(self) -> int:
        return len(self.blocks) - self.moe_layers

    def for_blocks(self, count: int) -> MoEDims:
        """The first `count` blocks' experts (a pipeline stage's)."""
        return dataclasses.replace(self, blocks=self.blocks[:count])

    def expert_params(self, width: int) -> int:
        """One routed expert's parameters: gate and up (2F x H), down (H x F), their biases where it has them."""
        f = self.expert_ffn
        return 3 * width * f + ((2 * f + width) if self.expert_bias else 0)

    def routed_params(self, width: int) -> int:
        return self.moe_layers * self.experts * self.expert_params(width)

    def active_routed_params(self, width: int) -> int:
        return self.moe_layers * self.top_k * self.expert_params(width)

    def tokens_per_expert(self, tokens: float) -> float:
        """Assignments one expert takes of `tokens` routed tokens, balanced: k T / E, or the capacity
        it is padded to."""
        even = tokens * self.top_k / self.experts
        return math.ceil(self.capacity * even) if self.capacity is not None and self.padded else even

    def busiest_load(self, imbalance: float) -> float:
        """The busiest GPU's assignments over the mean, its router's being `imbalance`: padded, every expert
        runs its capacity; dropping unpadded, no expert keeps more than its capacity, so no GPU more than
        capacity x its mean, and a balanced router drops nothing; dropless, the router's own."""
        if self.capacity is None:
            return imbalance
        return self.capacity if self.padded else min(imbalance, self.capacity)

    def describe(self) -> str:
        shared = f", shared experts {self.shared_ffn} wide" if self.shared_ffn else ""
        dense = f", {self.dense_layers} dense blocks (FFN {self.dense_ffn})" if self.dense_layers else ""
        routing = "dropless" if self.capacity is None else f"capacity {self.capacity:g}"
        if self.capacity is not None:
            routing += ", padded" if self.padded else ", dropped over it"
        if self.topk_groups < self.groups:
            routing += f", within {self.topk_groups} of {self.groups} expert groups"
        return (
            f"{self.experts} experts {self.expert_ffn} wide, top-{self.top_k} ({self.router}, {routing}) "
            f"on {self.moe_layers} blocks{shared}{dense}"
        )


def total_params(shape: ModelShape) -> int:
    """Every parameter of the model: the dense part and, of a mixture of experts, every routed expert."""
    moe = shape.dims.moe if shape.dims is not None else None
    return shape.params + (moe.routed_params(shape.dims.width) if moe is not None else 0)


def moe_of(shape: ModelShape) -> MoEDims | None:
    return shape.dims.moe if shape.dims is not None else None


def with_experts(shape: ModelShape, moe: MoEDims) -> ModelShape:
    """`shape` (the dense part, its MLP width 0) carrying `moe`: N of 6N counts the experts a token runs."""
    assert shape.dims is not None
    dims = dataclasses.replace(shape.dims, moe=moe, ffn_width=0)
    flops = shape.flops_params + moe.active_routed_params(dims.width)
    return dataclasses.replace(shape, dims=dims, flops_params=flops)


# --- the zoo's MoE GPT (models/moe.py) ------------------------------------------------------------


def zoo_moe_shape(name: str, cfg: MoEConfig) -> ModelShape:
    """models/moe.py's MoEGPT: the GPT's blocks, every moe_every-th with a router over E SwiGLU experts
    (and a shared SwiGLU expert where set) in place of its GELU MLP; head tied to the embedding."""
    if cfg.n_embd % cfg.n_head:
        raise PlanError(f"model {name}: n_embd={cfg.n_embd} must be a multiple of n_head={cfg.n_head}")
    h = cfg.n_embd
    dense = GPTConfig(cfg.n_layer, cfg.n_head, h, cfg.vocab_size, cfg.block_size, cfg.bias, cfg.dropout)
    blocks = tuple((i + 1) % cfg.moe_every == 0 for i in range(cfg.n_layer))
    named: list[tuple[str, tuple[int, ...], int | None]] = []
    for tensor in gpt_tensors(dense):
        label, shape, block = tensor
        if block is not None and blocks[block] and label.startswith("mlp."):
            continue  # an MoE block has no dense MLP
        named.append(tensor)
        if block is not None and blocks[block] and label.startswith("ln_2"):
            if label.endswith("bias") or not cfg.bias:
                named.append(("mlp.router.weight", (cfg.n_experts, h), block))
                if cfg.shared_expert_hidden:
                    named += [
                        ("mlp.shared_expert.gate_up_proj.weight", (2 * cfg.shared_expert_hidden, h), block),
                        ("mlp.shared_expert.down_proj.weight", (h, cfg.shared_expert_hidden), block),
                    ]
    dims = TransformerDims(
        cfg.n_layer, h, cfg.n_head, h // cfg.n_head, cfg.n_head, 0, cfg.vocab_size, tp_splits_head=False
    )
    carrier = _shape(name, named, dims, positions=ZOO_POSITIONS, tied_head=True)
    moe = MoEDims(
        cfg.n_experts,
        cfg.top_k,
        cfg.expert_hidden,
        blocks,
        shared_ffn=cfg.shared_expert_hidden,
        dense_ffn=4 * h,
        dense_gated=False,
        capacity=cfg.capacity_factor,
    )
    return with_experts(carrier, moe)


# --- Hugging Face MoE configs (transformers 5) ----------------------------------------------------


@dataclass(frozen=True)
class MoEArchitecture:
    """A transformers MoE config class: its defaults, and how its model lays out its blocks."""

    config_class: str
    model_type: str
    defaults: dict[str, Any]
    inert: frozenset[str]  # fields that shape nothing the planner models
    qkv_bias: bool = False
    qk_norm: str = ""  # "head": an RMSNorm per head (Qwen3), "whole": over the whole q and k (OLMoE)
    biased: bool = False  # gpt-oss: biases on every projection, the router's and the experts'; attention sinks


_INERT = frozenset(
    {
        "attention_dropout",
        "bos_token_id",
        "dtype",
        "eos_token_id",
        "hidden_act",
        "initializer_range",
        "max_position_embeddings",
        "pad_token_id",
        "rms_norm_eps",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "use_cache",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "norm_topk_prob",  # renormalising the top-k weights: no parameter, no size
        "sliding_window",  # attention over the whole sequence is planned (as Mistral's is)
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "clip_qkv",
    }
)
_ATTENTION = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "head_dim": None,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}

MOE_ARCHITECTURES = (
    MoEArchitecture(
        "MixtralConfig",
        "mixtral",
        {
            **_ATTENTION,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
        },
        _INERT,
    ),
    MoEArchitecture(
        "Qwen3MoeConfig",
        "qwen3_moe",
        {
            **_ATTENTION,
            "hidden_size": 2048,
            "num_hidden_layers": 24,
            "num_key_value_heads": 4,
            "vocab_size": 151936,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "decoder_sparse_step": 1,
            "mlp_only_layers": (),
            "attention_bias": False,
        },
        _INERT,
        qk_norm="head",
    ),
    MoEArchitecture(
        "Qwen2MoeConfig",
        "qwen2_moe",
        {
            **_ATTENTION,
            "hidden_size": 2048,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "vocab_size": 151936,
            "intermediate_size": 5632,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632,
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "decoder_sparse_step": 1,
            "mlp_only_layers": (),
        },
        _INERT | {"qkv_bias"},
        qkv_bias=True,
    ),
    MoEArchitecture(
        "OlmoeConfig",
        "olmoe",
        {
            **_ATTENTION,
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "vocab_size": 50304,
            "intermediate_size": 2048,
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "attention_bias": False,
        },
        _INERT,
        qk_norm="whole",
    ),
    MoEArchitecture(
        "GptOssConfig",
        "gpt_oss",
        {
            **_ATTENTION,
            "hidden_size": 2880,
            "num_hidden_layers": 36,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "vocab_size": 201088,
            "intermediate_size": 2880,
            "num_local_experts": 128,
            "num_experts_per_tok": 4,
            "attention_bias": True,
        },
        _INERT | {"swiglu_limit"},
        biased=True,
    ),
)
# What the planner does not model of other MoE families, said in one line where one is asked for.
REFUSED_MOE = {
    "deepseek_v2": "DeepSeek-V2's routing (its group-limited greedy top-k, softmax scores and device-limited "
    "balancing losses)",
    "llama4": "Llama 4's chunked attention, its layers without rotary embedding and its multimodal config",
    "llama4_text": "Llama 4's chunked attention and its layers without rotary embedding",
}


def moe_architecture(name: str) -> MoEArchitecture | None:
    """The MoE architecture `hf:<name>` names (a config class or a model type), or None."""
    return next((a for a in MOE_ARCHITECTURES if name in (a.config_class, a.model_type)), None)


def refuse_unmodelled(spec: str, model_type: str) -> None:
    from harness.plan.model.deepseek_shape import is_deepseek

    if is_deepseek(model_type):
        return
    what = REFUSED_MOE.get(model_type) or next(
        (why for key, why in REFUSED_MOE.items() if model_type.lower().startswith(key.split("_")[0] + "_v")), None
    )
    if what:
        raise PlanError(
            f"model {spec}: a mixture of experts with {what}: not modelled by the planner; plan "
            f"{', '.join(a.config_class for a in MOE_ARCHITECTURES)}, DeepseekV3Config or a zoo MoE preset"
        )


def plain_moe_kwargs(arch: MoEArchitecture, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """`kwargs` if every field is one this table knows, else None."""
    if any(k not in arch.defaults and k not in arch.inert for k in kwargs):
        return None
    return kwargs


def _unknown_fields(spec: str, arch: MoEArchitecture, kwargs: dict[str, Any]) -> None:
    unknown = sorted(k for k in kwargs if k not in arch.defaults and k not in arch.inert)
    if unknown:
        raise PlanError(
            f"model {spec}: {arch.config_class} field {', '.join(unknown)} is not one the planner reads: "
            f"give the sizes it knows ({', '.join(sorted(arch.defaults))})"
        )


def hf_moe_shape(spec: str, arch: MoEArchitecture, kwargs: dict[str, Any]) -> ModelShape:
    """The shape of `arch` with `kwargs` over its defaults, read from its sizes (transformers 5's
    module layout: every MoE block's router `gate` (E, H) beside stacked experts; Qwen2-MoE's shared
    expert and its one-unit gate; gpt-oss's biases and attention sinks)."""
    _unknown_fields(spec, arch, kwargs)
    given = whole_sizes(spec, arch.defaults, {k: v for k, v in kwargs.items() if k in arch.defaults})
    s = {**arch.defaults, **given}
    h, heads, layers = int(s["hidden_size"]), int(s["num_attention_heads"]), int(s["num_hidden_layers"])
    if h % heads and not s.get("head_dim"):
        raise PlanError(f"model {spec}: hidden_size must be a multiple of num_attention_heads (or give head_dim)")
    kv = int(s.get("num_key_value_heads") or heads)
    head_dim = int(s.get("head_dim") or h // heads)
    if heads % kv:
        raise PlanError(f"model {spec}: num_attention_heads={heads} must be a multiple of num_key_value_heads={kv}")
    experts = int(s.get("num_local_experts") or s.get("num_experts"))
    top_k = int(s["num_experts_per_tok"])
    expert_ffn = int(s.get("moe_intermediate_size") or s["intermediate_size"])
    shared = int(s.get("shared_expert_intermediate_size") or 0)
    step = int(s.get("decoder_sparse_step") or 1)
    dense_only = set(s.get("mlp_only_layers") or ())
    blocks = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
    q, kvw, f_dense = heads * head_dim, kv * head_dim, int(s["intermediate_size"])
    bias = arch.qkv_bias or bool(s.get("attention_bias"))
    named: list[tuple[str, tuple[int, ...], int | None]] = [("embed_tokens", (int(s["vocab_size"]), h), None)]
    for i in range(layers):
        if arch.biased:
            named.append(("self_attn.sinks", (heads,), i))
        for name, shape in (("q_proj", (q, h)), ("k_proj", (kvw, h)), ("v_proj", (kvw, h))):
            named.append((name, shape, i))
            if bias:
                named.append((f"{name}.bias", shape[:1], i))
        named.append(("o_proj", (h, q), i))
        if arch.biased:
            named.append(("o_proj.bias", (h,), i))
        if arch.qk_norm:
            width_q, width_k = (head_dim, head_dim) if arch.qk_norm == "head" else (q, kvw)
            named += [("q_norm", (width_q,), i), ("k_norm", (width_k,), i)]
        if blocks[i]:
            named.append(("mlp.gate", (experts, h), i))
            if arch.biased:
                named.append(("mlp.router.bias", (experts,), i))
            if shared:
                named += [
                    ("shared_expert.gate_proj", (shared, h), i),
                    ("shared_expert.up_proj", (shared, h), i),
                    ("shared_expert.down_proj", (h, shared), i),
                    ("shared_expert_gate", (1, h), i),
                ]
        else:
            named += [("gate_proj", (f_dense, h), i), ("up_proj", (f_dense, h), i), ("down_proj", (h, f_dense), i)]
        named += [("input_layernorm", (h,), i), ("post_attention_layernorm", (h,), i)]
    named.append(("norm", (h,), None))
    tied = bool(s["tie_word_embeddings"])
    if not tied:
        named.append(("lm_head", (int(s["vocab_size"]), h), None))
    dims = TransformerDims(
        layers,
        h,
        heads,
        head_dim,
        kv,
        0,
        int(s["vocab_size"]),
        gated_mlp=True,
        fused_qkv=False,
        rms_norm=True,
        rotary=True,
    )
    moe = MoEDims(
        experts,
        top_k,
        expert_ffn,
        blocks,
        shared_ffn=shared,
        dense_ffn=f_dense,
        expert_bias=arch.biased,
        clamped_swiglu=arch.biased,
    )
    return with_experts(_shape(spec, named, dims, tied_head=tied), moe)


def catalogue_moe_shape(spec: str, fields: dict[str, Any]) -> ModelShape | None:
    """A config.json's MoE model read offline, or None where its model_type is not a MoE architecture here."""
    model_type = str(fields.get("model_type"))
    refuse_unmodelled(spec, model_type)
    metadata = {"_name_or_path", "architectures", "auto_map", "model_type", "torch_dtype", "transformers_version"}
    given = {k: v for k, v in fields.items() if k not in metadata}
    from harness.plan.model.deepseek_shape import deepseek_shape, is_deepseek

    if is_deepseek(model_type):
        return deepseek_shape(spec, given)
    arch = moe_architecture(model_type)
    if arch is None:
        return None
    return hf_moe_shape(spec, arch, given)
