"""The Hugging Face architectures the planner reads without importing transformers (which
imports torch: 2-7 s a plan): each config class's default sizes as transformers 5 sets them,
and the parameter tensors its causal LM builds from them, in the model's own order.

An `hf:` spec of a class listed here, with model_kwargs this table knows, is planned from
these; any other (another class, or a field not listed) is built on the meta device as
before. tests/plan/test_model_shape.py holds every entry to the real config class and the
real model built from it.
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
    # "llama": RMSNorm, SwiGLU, q/k/v/o, rotary; "gpt2": LayerNorm, GELU, fused qkv (Conv1D), learned positions.
    family: str
    inert: frozenset[str]  # the class's other fields, which shape nothing the planner models
    qkv_bias: bool = False

    def sizes(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The shape fields with `kwargs` over the defaults, derived ones filled in as the class does."""
        s = {**self.defaults, **{k: v for k, v in kwargs.items() if k in self.defaults}}
        if self.family == "llama":
            s["num_key_value_heads"] = s.get("num_key_value_heads") or s["num_attention_heads"]
            s["head_dim"] = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
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
