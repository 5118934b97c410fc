"""A mixture of experts' compute beyond its dense part (moe_shape.py), per micro-step on one GPU:
the router, the routed experts, the shared experts and the dense blocks' FFN, and the experts'
optimizer step.

Routed experts: the busiest GPU's assignments (expert_memory.routed_pairs: its tokens x top_k x etp, x
`moe_imbalance`, capped by a capacity that drops, at the capacity where padded: moe_shape.busiest_load),
m = P / (E / ep) a local expert, each local expert's matmuls on its own: the gate and up projections (m
x 2F/etp x H), the down projection (m x H x F/etp), each backward its input's and its weight's gradient,
timed by gemm.py's model at its shape with its own launch. That is how every path here runs them: TransformerEngine's
GroupedLinear under Megatron-core's `--moe-grouped-gemm` launches "multiple local GEMM kernels in
multiple streams" (megatron/core/transformer/moe/README.md), the zoo's and transformers' experts a
loop of matmuls. A single grouped kernel would be no faster at the same shapes: MegaBlocks' grouped
block-sparse kernels ran at 98.6% of cuBLAS's batched matmul over the same problems (std 4%,
91-104%; Gale et al. 2022, arXiv 2211.15841, section 6.1). Under fp8 they run as the blocks'
projections do (compute.py), with their casts (TransformerEngine's where te_fp8).

Around them, memory-bound work at the card's bandwidth (compute.py's MEMORY_EFFICIENCY): the
router's softmax and top-k over E fp32 logits a token, the tokens copied into expert order and back
(PERMUTATION_PASSES, a read and a write of H a token-expert pair each, forward and backward), the
SwiGLU over each pair as compute.py counts a gated MLP's (eager 5F / 9F bytes, fused 3F / 5F). The
shared experts and the dense FFN run as a dense MLP split over tensor parallel.

Recomputation: full checkpointing runs every FFN's forward again; torchtitan's selective policy the
experts' SwiGLU; Megatron-core's recompute_modules what each names (`moe_act` the SwiGLU, `moe` the
MoE layer's forward, its all-to-alls included: expert_comm.py, `mlp` the dense and shared FFNs,
`layernorm` the norms, `core_attn` the attention kernel's forward, `mla_up_proj` latent attention's
up-projections and rotary embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.common.hardware import GPUSpec
from harness.plan.memory.expert_memory import expert_shape, routed_pairs
from harness.plan.memory.model_states import BYTES
from harness.plan.memory.recipe import Recipe
from harness.plan.model.mla_shape import UP_PROJ_MODULE, assembled_elements, rotary_elements, up_projections
from harness.plan.model.model_shape import ModelShape
from harness.plan.model.moe_shape import MoEDims
from harness.plan.parallel.expert_layout import ExpertLayout
from harness.plan.speed.attention import every_layer_attention_seconds
from harness.plan.speed.compute import (
    FP8_CAST_BYTES,
    FP8_WEIGHT_BYTES,
    OPTIMIZER_BYTES,
    TE_CAST_BYTES,
    ComputeWork,
    Kernels,
    memory_bytes_per_s,
)
from harness.plan.speed.gemm import LOW_PRECISION, gemm_seconds
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL

# Copies of the token-expert pairs a block's forward makes (its backward as many), by the code that runs
# them. Megatron-core's alltoall dispatcher (token_dispatcher.py): the permutation into expert order and
# back, and where a GPU holds several experts, "Permutation 2: Sort tokens by local expert" after the
# exchange and its inverse before the return (moe_utils.sort_chunks_by_idxs). The zoo's SwiGLUExperts
# (models/routing.py): the tokens gathered in expert order, the experts' outputs concatenated, weighted
# and index-added back; expert parallel (models/expert_parallel.py) gathers them for the exchange and
# weights and index-adds the returned ones besides.
PERMUTATION_PASSES = {"megatron": 2, "megatron-local-sort": 4, "loop": 4, "loop-dispatched": 6}
# A published run whose MoE layer is Megatron-core's on another engine: NeMo AutoModel's GroupedExpertsDeepEP
# (nemo_automodel/components/moe/layers.py @ 89e3a9fd) runs Megatron-core's flex token dispatcher with
# moe_permute_fusion, its fused weighted SwiGLU (weighted_bias_swiglu_impl) and one grouped matmul a projection
# (grouped_gemm's gmm), so its copies, kernels and activations are planned as that layer's (`megatron`).
MEGATRON_MOE_LAYER = "megatron_moe_layer"
ROUTER_BYTES_PER_LOGIT = (
    4 + 4 + 4 + 4,
    4 + 4 + 4,
)  # fp32 logits written, softmax read and written, top-k read; backward


@dataclass(frozen=True)
class ExpertWork:
    """Seconds of one micro-step's FFN work on one GPU beyond the dense part, and the step's expert optimizer."""

    matmul: Kernels
    elementwise: Kernels
    attention_again: float  # Megatron's core_attn recompute
    optimizer_s: float
    imbalance_s: float = 0.0  # of the routed experts' matmuls, what the busiest GPU computes beyond an even share

    def added_to(self, work: ComputeWork) -> ComputeWork:
        forward = self.matmul.forward + self.elementwise.forward
        again = self.matmul.again + self.elementwise.again + self.attention_again
        return ComputeWork(
            work.matmul_s + self.matmul.total,
            work.attention_s + self.attention_again,
            work.elementwise_s + self.elementwise.total,
            work.loss_s,
            work.recompute_s + again,
            work.forward_s + forward,
            work.optimizer_s + self.optimizer_s,
            work.weight_cast_s,
            work.expert_imbalance_s + self.imbalance_s,
        )


def _mlp(
    tokens: float,
    width: int,
    ffn: float,
    gated: bool,
    gpu: GPUSpec,
    precision: str,
    batch: int = 1,
    accumulate: bool = False,
) -> Kernels:
    """A (batch of) dense or expert MLP's matmuls on `tokens` tokens: forward, and both gradients;
    `accumulate`: the weights' gradients added into fp32 buffers by the matmuls (gemm.py)."""
    up = 2 * ffn if gated else ffn
    forward = gemm_seconds(tokens, up, width, gpu, precision, batch) + gemm_seconds(
        tokens, width, ffn, gpu, precision, batch
    )
    backward = (
        gemm_seconds(tokens, width, up, gpu, precision, batch)
        + gemm_seconds(up, width, tokens, gpu, precision, batch, accumulate=accumulate, widths=(up, width))
        + gemm_seconds(tokens, ffn, width, gpu, precision, batch)
        + gemm_seconds(width, ffn, tokens, gpu, precision, batch, accumulate=accumulate, widths=(width, ffn))
    )
    return Kernels(forward, backward)


# gpt-oss's clamped SwiGLU as its reference code runs it (openai/gpt-oss gpt_oss/torch/model.py, transformers'
# GptOssExperts), per element of F: the gate and the up clamped (a read and a write each), the gate
# scaled, through the sigmoid and multiplied by it (2 + 2 + 3), the up offset by one and the product
# (2 + 3): 16 elements moved forward; the backward's gradients through each about twice that.
CLAMPED_SWIGLU_ELEMENTS = (16, 32)
# Megatron-core's TEGroupedMLP runs it as weighted_bias_quick_geglu_impl where bias_activation_fusion is on
# (megatron/core/transformer/moe/experts.py, megatron/core/fusions/fused_bias_geglu.py @ d98e8a64; Megatron-Bridge's
# GPTOSSProvider sets it with the clamp and the offset): the gate and the up clamped eagerly (a read and a write
# each) and concatenated (2F read, 2F written), then one fused kernel of the sigmoid, the offset, the product and
# the routing weight (2F read, F written): 11 elements; backward the fused kernel's (the gradient and its 2F
# input read, 2F written) and each clamp's mask (its gradient and input read, its gradient written): 11.
MEGATRON_CLAMPED_ELEMENTS = (11, 11)


def _activation_bytes(
    ffn: float, gated: bool, fused: bool, a: int, clamped: bool = False, megatron: bool = False
) -> tuple[float, float]:
    """(forward, backward) bytes of the MLP's activation per token, as compute.py counts them; `megatron`:
    Megatron-core's fused kernels."""
    if clamped:
        forward, backward = MEGATRON_CLAMPED_ELEMENTS if megatron else CLAMPED_SWIGLU_ELEMENTS
        return forward * ffn * a, backward * ffn * a
    if gated:
        return (3 * ffn * a, 5 * ffn * a) if fused else (5 * ffn * a, 9 * ffn * a)
    return 2 * ffn * a, 3 * ffn * a


def _again(kernels: Kernels, yes: bool) -> Kernels:
    return Kernels(kernels.forward, kernels.backward, kernels.forward if yes else 0.0)


def _times(count: float, kernels: Kernels) -> Kernels:
    return Kernels(count * kernels.forward, count * kernels.backward, count * kernels.again)


def expert_work(
    shape: ModelShape,
    *,
    micro_batch: int,
    seq_len: int,
    tp: int,
    experts: ExpertLayout,
    gpu: GPUSpec,
    precision: str,
    matmul_precision: str,
    fused: bool,
    checkpointing: str,
    attention: str,
    engine: str,
    stage: int,
    recipe: Recipe,
    megatron: bool = False,
    held_apart: bool = True,
    accumulate: bool = False,
) -> ExpertWork | None:
    """The FFNs' work of one micro-step on one GPU (the module's account); None for a dense model.
    `fused`: elementwise chains fused (compiled, or TransformerEngine's and Megatron's kernels);
    `megatron`: Megatron-core's MoE layer (its dispatcher's copies, TransformerEngine's GroupedLinear, its fused
    weighted SwiGLU: Megatron-LM's --bias-swiglu-fusion default, Megatron-Bridge's bias_activation_fusion);
    `accumulate`: the routed experts' weight gradients added into fp32 buffers by their matmuls (gemm.py)."""
    dims = shape.dims
    if dims is None or dims.moe is None:
        return None
    moe, h = dims.moe, dims.width
    a = BYTES[precision]
    bandwidth = memory_bytes_per_s(gpu)
    modules = set(recipe.recompute_modules)
    full = checkpointing == "full"
    tokens = micro_batch * seq_len
    local_tokens = tokens / tp
    pairs = routed_pairs(moe, local_tokens, experts, recipe.moe_imbalance)
    local = moe.experts // experts.ep
    f = moe.expert_ffn / experts.etp
    per_expert = pairs / local
    projections = matmul_precision
    routed = _times(local, _mlp(per_expert, h, f, True, gpu, projections, accumulate=accumulate))
    router = Kernels(
        gemm_seconds(local_tokens, moe.experts, h, gpu, precision),
        2 * gemm_seconds(local_tokens, h, moe.experts, gpu, precision),
    )
    shared = _mlp(tokens, h, moe.shared_ffn / tp, True, gpu, projections) if moe.shared_ffn else Kernels()
    dense = _mlp(tokens, h, moe.dense_ffn / tp, moe.dense_gated, gpu, projections) if moe.dense_ffn else Kernels()
    layer_again = full or "moe" in modules
    mlp_again = full or "mlp" in modules
    matmul = _times(moe.moe_layers, _again(routed + router, layer_again) + _again(shared, layer_again or mlp_again))
    matmul += _times(moe.dense_layers, _again(dense, mlp_again))

    act_f, act_b = _activation_bytes(f, True, fused or megatron, a, moe.clamped_swiglu, megatron)
    swiglu = Kernels(pairs * act_f, pairs * act_b)
    passes = PERMUTATION_PASSES[_permutation(megatron, local, experts.ep)]
    permute = Kernels(passes * a * h * (local_tokens + pairs), passes * a * h * (local_tokens + pairs))
    routing = Kernels(
        local_tokens * moe.experts * ROUTER_BYTES_PER_LOGIT[0], local_tokens * moe.experts * ROUTER_BYTES_PER_LOGIT[1]
    )
    moe_bytes = _again(permute + routing, layer_again)
    swiglu_again = layer_again or "moe_act" in modules or checkpointing == "selective"
    moe_bytes += _again(swiglu, swiglu_again)
    shared_f, shared_b = _activation_bytes(moe.shared_ffn / tp, True, fused, a)
    moe_bytes += _again(Kernels(tokens * shared_f, tokens * shared_b), layer_again or mlp_again)
    dense_f, dense_b = _activation_bytes(moe.dense_ffn / tp, moe.dense_gated, fused, a)
    dense_bytes = _again(Kernels(tokens * dense_f, tokens * dense_b), mlp_again)
    elementwise = _times(moe.moe_layers, moe_bytes) + _times(moe.dense_layers, dense_bytes)
    if projections in LOW_PRECISION:
        elementwise += _times(moe.moe_layers, _fp8_casts(pairs, h, f, local, recipe.te_fp8, layer_again))
    if "layernorm" in modules:  # the two norms of every block, forward again: input read, output written
        norms = dims.layers * 2 * local_tokens * h * (a + a)
        elementwise += Kernels(0.0, 0.0, norms)
    seconds = Kernels(elementwise.forward / bandwidth, elementwise.backward / bandwidth, elementwise.again / bandwidth)
    attention_again = 0.0
    if "core_attn" in modules and not full:
        attention_again, _ = every_layer_attention_seconds(
            dims, gpu, attention, precision, micro_batch=micro_batch, seq_len=seq_len, tp=tp
        )
    if UP_PROJ_MODULE in modules and dims.mla is not None and not full:
        # the up-projections' forward again, and q and k assembled and turned again (mla_shape.py)
        ups = up_projections(h, dims.heads, dims.mla, tp)
        matmul += Kernels(0.0, 0.0, dims.layers * sum(gemm_seconds(tokens, o, i, gpu, projections) for o, i in ups))
        assembled = 2 * a * assembled_elements(dims.heads, dims.mla) + 10 * a * rotary_elements(dims.heads, dims.mla)
        seconds += Kernels(0.0, 0.0, dims.layers * tokens * assembled / tp / bandwidth)
    # An expert-parallel strategy steps its experts apart; one without steps them with the rest (compute.py).
    stepped = expert_shape(moe, h, experts.ep, experts.etp).params / (experts.edp if stage else 1) if held_apart else 0
    optimizer = OPTIMIZER_BYTES[engine] * stepped / bandwidth
    imbalance = moe.moe_layers * (routed.forward + routed.backward) * (1 - 1 / _uneven(moe, recipe.moe_imbalance))
    return ExpertWork(matmul, seconds, attention_again, optimizer, imbalance)


def _uneven(moe: MoEDims, imbalance: float) -> float:
    """The busiest GPU's expert load over the mean that others wait on: padded, every GPU runs the same."""
    return 1.0 if moe.capacity is not None and moe.padded else moe.busiest_load(imbalance)


def _permutation(megatron: bool, local: int, ep: int) -> str:
    if megatron:
        return "megatron-local-sort" if local > 1 else "megatron"
    return "loop-dispatched" if ep > 1 else "loop"


def _fp8_casts(pairs: float, width: int, ffn: float, local: int, te: bool, again: bool) -> Kernels:
    """Bytes of an MoE block's fp8 casts (compute.py's account for the projections): each expert's
    input and the down projection's, the outputs' gradients, and the weights (TransformerEngine's
    once a step, spread here over its micro-steps as a per-micro-step cost is not; torchao's each
    micro-step)."""
    cast = TE_CAST_BYTES if te else FP8_CAST_BYTES
    forward = cast * pairs * (width + ffn)
    backward = cast * pairs * (2 * ffn + width)
    weights = 0.0 if te else FP8_WEIGHT_BYTES * local * 3 * width * ffn
    return Kernels(forward + weights, backward, forward if again else 0.0)


# Kernels an MoE block launches beyond the dense part's (forward, backward), counted operator by operator
# from the code that runs it. Megatron-core (megatron/core/transformer/moe/router.py and
# token_dispatcher.py @ 41eecc45, with its router and permutation fusions, the alltoall or flex
# dispatcher, dropless): the router's gating matmul and casts, the fused top-k and the auxiliary loss's
# scores, counts and loss and its logging (10); the dispatcher's counts per expert and per rank, reshaped
# and summed (7), their five copies to the host (5); the fused permutation, the sort by local expert,
# its inverse and the unpermutation (8); the fused weighted SwiGLU (1); about half as many backward.
# Each local expert's matmuls are TransformerEngine's GroupedLinear's, launched one after another from
# C++ (MATMULS_PER_EXPERT, at the compiled rate of host_issue.py). The zoo's MoE layer (models/moe.py,
# models/routing.py): the router's casts, matmul, softmax, top-k and renormalisation (7), the
# load-balancing loss (9), the router's tally (6), the experts' sort, counts, gather, concatenation,
# weighting and index-add (11), a loop over the local experts (two matmuls, the SiLU and the product
# each); expert parallel (models/expert_parallel.py) adds its own sort, counts, gathers and
# index-add (15).
MEGATRON_KERNELS = (31, 15)
ZOO_KERNELS = (33, 15)
ZOO_DISPATCH_KERNELS = (15, 4)
GROUPED_EXPERT_KERNELS = (1, 1)  # the fused SwiGLU
MATMULS_PER_EXPERT = (2, 4)
LOOPED_EXPERT_KERNELS = (4, 7)


def expert_kernels(
    shape: ModelShape, experts: ExpertLayout, grouped: bool, checkpointing: str, recompute_modules: tuple[str, ...] = ()
) -> Kernels:
    """Kernels the FFNs of a micro-step launch beyond the dense part's (what the host issues), the C++
    launches of a grouped layer's matmuls counted as the eager kernels that take as long to issue; full
    checkpointing issues the forward's again, Megatron-core's `moe` recompute module its MoE blocks'."""
    dims = shape.dims
    if dims is None or dims.moe is None:
        return Kernels()
    moe = dims.moe
    local = moe.experts // experts.ep
    if grouped:
        scale = HOST_S_PER_KERNEL["compiled"] / HOST_S_PER_KERNEL["eager"]
        block = tuple(
            base + swiglu + local * matmuls * scale
            for base, swiglu, matmuls in zip(MEGATRON_KERNELS, GROUPED_EXPERT_KERNELS, MATMULS_PER_EXPERT, strict=True)
        )
    else:
        dispatch = ZOO_DISPATCH_KERNELS if experts.ep > 1 else (0, 0)
        block = tuple(
            base + sent + local * per_expert
            for base, sent, per_expert in zip(ZOO_KERNELS, dispatch, LOOPED_EXPERT_KERNELS, strict=True)
        )
    dense = moe.dense_layers + (moe.moe_layers if moe.shared_ffn else 0)  # a dense MLP's: 2 matmuls and 3 others
    forward = moe.moe_layers * block[0] + dense * 5
    backward = moe.moe_layers * block[1] + dense * 9
    if checkpointing == "full":
        again = forward
    elif "moe" in recompute_modules:
        again = moe.moe_layers * (block[0] + (5 if moe.shared_ffn else 0))
    else:
        again = 0.0
    return Kernels(forward, backward, again)


def expert_long_forward(shape: ModelShape, experts: ExpertLayout, grouped: bool) -> float:
    """Of the forward's MoE kernels (as expert_kernels counts them), the matmuls: the router's, the local
    experts', the shared and dense FFNs'."""
    dims = shape.dims
    if dims is None or dims.moe is None:
        return 0.0
    moe = dims.moe
    local = moe.experts // experts.ep
    scale = HOST_S_PER_KERNEL["compiled"] / HOST_S_PER_KERNEL["eager"] if grouped else 1.0
    dense = moe.dense_layers + (moe.moe_layers if moe.shared_ffn else 0)
    return moe.moe_layers * (1 + local * MATMULS_PER_EXPERT[0] * scale) + dense * 2
