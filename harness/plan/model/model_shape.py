"""A model's shape, which is all the planner needs: its parameter tensors (for sharding and
padding), its transformer sizes (for the matmuls, attention and activations) and N for 6N.

Read without torch where the sizes say everything: the zoo's GPT presets (models/gpt_config.py),
the Hugging Face architectures of hf_configs.py, and a bare description (layers=, width=,
heads=, kv_heads=, ffn=, vocab=, arch=, or params= alone). Anything else (a user's model by
import path, another `hf:` class, named blocks) is built on the meta device (model_build.py),
so a 70B model costs no memory either way. Public models are named from a catalogue
(model_catalogue.json) and Hugging Face config.json files read offline (hf_files.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.plan.model import hf_configs
from models.gpt_config import PRESETS, GPTConfig, check_sizes
from models.moe_config import MOE_PRESETS
from models.preset_settings import unknown_setting

if TYPE_CHECKING:
    from harness.plan.memory.activation_trace import ActivationTracer
    from harness.plan.model.mla_shape import MLADims
    from harness.plan.model.moe_shape import MoEDims

ARCHS = ("gpt", "llama")


class PlanError(ValueError):
    """A planning question that cannot be answered as asked (one line, says what to do)."""


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor (tied weights appear once)."""

    shape: tuple[int, ...]
    block: int | None  # index of the block holding it (models/blocks.py); None: the root (embeddings, final norm, head)
    tp_whole: bool = False  # a matrix tensor parallel leaves whole on every GPU (latent attention's down-projections)
    # A linear layer's bias (not a norm's): autograd reduces its gradient over the tokens in a kernel of its own.
    projection_bias: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class TransformerDims:
    layers: int
    width: int
    heads: int
    head_dim: int
    kv_heads: int
    ffn_width: int
    vocab: int
    gated_mlp: bool = False  # SwiGLU-style (gate and up projections) rather than one GELU MLP
    fused_qkv: bool = True  # one matmul makes q, k and v (GPT-2) rather than three (Llama)
    rms_norm: bool = False  # RMSNorm, which saves two tensors for backward where LayerNorm saves one
    rotary: bool = False  # rotary position embeddings applied to q and k in every block
    # Tensor parallel splits the embedding, the head and its loss by vocabulary, as Hugging Face's
    # and torchtitan's Llama plans do; parabench's GPT keeps its tied embedding and head whole.
    tp_splits_head: bool = True
    # A mixture of experts: its routed experts (moe_shape.py), the MLP width above then 0.
    moe: MoEDims | None = None
    # Multi-head latent attention (mla_shape.py): heads and kv_heads its n heads, head_dim its value width.
    mla: MLADims | None = None

    def head_split(self, tp: int) -> int:
        """How many ways tensor parallel splits the embedding, the head and the loss."""
        return tp if self.tp_splits_head else 1

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """A head's query and key width: the head dim the attention kernel is built for."""
        return self.mla.qk_head if self.mla else self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head if self.mla else self.head_dim

    @property
    def attention_dim(self) -> float:
        """The head width whose 4·T·d per head and token counts the attention's forward flops: the
        mean of the query-key and the value widths."""
        return (self.qk_head_dim + self.v_head_dim) / 2


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: int  # every parameter, tied ones counted once
    flops_params: int  # N of 6N: position embeddings left out
    dims: TransformerDims | None  # None for a model that is not a recognisable transformer
    tensors: tuple[ParamTensor, ...] | None  # None when only a parameter count was given
    note: str = ""  # how the shape was obtained where it was not read from a model, and what was assumed
    # Measures activations where no formula applies (dims is None); None where none can be traced.
    tracer: ActivationTracer | None = field(default=None, compare=False, repr=False)
    param_modules: int | None = None  # modules holding parameters directly (ZeRO-3 fetches each); None: unknown
    # Learned positions: (the model_kwargs key that sizes them, how many), the longest sequence the model
    # takes; None where it has no fixed limit (rotary or ALiBi positions) or it is not known.
    positions: tuple[str, int] | None = None

    def matrix_width(self) -> int | None:
        """The size most weight matrices share, as strategies/deepspeed_config.model_size counts it."""
        return self._matrix_width

    @functools.cached_property
    def _matrix_width(self) -> int | None:
        # Counted once per shape: DeepSpeed's sizing asks for it on every layout a plan weighs.
        if self.tensors is None:
            return self.dims.width if self.dims else None
        dims = Counter(d for t in self.tensors if len(t.shape) == 2 for d in t.shape)
        return dims.most_common(1)[0][0] if dims else None

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12·L·H·Q·T (PaLM appendix B), the same count the training loop uses for MFU (Q: latent
        attention's mean of its query-key and value head widths, mla_shape.py)."""
        attention = 0.0
        if self.dims is not None:
            attention = 12 * self.dims.layers * self.dims.heads * self.dims.attention_dim * seq_len
        return 6.0 * self.flops_params + attention

    def block_params(self) -> list[int]:
        """Parameters of each transformer block (the unit FSDP and ZeRO-3 gather at once)."""
        return list(self._block_counts)

    @functools.cached_property
    def _block_counts(self) -> tuple[int, ...]:
        # Counted once per shape: a plan asks for it many times, and a 405B model has over 1,000 tensors.
        if self.tensors is not None:
            counts: dict[int, int] = {}
            for t in self.tensors:
                if t.block is not None:
                    counts[t.block] = counts.get(t.block, 0) + t.numel
            return tuple(counts[i] for i in sorted(counts))
        if self.dims is None:
            return ()
        return ((self.params - self.root_params()) // self.dims.layers,) * self.dims.layers

    def root_params(self) -> int:
        """Parameters outside the blocks: embeddings, final norm, head (gathered for the whole step)."""
        if self.tensors is not None:
            return sum(t.numel for t in self.tensors if t.block is None)
        if self.dims is None:
            return self.params
        return self.dims.vocab * self.dims.width + self.dims.width


def _shape(
    name: str,
    named: list[tuple[str, tuple[int, ...], int | None]],
    dims: TransformerDims,
    *,
    positions: tuple[str, str] | None = None,
    tied_head: bool = False,
) -> ModelShape:
    """A shape from (name, tensor shape, block) triples in model.parameters() order; `positions`
    names the learned position embedding (no matmul flops, one row a position) and the model_kwargs
    key that sizes it, `tied_head` a head that shares the embedding (one tensor, but a module of its
    own that holds it)."""
    # The projections: a matrix named by its module ("q_proj") or its weight ("attn.c_attn.weight").
    matrices = {n.removesuffix(".weight") for n, shape, _ in named if len(shape) == 2}
    tensors = tuple(
        ParamTensor(shape, block, projection_bias=n.endswith(".bias") and n.removesuffix(".bias") in matrices)
        for n, shape, block in named
    )
    total = sum(t.numel for t in tensors)
    table, key = positions or (None, None)
    rows = [shape for n, shape, _ in named if n == table]
    skipped = sum(math.prod(shape) for shape in rows)
    modules = {n.removesuffix(".weight").removesuffix(".bias") + f"#{b}" for n, _, b in named}
    return ModelShape(
        name,
        total,
        total - skipped,
        dims,
        tensors,
        param_modules=len(modules) + tied_head,
        positions=(key, rows[0][0]) if key and rows else None,
    )


ZOO_POSITIONS = ("wpe.weight", "block_size")  # the zoo GPT's position embedding, and the size that sets it


def gpt_tensors(cfg: GPTConfig, kv_heads: int | None = None, ffn: int | None = None) -> list:
    """(name, shape, block) of the zoo's GPT (models/gpt.py) in model.parameters() order (its
    lm_head is tied to wte)."""
    h, bias = cfg.n_embd, cfg.bias
    kv = (kv_heads or cfg.n_head) * (h // cfg.n_head)
    f = ffn or 4 * h

    def linear(name: str, out: int, into: int, block: int) -> list:
        return [(f"{name}.weight", (out, into), block)] + ([(f"{name}.bias", (out,), block)] if bias else [])

    def norm(name: str, block: int | None) -> list:
        return [(f"{name}.weight", (h,), block)] + ([(f"{name}.bias", (h,), block)] if bias else [])

    out = [("wte.weight", (cfg.vocab_size, h), None), ("wpe.weight", (cfg.block_size, h), None)]
    for i in range(cfg.n_layer):
        out += norm("ln_1", i) + linear("attn.c_attn", h + 2 * kv, h, i) + linear("attn.c_proj", h, h, i)
        out += norm("ln_2", i) + linear("mlp.c_fc", f, h, i) + linear("mlp.c_proj", h, f, i)
    return out + norm("ln_f", None)


def _gpt_shape(name: str, cfg: GPTConfig, kv_heads: int | None = None, ffn: int | None = None) -> ModelShape:
    if cfg.n_embd % cfg.n_head:
        raise PlanError(f"width={cfg.n_embd} must be a multiple of heads={cfg.n_head}")
    dims = TransformerDims(
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_head,
        cfg.n_embd // cfg.n_head,
        kv_heads or cfg.n_head,
        ffn or 4 * cfg.n_embd,
        cfg.vocab_size,
        tp_splits_head=False,  # models/gpt.py's tensor-parallel plan splits the blocks only
    )
    return _shape(name, gpt_tensors(cfg, kv_heads, ffn), dims, positions=ZOO_POSITIONS, tied_head=True)


def _llama_dims(s: dict[str, Any], fused_qkv: bool = False) -> TransformerDims:
    return TransformerDims(
        s["num_hidden_layers"],
        s["hidden_size"],
        s["num_attention_heads"],
        s["head_dim"],
        s["num_key_value_heads"],
        s["intermediate_size"],
        s["vocab_size"],
        gated_mlp=True,
        fused_qkv=fused_qkv,
        rms_norm=True,
        rotary=True,
    )


PARALLEL_ATTENTION_NOTE = (
    "attention and MLP side by side from one norm (parallel_attn): planned as a block that runs them in "
    "sequence, which counts one more norm's activations"
)


def _falcon_shape(spec: str, s: dict[str, Any]) -> ModelShape:
    h, heads = s["hidden_size"], s["num_attention_heads"]
    if h % heads:
        raise PlanError(f"model {spec}: hidden_size={h} must be a multiple of num_attention_heads={heads}")
    kv = hf_configs.falcon_kv_heads(s)
    if heads % kv:
        raise PlanError(f"model {spec}: num_attention_heads={heads} must be a multiple of num_kv_heads={kv}")
    dims = TransformerDims(
        s["num_hidden_layers"], h, heads, h // heads, kv, s["ffn_hidden_size"], s["vocab_size"], rotary=not s["alibi"]
    )
    shape = _shape(spec, hf_configs.falcon_tensors(s), dims, tied_head=bool(s["tie_word_embeddings"]))
    return dataclasses.replace(shape, note=PARALLEL_ATTENTION_NOTE) if s["parallel_attn"] else shape


def whole_sizes(spec: str, defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` with each size a whole number: each field whose default is a number, or None (a size
    derived where unset, which may stay unset). A config.json's 4096.0 reads as 4096; 'abc', 1.5 or
    null is one line naming the field and `spec` (the file or config class), where the sizes'
    arithmetic would fail as a TypeError or truncate without a word. Each shape field given as a
    number is first checked to be positive (check_positive)."""
    check_positive(spec, defaults, given)
    sizes = dict(given)
    for key, value in given.items():
        default = defaults.get(key, "")
        if isinstance(default, bool) or not isinstance(default, (int, type(None))):
            continue  # a flag, a list, or a field the defaults do not hold: not a size
        if value is None and default is None:
            continue
        if isinstance(value, float) and value.is_integer():
            sizes[key] = int(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise PlanError(
                f"{key}={value!r} in {spec} must be a whole number: correct it in the config or model_kwargs"
            )
    return sizes


def check_positive(spec: str, defaults: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Every shape field given as a number is above zero, but for counts whose default is zero (dense
    layers before the experts); fields outside the shape (a dropout, an epsilon, a token id) may be 0."""
    for key, value in kwargs.items():
        if key not in defaults or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        default = defaults[key]
        if value <= 0 and not (isinstance(default, (int, float)) and default <= 0):
            raise PlanError(f"model {spec}: model_kwargs.{key}={value} must be positive")


def hf_shape(spec: str, arch: hf_configs.HFArchitecture, kwargs: dict[str, Any]) -> ModelShape:
    """The shape of `arch` with `kwargs` (its shape fields) over its defaults, read from its sizes."""
    s = arch.sizes(whole_sizes(spec, arch.defaults, kwargs))
    tied = bool(s["tie_word_embeddings"])
    if arch.family == "gpt2":
        h, heads = s["n_embd"], s["n_head"]
        if h % heads:
            raise PlanError(f"model {spec}: n_embd={h} must be a multiple of n_head={heads}")
        dims = TransformerDims(s["n_layer"], h, heads, h // heads, heads, s["n_inner"] or 4 * h, s["vocab_size"])
        return _shape(spec, hf_configs.gpt2_tensors(s), dims, positions=("wpe", "n_positions"), tied_head=tied)
    if arch.family == "falcon":
        return _falcon_shape(spec, s)
    if s["hidden_size"] % s["num_attention_heads"] and not kwargs.get("head_dim"):
        raise PlanError(f"model {spec}: hidden_size must be a multiple of num_attention_heads (or give head_dim)")
    if arch.family == "phi3":
        return _shape(spec, hf_configs.phi3_tensors(s), _llama_dims(s, fused_qkv=True), tied_head=tied)
    return _shape(spec, hf_configs.llama_tensors(s, arch.qkv_bias), _llama_dims(s), tied_head=tied)


def _preset_with(spec: str, preset: Any, kwargs: dict[str, Any]) -> Any:
    """A zoo preset's config with model_kwargs over it: an unknown key or a size out of range is one line."""
    why = unknown_setting(spec, preset, kwargs)
    if why is not None:
        raise PlanError(why)
    try:
        config = dataclasses.replace(preset, **kwargs)
    except TypeError as exc:
        raise PlanError(f"model {spec!r} rejected model_kwargs {kwargs}: {exc}") from None
    try:
        check_sizes(config)
    except ValueError as exc:
        raise PlanError(f"model {spec!r}: model_kwargs.{exc}") from None
    return config


def shape_of_spec(
    spec: str, model_kwargs: dict[str, Any] | None = None, block_names: list[str] | None = None
) -> ModelShape:
    """A zoo preset, a model of the catalogue, an `hf:` spec (a config class, a model type, or a
    config.json or the directory holding one) or an import path: read from its sizes where it
    can be, else built on the meta device."""
    from harness.plan.model import hf_files, model_catalogue

    kwargs = dict(model_kwargs or {})
    if not block_names and spec in MOE_PRESETS:
        from harness.plan.model.moe_shape import zoo_moe_shape

        return zoo_moe_shape(spec, _preset_with(spec, MOE_PRESETS[spec], kwargs))
    if not block_names and spec in PRESETS:
        return _gpt_shape(spec, _preset_with(spec, PRESETS[spec], kwargs))
    listed = model_catalogue.entry(spec)
    if listed is not None and listed.config:
        return hf_files.shape_of_fields(spec, {**listed.config, **kwargs}, block_names)
    config_file = hf_files.config_file(spec[3:]) if spec.startswith("hf:") else None
    if config_file is not None:
        return hf_files.shape_of_fields(spec, {**hf_files.read_config(spec, config_file), **kwargs}, block_names)
    if ":" not in spec:
        model_catalogue.check_known(spec)
    if spec.startswith("hf:") and not block_names:
        from harness.plan.model.deepseek_shape import deepseek_shape, is_deepseek
        from harness.plan.model.moe_shape import hf_moe_shape, moe_architecture

        if is_deepseek(spec[3:]):
            return deepseek_shape(spec, kwargs)
        moe = moe_architecture(spec[3:])
        if moe is not None:
            return hf_moe_shape(spec, moe, kwargs)
    arch = hf_configs.architecture(spec[3:]) if spec.startswith("hf:") and not block_names else None
    plain = hf_configs.plain_kwargs(arch, kwargs) if arch else None
    if arch is not None and plain is not None:
        return hf_shape(spec, arch, plain)
    from harness.plan.model.model_build import built_shape  # torch: only for what the sizes cannot say

    return built_shape(spec, kwargs, block_names)


GPT2_VOCAB = 50304
HEAD_DIM = 64  # GPT-2's head size, used when heads are not given
LLAMA_HEAD_DIM = 128
ASPECT_RATIO = 128  # width / layers of GPT-3's family (175B: 12288 / 96), used when only params are given
SWIGLU_MULTIPLE = 256  # Llama rounds its SwiGLU width (8/3 of the width) up to a multiple of this


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise PlanError(f"{name}={value} must be a positive number")


# One object per description: a plan's per-model caches (memory/model_states.py) key on the shape's
# tensors, so the published runs of one model (hundreds of rows) share their work, as a plan's
# searches over one shape do. The shape is frozen: sharing it changes no answer.
@functools.lru_cache(maxsize=256)
def shape_of_description(
    *,
    params: float | None,
    layers: int | None,
    width: int | None,
    heads: int | None,
    vocab: int | None,
    seq_len: int,
    kv_heads: int | None = None,
    ffn: int | None = None,
    arch: str = "gpt",
    biases: bool = False,
) -> ModelShape:
    """A transformer from its sizes: `arch=gpt` a GPT-2 block (LayerNorm, GELU MLP, fused qkv,
    learned positions, tied head), `arch=llama` a Llama block (RMSNorm, SwiGLU, q/k/v with
    kv_heads, rotary, untied head). From a parameter count alone: the model states exactly and a
    GPT-3-proportioned shape for the rest, said so in `note`. `biases`: a GPT whose every linear
    layer and norm carries a bias (Megatron-LM's GPT), a tensor of its own each."""
    for key, value in (
        ("params", params),
        ("layers", layers),
        ("width", width),
        ("heads", heads),
        ("vocab", vocab),
        ("kv_heads", kv_heads),
        ("ffn", ffn),
    ):
        _positive(key, value)
    if arch not in ARCHS:
        raise PlanError(f"arch={arch!r} is not one of {', '.join(ARCHS)}")
    if biases and arch != "gpt":
        raise PlanError(f"biases are described for arch=gpt only, not arch={arch!r}")
    vocab = int(vocab or GPT2_VOCAB)
    if layers is None and width is None:
        if params is None:
            raise PlanError(
                "no model given: set model=<zoo name|pkg.mod:fn|hf:ConfigClass>, or params=, or layers= and width="
            )
        return _shape_from_count(int(params), vocab, heads)
    if layers is None or width is None:
        raise PlanError(
            "a described model needs both layers= and width= (heads=, kv_heads=, ffn=, vocab= are optional)"
        )
    default_head = LLAMA_HEAD_DIM if arch == "llama" else HEAD_DIM
    heads = int(heads or max(1, width // default_head))
    if width % heads:
        raise PlanError(f"width={width} must be a multiple of heads={heads}")
    kv = int(kv_heads or heads)
    if heads % kv:
        raise PlanError(f"heads={heads} must be a multiple of kv_heads={kv} (each key/value head serves a group)")
    if arch == "llama":
        f = int(ffn or -(-(8 * width // 3) // SWIGLU_MULTIPLE) * SWIGLU_MULTIPLE)
        sizes = {
            "hidden_size": int(width),
            "intermediate_size": f,
            "num_hidden_layers": int(layers),
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": int(width) // heads,
            "vocab_size": vocab,
            "tie_word_embeddings": False,
        }
        name = f"llama(layers={layers}, width={width}, heads={heads}, kv_heads={kv}, ffn={f}, vocab={vocab})"
        shape = _shape(name, hf_configs.llama_tensors(sizes, False), _llama_dims(sizes))
    else:
        cfg = GPTConfig(
            n_layer=int(layers), n_head=heads, n_embd=int(width), vocab_size=vocab, block_size=seq_len, bias=biases
        )
        extra = "".join(f", {k}={v}" for k, v in (("kv_heads", kv_heads), ("ffn", ffn)) if v)
        extra += ", biases" if biases else ""
        shape = _gpt_shape(f"gpt(layers={layers}, width={width}, heads={heads}{extra}, vocab={vocab})", cfg, kv, ffn)
    if params is None:
        return shape
    # A count given beside the sizes wins for the model states; the sizes still shape the rest.
    return ModelShape(
        f"{params:.3g} params, {shape.name}",
        int(params),
        int(params),
        shape.dims,
        None,
        "parameter count as given; layer sizes as described",
        param_modules=shape.param_modules,
    )


def _shape_from_count(params: int, vocab: int, heads: int | None) -> ModelShape:
    def count(layers: int) -> int:
        width = ASPECT_RATIO * layers
        return 12 * layers * width * width + vocab * width

    layers = min(range(1, 1000), key=lambda n: abs(count(n) - params))
    width = ASPECT_RATIO * layers
    heads = int(heads or max(1, width // ASPECT_RATIO))
    dims = TransformerDims(layers, width, heads, width // heads, heads, 4 * width, vocab)
    note = (
        f"only a parameter count was given: layer sizes assumed GPT-3-proportioned "
        f"(layers={layers}, width={width}, heads={heads}, vocab={vocab}); give layers= and width= to fix them"
    )
    return ModelShape(f"{params:.3g} params", params, params, dims, None, note)
