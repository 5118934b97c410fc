"""The Hugging Face architectures the planner reads without importing transformers (which
imports torch: 2-7 s a plan): each config class's default sizes as transformers 5 sets them,
and the parameter tensors its causal LM builds from them, in the model's own order.

An `hf:` spec of a class listed here, with model_kwargs this table knows, is planned from
these; any other (another class, or a field not listed) is built on the meta device as
before. tests/plan/model/test_model_shape.py and test_catalogue.py hold every entry to the real config
class and the real model built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Fields that change no parameter and no size the planner models, as transformers 5 names them
# for each family: accepted as given.
_COMMON_INERT = frozenset(
    {
        "attention_dropout",
        "bos_token_id",
        "dtype",
        "eos_token_id",
        "hidden_act",  # the gated MLP's activation (SiLU, GELU): the same matmuls and saved tensors
        "initializer_range",
        "max_position_embeddings",
        "pad_token_id",
        "rms_norm_eps",
        "rope_parameters",
        "use_cache",
    }
)
GPT2_INERT = frozenset(
    {
        "attn_pdrop",
        "bos_token_id",
        "dtype",
        "embd_pdrop",
        "eos_token_id",
        "initializer_range",
        "layer_norm_epsilon",
        "max_position_embeddings",
        "pad_token_id",
        "resid_pdrop",
        "use_cache",
    }
)


@dataclass(frozen=True)
class HFArchitecture:
    """A config class: its defaults and the layout of the model it builds."""

    config_class: str
    model_type: str
    defaults: dict[str, Any]  # the shape fields, as the class sets them when not given
    # "llama": RMSNorm, SwiGLU, q/k/v/o, rotary; "phi3": the same with q/k/v and gate/up fused;
    # "falcon": LayerNorm, GELU, fused qkv (multi-query), attention beside the MLP, rotary;
    # "gpt2": LayerNorm, GELU, fused qkv (Conv1D), learned positions.
    family: str
    inert: frozenset[str]  # the class's other fields, which shape nothing the planner models
    qkv_bias: bool = False

    def sizes(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The shape fields with `kwargs` over the defaults, derived ones filled in as the class does."""
        s = {**self.defaults, **{k: v for k, v in kwargs.items() if k in self.defaults}}
        if self.family in ("llama", "phi3"):
            s["num_key_value_heads"] = s.get("num_key_value_heads") or s["num_attention_heads"]
            s["head_dim"] = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
        if self.family == "falcon":
            s["num_kv_heads"] = s.get("num_kv_heads") or s["num_attention_heads"]
            s["ffn_hidden_size"] = s.get("ffn_hidden_size") or 4 * s["hidden_size"]
            if s.get("num_ln_in_parallel_attn") is None and s["new_decoder_architecture"]:
                s["num_ln_in_parallel_attn"] = 2
        return s


_LLAMA = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "head_dim": None,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}

ARCHITECTURES = (
    HFArchitecture("LlamaConfig", "llama", _LLAMA, "llama", _COMMON_INERT | {"pretraining_tp"}),
    HFArchitecture(
        "MistralConfig",
        "mistral",
        {
            **{k: v for k, v in _LLAMA.items() if k not in ("attention_bias", "mlp_bias")},
            "intermediate_size": 14336,
            "num_key_value_heads": 8,
        },
        "llama",
        _COMMON_INERT | {"sliding_window"},
    ),
    HFArchitecture(
        "Qwen2Config",
        "qwen2",
        {
            **{k: v for k, v in _LLAMA.items() if k not in ("attention_bias", "mlp_bias", "head_dim")},
            "intermediate_size": 22016,
            "num_key_value_heads": 32,
            "vocab_size": 151936,
        },
        "llama",
        _COMMON_INERT | {"sliding_window", "use_sliding_window"},
        qkv_bias=True,
    ),
    HFArchitecture(
        "Phi3Config",
        "phi3",
        {
            **{k: v for k, v in _LLAMA.items() if k not in ("attention_bias", "mlp_bias", "head_dim")},
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "vocab_size": 32064,
        },
        "phi3",
        _COMMON_INERT | {"embd_pdrop", "original_max_position_embeddings", "resid_pdrop", "sliding_window"},
    ),
    HFArchitecture(
        "GemmaConfig",
        "gemma",
        {
            **{k: v for k, v in _LLAMA.items() if k != "mlp_bias"},
            "hidden_size": 3072,
            "intermediate_size": 24576,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "vocab_size": 256000,
            "tie_word_embeddings": True,
        },
        "llama",
        _COMMON_INERT | {"use_bidirectional_attention"},
    ),
    HFArchitecture(
        "FalconConfig",
        "falcon",
        {
            "hidden_size": 4544,
            "num_hidden_layers": 32,
            "num_attention_heads": 71,
            "num_kv_heads": None,
            "multi_query": True,
            "new_decoder_architecture": False,
            "parallel_attn": True,
            "num_ln_in_parallel_attn": None,
            "bias": False,
            "alibi": False,
            "ffn_hidden_size": None,
            "vocab_size": 65024,
            "tie_word_embeddings": True,
        },
        "falcon",
        (_COMMON_INERT - {"hidden_act", "rms_norm_eps"}) | {"activation", "hidden_dropout", "layer_norm_epsilon"},
    ),
    HFArchitecture(
        "GPT2Config",
        "gpt2",
        {
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_inner": None,
            "n_positions": 1024,
            "vocab_size": 50257,
            "tie_word_embeddings": True,
        },
        "gpt2",
        GPT2_INERT,
    ),
)

# transformers' attribute_map: the common names GPT2Config also answers to.
ALIASED_FIELDS = {
    "gpt2": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
}


def architecture(name: str) -> HFArchitecture | None:
    """The table's entry for `hf:<name>` (a config class or a model type), or None."""
    return next((a for a in ARCHITECTURES if name in (a.config_class, a.model_type)), None)


def plain_kwargs(arch: HFArchitecture, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """`kwargs` with aliased names resolved, or None where one is not in this table (then the
    real config class must judge it)."""
    aliases = ALIASED_FIELDS.get(arch.family, {})
    resolved = {aliases.get(k, k): v for k, v in kwargs.items()}
    if any(k not in arch.defaults and k not in arch.inert for k in resolved):
        return None
    return resolved


def llama_tensors(s: dict[str, Any], qkv_bias: bool) -> list[tuple[str, tuple[int, ...], int | None]]:
    """(name, shape, block) of LlamaForCausalLM's parameters, in model.parameters() order."""
    h, f, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    bias = qkv_bias or bool(s.get("attention_bias"))
    out: list[tuple[str, tuple[int, ...], int | None]] = [("embed_tokens", (s["vocab_size"], h), None)]
    for i in range(layers):
        attention = [("q_proj", (q, h)), ("k_proj", (kv, h)), ("v_proj", (kv, h))]
        for name, shape in attention:
            out.append((name, shape, i))
            if bias:
                out.append((f"{name}.bias", shape[:1], i))
        out.append(("o_proj", (h, q), i))
        if s.get("attention_bias"):
            out.append(("o_proj.bias", (h,), i))
        for name, shape in (("gate_proj", (f, h)), ("up_proj", (f, h)), ("down_proj", (h, f))):
            out.append((name, shape, i))
            if s.get("mlp_bias"):
                out.append((f"{name}.bias", shape[:1], i))
        out += [("input_layernorm", (h,), i), ("post_attention_layernorm", (h,), i)]
    out.append(("norm", (h,), None))
    if not s["tie_word_embeddings"]:
        out.append(("lm_head", (s["vocab_size"], h), None))
    return out


def phi3_tensors(s: dict[str, Any]) -> list[tuple[str, tuple[int, ...], int | None]]:
    """(name, shape, block) of Phi3ForCausalLM's parameters: Llama's, with q/k/v in one matrix and
    gate/up in another (its attention defines o_proj first)."""
    h, f, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    out: list[tuple[str, tuple[int, ...], int | None]] = [("embed_tokens", (s["vocab_size"], h), None)]
    for i in range(layers):
        out += [
            ("o_proj", (h, q), i),
            ("qkv_proj", (q + 2 * kv, h), i),
            ("gate_up_proj", (2 * f, h), i),
            ("down_proj", (h, f), i),
            ("input_layernorm", (h,), i),
            ("post_attention_layernorm", (h,), i),
        ]
    out.append(("norm", (h,), None))
    if not s["tie_word_embeddings"]:
        out.append(("lm_head", (s["vocab_size"], h), None))
    return out


def falcon_kv_heads(s: dict[str, Any]) -> int:
    """The key/value heads Falcon's attention runs: num_kv_heads in the new decoder, one for
    multi-query, else one per query head."""
    if s["new_decoder_architecture"]:
        return s["num_kv_heads"]
    return 1 if s["multi_query"] else s["num_attention_heads"]


def falcon_tensors(s: dict[str, Any]) -> list[tuple[str, tuple[int, ...], int | None]]:
    """(name, shape, block) of FalconForCausalLM's parameters: fused qkv, attention and MLP read
    one or two LayerNorms (parallel_attn), a post-attention norm where they run in sequence."""
    h, heads, f = s["hidden_size"], s["num_attention_heads"], s["ffn_hidden_size"]
    qkv = (
        (heads + 2 * falcon_kv_heads(s)) * (h // heads) if s["new_decoder_architecture"] or s["multi_query"] else 3 * h
    )
    if not s["parallel_attn"]:
        norms = ["post_attention_layernorm", "input_layernorm"]
    elif s["num_ln_in_parallel_attn"] == 2:
        norms = ["ln_attn", "ln_mlp"]
    else:
        norms = ["input_layernorm"]
    out: list[tuple[str, tuple[int, ...], int | None]] = [("word_embeddings", (s["vocab_size"], h), None)]
    for i in range(s["num_hidden_layers"]):
        for name, shape in (
            ("query_key_value", (qkv, h)),
            ("dense", (h, h)),
            ("dense_h_to_4h", (f, h)),
            ("dense_4h_to_h", (h, f)),
        ):
            out.append((f"{name}.weight", shape, i))
            if s["bias"]:
                out.append((f"{name}.bias", shape[:1], i))
        out += [(f"{norm}.{part}", (h,), i) for norm in norms for part in ("weight", "bias")]
    out += [("ln_f.weight", (h,), None), ("ln_f.bias", (h,), None)]
    if not s["tie_word_embeddings"]:
        out.append(("lm_head", (s["vocab_size"], h), None))
    return out


def gpt2_tensors(s: dict[str, Any]) -> list[tuple[str, tuple[int, ...], int | None]]:
    """(name, shape, block) of GPT2LMHeadModel's parameters (Conv1D weights are (in, out))."""
    h, layers = s["n_embd"], s["n_layer"]
    f = s["n_inner"] or 4 * h
    out: list[tuple[str, tuple[int, ...], int | None]] = [
        ("wte", (s["vocab_size"], h), None),
        ("wpe", (s["n_positions"], h), None),
    ]
    for i in range(layers):
        for name, shape in (
            ("ln_1.weight", (h,)),
            ("ln_1.bias", (h,)),
            ("c_attn.weight", (h, 3 * h)),
            ("c_attn.bias", (3 * h,)),
            ("attn.c_proj.weight", (h, h)),
            ("attn.c_proj.bias", (h,)),
            ("ln_2.weight", (h,)),
            ("ln_2.bias", (h,)),
            ("c_fc.weight", (h, f)),
            ("c_fc.bias", (f,)),
            ("mlp.c_proj.weight", (f, h)),
            ("mlp.c_proj.bias", (h,)),
        ):
            out.append((name, shape, i))
    out += [("ln_f.weight", (h,), None), ("ln_f.bias", (h,), None)]
    if not s["tie_word_embeddings"]:
        out.append(("lm_head", (s["vocab_size"], h), None))
    return out
