"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) as the planner holds it: its sizes, its
parameter tensors, its projections as tensor parallel splits them, and what it keeps for backward.

A block's attention (deepseek-ai/DeepSeek-V3 inference/model.py `MLA` @ 4c2fdb8; transformers'
DeepseekV3Attention; arXiv 2412.19437, Section 2.1.1), per token of width H over n heads:

  q   wq_a (q_lora x H) to a latent, RMSNorm q_norm, wq_b (n (nope + rope) x q_lora): each head's
      query, `nope` wide without position and `rope` wide with the rotary embedding
  kv  wkv_a (kv_lora + rope x H): a latent and one rotary key shared by every head; RMSNorm kv_norm
      on the latent; wkv_b (n (nope + v) x kv_lora): each head's key without position and its value
  o   wo (H x n v)

The attention itself runs each head's query and key at nope + rope (DeepSeek-V3: 192) and its value
at v (128): a forward of 2 T (nope + rope + v) multiply-adds per head and token of context, as two
equal heads of their mean width (160). Training expands the latent to every head (no absorption of
wkv_b into the query: that is the decoder's trick), so every weight is applied once per token.

Tensor parallel as Megatron-core runs it (megatron/core/transformer/multi_latent_attention.py @
d98e8a64, the TransformerEngine layer spec of gpt_layer_specs.py): the down-projections wq_a and
wkv_a are TELinear with `parallel_mode="duplicated"`, every GPU holding them whole and running them
on its sequence-parallel shard of the tokens (the same FLOPs as splitting their outputs); the
up-projections wq_b and wkv_b are column-parallel over the heads, gathering the latents (not the
H-wide hidden state) along the sequence, and wo row-parallel, as a GQA block's.

Saved for backward, per token: the hidden state read by wq_a and wkv_a (the block's attention input,
a copy per projection under autocast), each latent's RMSNorm (eager: its fp32 input, the normalised
tensor and 1/rms; a fused kernel or TransformerEngine's LayerNormColumnParallelLinear: its input and
1/rms) and the normalised latent the up-projection reads, then what the attention kernel keeps: q
and k at n (nope + rope), v at n v, its output at n v and the log-sum-exp. Megatron-core's
`mla_up_proj` recompute module (CheckpointWithoutOutput over the up-projections and the rotary
embedding) frees q, k and v once the kernel has run and rebuilds them from the latents in the
backward: the kernel's output and log-sum-exp stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.common.numbers import is_whole

if TYPE_CHECKING:
    from harness.plan.model.model_shape import TransformerDims

# The config fields that make an attention latent (transformers' DeepseekV3Config, DeepseekV2Config).
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# The down-projections, which Megatron-core's tensor parallel leaves whole on every GPU.
DOWN_PROJECTIONS = ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")
UP_PROJ_MODULE = "mla_up_proj"  # Megatron-core's recompute module for the up-projections and rotary


@dataclass(frozen=True)
class MLADims:
    """The latent attention's sizes (DeepSeek-V3: 1536, 512, 128, 64, 128)."""

    q_lora: int  # the query's latent; 0: queries projected from the hidden state directly (DeepSeek-V2-Lite)
    kv_lora: int  # the keys' and values' latent
    qk_nope: int  # a head's query and key width without position
    qk_rope: int  # a head's query and key width with the rotary embedding (the key's shared by every head)
    v_head: int  # a head's value width

    @property
    def qk_head(self) -> int:
        return self.qk_nope + self.qk_rope

    @property
    def latents(self) -> tuple[int, ...]:
        """The latents an up-projection reads (and an RMSNorm normalises)."""
        return (self.q_lora, self.kv_lora) if self.q_lora else (self.kv_lora,)

    def describe(self) -> str:
        q = f"q latent {self.q_lora}, " if self.q_lora else ""
        return (
            f"latent attention ({q}kv latent {self.kv_lora}, q/k heads {self.qk_nope}+{self.qk_rope}, "
            f"v heads {self.v_head})"
        )


def mla_tensors(width: int, heads: int, mla: MLADims, block: int) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, block) of one block's latent attention, in transformers' DeepseekV3Attention order."""
    out: list[tuple[str, tuple[int, ...], int]] = []
    if mla.q_lora:
        out += [
            ("self_attn.q_a_proj", (mla.q_lora, width), block),
            ("self_attn.q_a_layernorm", (mla.q_lora,), block),
            ("self_attn.q_b_proj", (heads * mla.qk_head, mla.q_lora), block),
        ]
    else:
        out.append(("self_attn.q_proj", (heads * mla.qk_head, width), block))
    return out + [
        ("self_attn.kv_a_proj_with_mqa", (mla.kv_lora + mla.qk_rope, width), block),
        ("self_attn.kv_a_layernorm", (mla.kv_lora,), block),
        ("self_attn.kv_b_proj", (heads * (mla.qk_nope + mla.v_head), mla.kv_lora), block),
        ("self_attn.o_proj", (width, heads * mla.v_head), block),
    ]


def mla_params(width: int, heads: int, mla: MLADims) -> int:
    """One block's latent attention's parameters."""
    return sum(math.prod(shape) for _, shape, _ in mla_tensors(width, heads, mla, 0))


def _shard(size: int, tp: int) -> int:
    return -(-size // tp)


def mla_projections(width: int, heads: int, mla: MLADims, tp: int) -> list[tuple[int, int]]:
    """(out, in) of the attention's matmuls in forward order, as one of `tp` GPUs runs them at the
    micro-batch's tokens: the down-projections whole on its sequence shard (written as their outputs
    split, the same FLOPs), the up-projections and wo split by heads (the module docstring)."""
    if mla.q_lora:
        queries = [(_shard(mla.q_lora, tp), width), (heads * mla.qk_head // tp, mla.q_lora)]
    else:
        queries = [(heads * mla.qk_head // tp, width)]
    down_kv = (_shard(mla.kv_lora + mla.qk_rope, tp), width)
    up_kv = (heads * (mla.qk_nope + mla.v_head) // tp, mla.kv_lora)
    out = (width, heads * mla.v_head // tp)
    return queries[:1] + [down_kv] + queries[1:] + [up_kv, out]


def up_projections(width: int, heads: int, mla: MLADims, tp: int) -> list[tuple[int, int]]:
    """(out, in) of the up-projections alone: what `mla_up_proj` runs again in the backward."""
    return [p for p in mla_projections(width, heads, mla, tp) if p[1] in mla.latents]


def tp_gathered_width(mla: MLADims) -> int:
    """What Megatron-core's sequence parallel gathers a token for the up-projections: the query's and
    the keys' latents and the shared rotary key (multi_latent_attention.py `_qkv_down_projection`,
    `gather_from_sequence_parallel_region(k_pos_emb)`), where a GQA block gathers the hidden state."""
    return sum(mla.latents) + mla.qk_rope


def attention_kept_per_token(heads: int, mla: MLADims, matmul: int, lse_bytes: int) -> int:
    """Bytes per token the attention kernel keeps over all heads: q and k at nope + rope, v, the
    output at v, and the fp32 log-sum-exp per head."""
    return heads * ((2 * mla.qk_head + 2 * mla.v_head) * matmul + lse_bytes)


def up_proj_freed_per_token(heads: int, mla: MLADims, matmul: int) -> int:
    """Of attention_kept_per_token, what `mla_up_proj` frees: q, k and v."""
    return heads * (2 * mla.qk_head + mla.v_head) * matmul


def latent_kept_per_token(mla: MLADims, matmul: int, projection_input: int, eager_norm: bool, stats: int) -> int:
    """Bytes per token the latents keep: each latent's RMSNorm (eager: its fp32 input and the normalised
    tensor, else its input; 1/rms) and the normalised latent its up-projection reads."""
    norm = sum(w * ((4 + matmul) if eager_norm else matmul) + stats for w in mla.latents)
    return norm + sum(mla.latents) * projection_input


def latent_width(dims: TransformerDims) -> int:
    """The latents' width together (0 without latent attention): what the up-projections read."""
    return sum(dims.mla.latents) if dims.mla is not None else 0


def rotary_elements(heads: int, mla: MLADims) -> int:
    """Elements the rotary embedding turns per token: each head's query's rope part and the one shared key."""
    return heads * mla.qk_rope + mla.qk_rope


def assembled_elements(heads: int, mla: MLADims) -> int:
    """Elements per token of the queries and keys assembled from their two parts (a copy each, the
    shared rotary key expanded to every head)."""
    return 2 * heads * mla.qk_head


def check_recomputed(name: str, dims: TransformerDims | None, modules: tuple[str, ...] | frozenset[str]) -> None:
    """`mla_up_proj` asked of a model without latent attention: one line, as Megatron-core refuses it."""
    from harness.plan.model.model_shape import PlanError

    if UP_PROJ_MODULE in modules and (dims is None or dims.mla is None):
        raise PlanError(
            f"recompute_modules={UP_PROJ_MODULE} recomputes latent attention's up-projections, and {name} has none: "
            "leave it out"
        )


def mla_of(fields: dict, spec: str) -> MLADims:
    """The latent attention a config's `fields` describe (transformers' names)."""
    from harness.plan.model.model_shape import PlanError

    values = {}
    for key in MLA_FIELDS:
        value = fields.get(key)
        if key == "q_lora_rank" and value is None:
            values[key] = 0
            continue
        if not is_whole(value):
            raise PlanError(f"model {spec}: {key}={value!r} must be a positive whole number")
        values[key] = value
    return MLADims(*(values[k] for k in MLA_FIELDS))
