"""A mixture of experts' memory beyond its dense part (moe_shape.py): the routed experts' parameters,
gradients and optimizer state on one GPU, their buffers, and the activations of the MoE and dense
FFNs of its blocks.

Model states: a GPU holds E / ep of every MoE block's experts, each split over etp GPUs (Megatron's
expert tensor parallel), and its strategy's engine keeps their states as it keeps the rest: torch's
replicate (ddp-ep) whole, ZeRO-1/2 (zero1-ep, zero2-ep) and Megatron's distributed optimizer sharded
over the edp GPUs holding the same experts (DeepSpeed's expert data-parallel group, Megatron's
`expert_data_parallel_group`), FSDP2 sharded over them (NeMo AutoModel: experts sharded over EP and
over dp_shard / EP more). They are priced by model_states.py on a shape of this GPU's expert
tensors, the states' group the edp GPUs, so each engine's own accounting holds for them too.

Activations, per token routed to an expert on this GPU (P = the GPU's tokens x top_k x etp assignments,
x the busiest GPU's load over the mean, `moe_imbalance`, capped by the capacity where tokens over it
drop, each expert at its capacity where padded): the permuted input (H), the gate and up projections'
outputs (2F / etp, the SwiGLU's input), the SwiGLU's output (F / etp, the down projection's input;
Megatron's fused SwiGLU recomputes it from its input, as the dense MLP's, activations.py), the expert's
output (H, kept for the probabilities' gradient in the combine; Megatron-core multiplies the
probabilities in its fused SwiGLU, `weighted_bias_swiglu`, and keeps none); per token the router's fp32 logits and
probabilities (2 x 4 E); the shared experts and the dense blocks' FFN as the dense MLP keeps its
(3 or 4 F / tp, tensor parallel splitting it). Checkpointing: `full` keeps each block's input (the
dense part's account) and rebuilds the heaviest block, experts included; `selective` keeps the
experts' gate and up outputs and recomputes the SwiGLU (torchtitan's policy saves the matmuls'
outputs); Megatron-core's `recompute_modules` (recipe.py) drop what each recomputes: `moe_act` the
SwiGLU's output, `moe` the whole MoE layer's activations but its input, `mlp` the dense and shared
FFNs', `layernorm` the norms' outputs (the projections' inputs the dense part counts), `mla_up_proj`
latent attention's q, k and v (mla_shape.py).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from harness.plan.memory.buffers import Buffers, backend_buffers
from harness.plan.memory.model_states import BYTES, model_states
from harness.plan.memory.recipe import Recipe
from harness.plan.model.mla_shape import UP_PROJ_MODULE, check_recomputed, up_proj_freed_per_token
from harness.plan.model.model_shape import ModelShape, ParamTensor, TransformerDims
from harness.plan.model.moe_shape import MoEDims
from harness.plan.network.fabric import Group
from harness.plan.parallel.backends import Backend
from harness.plan.parallel.expert_layout import ExpertLayout
from harness.plan.parallel.layout import Layout
from strategies.memory import CATEGORIES, MemoryBreakdown

ROUTER_BYTES_PER_EXPERT = 2 * 4  # fp32 logits and probabilities, per token and expert
CLAMPED_SWIGLU_SAVED = 6  # gpt-oss: gate and up, their clamped copies, the sigmoid's output, the product
# Megatron-core's weighted_bias_quick_geglu_impl (megatron/core/fusions/fused_bias_geglu.py @ d98e8a64): the clamps
# keep the gate and up projections' output, the fused kernel its clamped, concatenated input, the down projection
# the product.
MEGATRON_CLAMPED_SAVED = 5
FP8_BYTES = 1


def _matmul_bytes(precision: str) -> int:
    """What the FFNs' matmuls read and write per element: bf16 under autocast, FSDP's policy and DeepSpeed."""
    return BYTES[precision]


@functools.lru_cache(maxsize=64)
def expert_shape(moe: MoEDims, width: int, ep: int, etp: int) -> ModelShape:
    """This GPU's routed experts as a shape of their own: per MoE block its E / ep experts' gate and
    up projections stacked (E/ep x 2F/etp, H) and down projections (E/ep x H, F/etp), biases beside."""
    local, f = moe.experts // ep, moe.expert_ffn // etp
    tensors: list[ParamTensor] = []
    for index, routed in enumerate(moe.blocks):
        if not routed:
            continue
        tensors += [ParamTensor((local * 2 * f, width), index), ParamTensor((local * width, f), index)]
        if moe.expert_bias:
            tensors += [ParamTensor((local * 2 * f,), index), ParamTensor((local * width,), index)]
    params = sum(t.numel for t in tensors)
    return ModelShape(f"routed experts ({local} of {moe.experts} a block)", params, params, None, tuple(tensors))


def expert_states_layout(experts: ExpertLayout) -> Layout:
    """The layout the experts' states follow: sharded (or replicated) over the edp GPUs holding the same experts."""
    one = Group(1, 1)
    return Layout(1, experts.edp, 1, 1, experts.edp_group, one, one, one)


def expert_states(
    shape: ModelShape, backend: Backend, precision: str, experts: ExpertLayout, recipe: Recipe
) -> MemoryBreakdown | None:
    """The routed experts' parameters, gradients and optimizer state on one GPU, where they are held
    apart from the rest of the model (an expert-parallel strategy: their own groups); None for a dense
    model, or where the strategy holds them among the rest (with_experts_held)."""
    dims = shape.dims
    if dims is None or dims.moe is None or not dims.moe.moe_layers or not backend.expert_parallel:
        return None
    mine = expert_shape(dims.moe, dims.width, experts.ep, experts.etp)
    return model_states(mine, backend, precision, experts.edp, 1, 1, recipe)


_HELD: dict[int, tuple[ModelShape, ModelShape]] = {}


def with_experts_held(shape: ModelShape) -> ModelShape:
    """_with_experts_held, kept per shape: a search asks for it for every layout."""
    hit = _HELD.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    if len(_HELD) >= 16:
        _HELD.clear()
    held = _with_experts_held(shape)
    _HELD[id(shape)] = (shape, held)
    return held


def _with_experts_held(shape: ModelShape) -> ModelShape:
    """`shape` with every routed expert among its tensors, each block's stacked experts after its router
    (an (E, H) matrix), as a strategy without expert parallel holds them: in the same flat groups and
    units as the rest (DeepSpeed's ZeRO-1/2 partitions, torch's ZeRO-1, FSDP's blocks)."""
    dims = shape.dims
    if dims is None or dims.moe is None or shape.tensors is None or not dims.moe.moe_layers:
        return shape
    moe = dims.moe
    every = expert_shape(moe, dims.width, 1, 1).tensors or ()
    by_block: dict[int, list[ParamTensor]] = {}
    for t in every:
        by_block.setdefault(t.block, []).append(t)
    tensors: list[ParamTensor] = []
    for t in shape.tensors:
        tensors.append(t)
        if t.block in by_block and t.shape == (moe.experts, dims.width):
            tensors += by_block.pop(t.block)
    tensors += [t for rest in by_block.values() for t in rest]
    params = sum(t.numel for t in tensors)
    return dataclasses.replace(shape, tensors=tuple(tensors), params=params)


def added(a: MemoryBreakdown, b: MemoryBreakdown | None) -> MemoryBreakdown:
    if b is None:
        return a
    merged = {}
    for c in CATEGORIES:
        x, y = getattr(a, c), getattr(b, c)
        merged[c] = {device: x.get(device, 0) + y.get(device, 0) for device in {*x, *y}}
    return MemoryBreakdown(**merged)


def expert_buffers(
    shape: ModelShape,
    backend: Backend,
    precision: str,
    experts: ExpertLayout,
    grad_accum: int,
    recipe: Recipe,
    tokens: float = 0.0,
) -> Buffers:
    """The engine's buffers for an expert-parallel strategy's experts (their gathered blocks, autocast's
    copies, the step's fp32 partition), each named as theirs; the reduction bucket is the one the rest of
    the model fills. One block's exchange is in flight at a time: its `tokens` (this GPU's, after sequence
    parallel's split) x top_k x H sent and as many received. A strategy without expert parallel holds
    them among the rest (with_experts_held)."""
    dims = shape.dims
    if dims is None or dims.moe is None or not dims.moe.moe_layers or not backend.expert_parallel:
        return Buffers()
    mine = expert_shape(dims.moe, dims.width, experts.ep, experts.etp)
    own = backend_buffers(mine, backend, precision, expert_states_layout(experts), grad_accum, 0, recipe)
    backward = {f"experts: {k}": v for k, v in own.backward.items()}
    # DeepSpeed's reduction bucket is the one the rest of the model fills; a torch engine's block
    # gradients are the experts' own, made in the same block's backward as the rest's.
    hooks = {} if backend.engine == "deepspeed" else {f"experts: {k}": v for k, v in own.hooks.items()}
    step = {f"experts: {k}": v for k, v in own.step.items()}
    if experts.ep > 1:  # one block's exchange in flight: what it sends and what it receives
        sent = tokens * dims.moe.top_k * dims.width * BYTES[precision]
        load = dims.moe.busiest_load(recipe.moe_imbalance)  # padded: every expert's capacity sent and received
        backward["all-to-all send and receive buffers of one block"] = int(2 * sent * load)
    return Buffers(backward=backward, hooks=hooks, step=step)


@dataclass(frozen=True)
class ExpertActivations:
    """Bytes one micro-step's FFNs keep on one GPU beyond the dense part's account."""

    kept: int  # every block's, alive at the start of backward (checkpointing: what the policy keeps)
    rebuilt: int  # the heaviest block's, rebuilt in the backward beyond what the dense part rebuilds
    dropped: int = 0  # what recompute_modules' layernorm drops of the dense part's account (negative there)


def routed_pairs(moe: MoEDims, tokens: float, experts: ExpertLayout, imbalance: float) -> float:
    """Token-expert assignments the busiest GPU computes in one MoE block of a micro-step: its `tokens`
    (after sequence parallel's split) times top-k, gathered over etp, at the busiest GPU's load
    (moe_shape.busiest_load: padded to the capacity, or capped by it where tokens over it drop)."""
    local = moe.experts // experts.ep
    sent = tokens * experts.etp * experts.ep  # the tokens of the GPUs sending to this one
    if moe.capacity is not None and moe.padded:
        return local * moe.tokens_per_expert(sent)
    return sent * moe.top_k / experts.ep * moe.busiest_load(imbalance)


def ffn_bytes(
    dims: TransformerDims,
    *,
    tokens: float,
    tp: int,
    experts: ExpertLayout,
    precision: str,
    mixed_precision: str,
    megatron: bool,
    fp8_inputs: bool,
    imbalance: float,
    recompute: frozenset[str],
) -> tuple[float, float, float]:
    """(an MoE block's, a dense block's, the routed experts' share of an MoE block) bytes kept, for one
    micro-batch of `tokens` tokens on a `tp`-way group (sequence parallel splitting the router's and
    the routed experts' tokens), with Megatron's `recompute` modules dropped."""
    moe = dims.moe
    assert moe is not None
    a = _matmul_bytes(precision)
    h = dims.width
    swiglu = 3 if megatron else 4  # gate, up (and SiLU's output eager), the product
    # gpt-oss's clamped SwiGLU keeps its clamped gate and up, the sigmoid's output and the product too;
    # recomputing the experts' activation (moe_act) keeps the gate and up projections' output alone
    routed_swiglu = swiglu
    if moe.clamped_swiglu:
        routed_swiglu = MEGATRON_CLAMPED_SAVED if megatron else CLAMPED_SWIGLU_SAVED
    if "moe_act" in recompute:
        routed_swiglu = 2
    local_tokens = tokens / tp
    pairs = routed_pairs(moe, local_tokens, experts, imbalance)
    f = moe.expert_ffn / experts.etp
    expert_input = FP8_BYTES if fp8_inputs else a
    intermediate = routed_swiglu * f * a
    # The experts' outputs, kept for the routing weights' gradient where the weights multiply them in the
    # combine (the zoo's, transformers'); Megatron-core applies them inside the fused SwiGLU instead.
    weighted_output = 0 if megatron else a * h
    routed = pairs * (expert_input * h + intermediate + weighted_output)
    router = local_tokens * ROUTER_BYTES_PER_EXPERT * moe.experts
    shared = tokens * swiglu * moe.shared_ffn / tp * a
    if "moe" in recompute:
        routed, router = 0.0, 0.0
    if "mlp" in recompute:
        shared = 0.0
    dense_width = swiglu if moe.dense_gated else 2
    dense = 0.0 if "mlp" in recompute else tokens * dense_width * moe.dense_ffn / tp * a
    return routed + router + shared, dense, routed


def expert_activations(
    shape: ModelShape,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int,
    experts: ExpertLayout,
    precision: str,
    mixed_precision: str,
    checkpointing: str,
    megatron: bool,
    sequence_parallel: bool,
    recipe: Recipe,
) -> ExpertActivations | None:
    """The FFNs' activations of one micro-batch on one GPU (the module's account); None for a dense model."""
    dims = shape.dims
    if dims is None or dims.moe is None:
        return None
    moe = dims.moe
    tokens = micro_batch * seq_len
    recompute = frozenset(recipe.recompute_modules)
    kwargs = dict(
        tokens=tokens,
        tp=tp,
        experts=experts,
        precision=precision,
        mixed_precision=mixed_precision,
        megatron=megatron,
        fp8_inputs=recipe.fp8_saved_inputs,
        imbalance=recipe.moe_imbalance,
    )
    moe_block, dense_block, routed = ffn_bytes(dims, recompute=recompute, **kwargs)
    whole_moe, whole_dense, whole_routed = ffn_bytes(dims, recompute=frozenset(), **kwargs)
    heaviest = max(whole_moe if moe.moe_layers else 0.0, whole_dense if moe.dense_layers else 0.0)
    dropped = 0
    if "layernorm" in recompute:  # the attention's and the MLP's inputs, the norms' outputs
        a = _matmul_bytes(precision)
        split = tp if (megatron and sequence_parallel) else 1
        dropped = int(dims.layers * 2 * dims.width * a * tokens / split)
    check_recomputed(shape.name, dims, recompute)
    if UP_PROJ_MODULE in recompute:  # q, k and v freed once the attention has run (mla_shape.py)
        freed = up_proj_freed_per_token(dims.heads, dims.mla, _matmul_bytes(precision))
        dropped += int(dims.layers * freed * tokens / tp)
    if checkpointing == "full":
        return ExpertActivations(0, int(heaviest))
    if checkpointing == "selective":
        # The SwiGLU recomputed: its output (F a token-expert pair) dropped, one block's rebuilt.
        a = _matmul_bytes(precision)
        pairs = routed_pairs(moe, tokens / tp, experts, recipe.moe_imbalance)
        saved = pairs * moe.expert_ffn / experts.etp * a
        kept = moe.moe_layers * (moe_block - saved) + moe.dense_layers * dense_block
        return ExpertActivations(int(kept), int(saved), dropped)
    kept = moe.moe_layers * moe_block + moe.dense_layers * dense_block
    rebuilt = max(whole_moe - moe_block, whole_dense - dense_block) if recompute else 0.0
    return ExpertActivations(int(kept), int(rebuilt), dropped)
