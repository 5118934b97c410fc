"""What one micro-step costs a GPU in compute, kernel by kernel, from the model's shapes:

  matmuls      each block's projections and the head, forward (X·Wᵀ), backward (the input's
               gradient and the weight's), timed by their shape (gemm.py)
  attention    by its kernel, head dim and sequence (attention.py)
  elementwise  norms, activations, rotary, residual adds, autocast's casts, the embedding: the
               bytes they read and write (below), at the card's memory bandwidth
  loss         the cross-entropy over the vocabulary: 36 bytes per logit eager (the fp32 copy
               of the logits, log-softmax, its gradient, the cast back), 6 fused (a fused or
               chunked kernel, or a compiled model: one read for the forward, a read and a write
               for the backward)
  copies       what the backend copies through memory around its collectives (comm.py's
               local_copy_bytes): FSDP's and ZeRO-3's gathered parameters into place, gradients
               into the reduction's buffer
  optimizer    AdamW over the GPU's shard, once per step (OPTIMIZER_BYTES per parameter)
  fp8          with precision=fp8 the blocks' projections run in fp8 with tensorwise scaling
               (torchao's float8 linears, Transformer Engine's), everything else in bf16 (the head
               too: torchtitan leaves `output` out). Every cast reads the bf16 tensor for its amax,
               reads it again and writes fp8 (FP8_CAST_BYTES per element): each distinct input
               once (q, k and v share theirs, as do gate and up: torchao's PrepareFloat8ModuleInput,
               a fused qkv, Inductor's common subexpressions), under tensor parallelism the
               attention's and MLP's inputs on the sequence shard before their gather; each output's
               gradient (the row-parallel ones on the sequence shard); each weight per micro-step
               and its transposed copy for the backward (FP8_WEIGHT_BYTES per parameter). Full
               checkpointing casts the forward's again, selective recasts without the amax
               (torchtitan's policy saves `max`)

Activation checkpointing runs forward work again in the backward: `full` the whole of every
block (attention included); `selective` (torchtitan's op-level policy) every second matmul of a
block and all its elementwise work, keeping attention's output. Tensor parallelism splits each
projection's output (column-parallel) or input (row-parallel) dimension and the heads over
`tp` GPUs. torch.compile fuses the elementwise chains between matmuls.

Bytes per token of the elementwise work, from the modules as eager PyTorch runs them (r: the
residual stream's bytes, a: the matmuls' inputs and outputs; under autocast r=4, a=2 and each
projection reads its input through a cast (r+a), in bf16 throughout r=a=2):
  LayerNorm         forward r+n, backward 2r+n (n: its output's bytes, r under autocast)
  RMSNorm (eager)   fp32 upcast, square, mean, scale, downcast, weight: 36 bytes per element from
                    bf16 (28 from fp32) forward, twice that backward; a fused kernel
                    (fused_norm=true) moves what LayerNorm does
  residual add      r+a+r forward; backward the gradients' sum (3r) and, under autocast, the
                    branch's cast (r+a)
  GELU / SwiGLU     2f·a / 5f·a forward (SiLU, then the product), 3f·a / 9f·a backward
  rotary            20 bytes per element of q and k each way (halves rotated, two products, a sum;
                    or in complex numbers, as torchtitan writes it: the fp32 upcast, the complex
                    product, the cast back)
  repeat_kv         GQA's keys and values expanded to every head: 2·(q+kv)·a each way
Compiled, each chain between two matmuls reads its inputs and writes its outputs once, but for
a rotary embedding computed in complex numbers (complex_rope=true): Inductor generates no code for
complex tensors and runs those operators as eager kernels (torch/_inductor/lowering.py,
`unsupported_input_tensor`: "Torchinductor does not support code generation for complex
operators"), so that rotary costs what it does eager.
A model without transformer sizes costs its 6N flops at the card's matmul rate, and its optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.common.hardware import GPUSpec
from harness.plan.model.mla_shape import assembled_elements, latent_width, mla_projections, rotary_elements
from harness.plan.model.model_shape import ModelShape, TransformerDims
from harness.plan.speed.attention import FP8_KERNELS, UNFUSED, every_layer_attention_seconds
from harness.plan.speed.gemm import BYTES, LOW_PRECISION, gemm_seconds
from harness.plan.speed.kernel_table import kernel_table

CHECKPOINTING = ("none", "full", "selective")
LOSS_BYTES_PER_LOGIT = {"eager": 36, "fused": 6}
# AdamW per parameter of the shard: parameter, gradient and both moments read, three written
# (fused, fp32: 28), the gradient norm's read and the clipping's scale (12); DeepSpeed adds the
# gradient's cast to fp32 and the parameter's back to bf16 (6 + 6).
OPTIMIZER_BYTES = {"torch": 40, "deepspeed": 52}
# Autocast per parameter of a matmul's weight per micro-step: cast to bf16 for the forward
# (read 4, write 2), its gradient cast back and added into .grad (read 2, write 4, read 4, write 4).
AUTOCAST_WEIGHT_BYTES = 6 + 14
# The share of the data-sheet bandwidth eager PyTorch's memory-bound kernels reach, as the bytes
# above count them: on the reference H100 (docs/benchmarks.md, 2026-11-23) `single` eager and
# compiled differ only in their memory-bound work (319,108 against 469,415 tokens/s at gpt2-124m,
# micro-batch 16 x 1024): the model's 10.45 ms difference at the data sheet's 3.35 TB/s took
# 16.44 ms. tests/plan/speed/test_compute.py derives it again.
MEMORY_EFFICIENCY = 0.635
RMSNORM_EAGER_BYTES = {2: 36, 4: 28}  # per element forward, by the input's bytes


def memory_bytes_per_s(gpu: GPUSpec) -> float:
    """What memory-bound kernels move per second on `gpu`: its own measured share of the data
    sheet's bandwidth where a kernel table holds one (kernel_table.py), else MEMORY_EFFICIENCY."""
    table = kernel_table(gpu)
    efficiency = table.memory_efficiency if table and table.memory_efficiency else MEMORY_EFFICIENCY
    return gpu.hbm_bytes_per_s * efficiency


FP8_CAST_BYTES = 2 + 2 + 1  # the amax's read, the cast's read and its fp8 write
FP8_WEIGHT_BYTES = FP8_CAST_BYTES + 2  # and the fp8 copy transposed for the backward
FP8_RECAST_BYTES = 2 + 1  # a cast whose amax was kept
# TransformerEngine's fp8 (te_fp8=true; TE 1.x's Linear, LayerNormLinear and LayerNormMLP under its
# DelayedScaling recipe, as Megatron-LM and NeMo run them): the scale comes from earlier steps' amax
# history, so no cast reads for an amax; each cast writes the fp8 tensor and its transpose, which
# Hopper's fp8 GEMMs need for the backward (`cast_transpose`). The norm ahead of the attention's and
# the MLP's first projections and the MLP's activation write their outputs in fp8 themselves
# (`LayerNormLinear`, `LayerNormMLP`): a byte instead of two, and the transpose's read and write.
TE_CAST_BYTES = 2 + 1 + 1  # the bf16 read, the fp8 write and its transpose
TE_FUSED_CAST_BYTES = -1 + 1 + 1  # an fp8 output for a bf16 one, the transpose read and written
MXFP8_CAST_BYTES = 2 + 2 * (1 + 1 / 32)  # one read, the rowwise and columnwise casts with their block scales
# TransformerEngine's fp8 attention (fp8_attention=true) with per-tensor current scaling, as MLPerf's configs
# run it (NVTE_DPA_FP8_RECIPE=Float8CurrentScaling): FusedAttnFunc quantizes q, k and v before the forward
# kernel and the output's gradient before the backward one, each an amax pass and a cast (FP8_CAST_BYTES); the
# kernels return the output and q's, k's and v's gradients in bf16 (NVTE_DPA_FP8CS_O_in_F16 defaults to 1)
# (NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/backends.py @ d0067d0d).


@dataclass(frozen=True)
class Regime:
    """How a backend runs the model: bytes of the residual stream and of the matmuls' operands."""

    residual: int
    matmul: int
    autocast: bool  # projections read their inputs through a cast; weights cast every forward

    @classmethod
    def of(cls, precision: str, mixed_precision: str) -> "Regime":
        if precision == "fp32":
            return cls(4, 4, False)
        return cls(4, 2, True) if mixed_precision == "autocast" else cls(2, 2, False)


@dataclass(frozen=True)
class ComputeWork:
    """Seconds of one micro-step's compute on one GPU, by part, and the step's optimizer."""

    matmul_s: float
    attention_s: float
    elementwise_s: float
    loss_s: float
    recompute_s: float  # forward work activation checkpointing runs again (its share of the parts above)
    forward_s: float  # the forward's share of the micro-step (the window forward communication hides in)
    optimizer_s: float  # once per step, not per micro-step
    # TransformerEngine's fp8 weight casts (te_fp8): once per step, their copy reused by every micro-step.
    weight_cast_s: float = 0.0
    # Of matmul_s, what the busiest GPU's experts compute beyond an even share (moe_imbalance: expert_compute.py).
    expert_imbalance_s: float = 0.0

    @property
    def step_s(self) -> float:
        """What a step runs once, whatever its micro-steps: the optimizer, TE's weight casts."""
        return self.optimizer_s + self.weight_cast_s

    @property
    def micro_step_s(self) -> float:
        return self.matmul_s + self.attention_s + self.elementwise_s + self.loss_s

    @property
    def backward_s(self) -> float:
        return self.micro_step_s - self.forward_s


@dataclass(frozen=True)
class Kernels:
    """A micro-step's work, split into what the forward does, what the backward does, and what a
    checkpointed backward runs again."""

    forward: float = 0.0
    backward: float = 0.0
    again: float = 0.0

    def __add__(self, other: "Kernels") -> "Kernels":
        return Kernels(self.forward + other.forward, self.backward + other.backward, self.again + other.again)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.again


def block_projections(dims: TransformerDims, tp: int) -> list[tuple[int, int]]:
    """(out, in) of a block's matmuls in forward order, as one of `tp` GPUs holds them."""
    h, f, q, kv = dims.width, dims.ffn_width, dims.q_width, dims.kv_width
    attention = [((q + 2 * kv) // tp, h)] if dims.fused_qkv else [(q // tp, h), (kv // tp, h), (kv // tp, h)]
    attention += [(h, q // tp)]
    if dims.mla is not None:
        attention = mla_projections(h, dims.heads, dims.mla, tp)
    mlp = [(f // tp, h), (f // tp, h), (h, f // tp)] if dims.gated_mlp else [(f // tp, h), (h, f // tp)]
    return attention + mlp


def fp8_cast_bytes(
    dims: TransformerDims,
    tokens: int,
    tp: int,
    checkpointing: str,
    precision: str = "fp8",
    block_scaled: bool = False,
) -> tuple[float, float, float]:
    """Bytes the fp8 (or fp4) casts of one micro-step move (forward, backward, again): the module
    docstring's account, per GPU of a `tp`-way tensor-parallel group; an fp4 cast writes fp4's
    bytes (with its block scales) where fp8's writes one. MXFP8 (`block_scaled`) reads each
    tensor once and writes its rowwise and columnwise casts, a scale byte per 32 elements each."""
    written = BYTES[precision] - 1  # fp4's write against fp8's one byte
    cast, weight, recast = FP8_CAST_BYTES + written, FP8_WEIGHT_BYTES + 3 * written, FP8_RECAST_BYTES + written
    if block_scaled:
        cast = weight = recast = MXFP8_CAST_BYTES
    h, q, f = dims.width, dims.q_width, dims.ffn_width
    column_outputs = sum(out for out, into in block_projections(dims, tp) if into == h)
    inputs = tokens * (2 * h / tp + (q + f + latent_width(dims)) / tp)  # attention and MLP inputs, then o's and down's
    grads = tokens * (column_outputs + 2 * h / tp)
    weights = sum(out * into for out, into in block_projections(dims, tp))
    forward = dims.layers * (cast * inputs + weight * weights)
    backward = dims.layers * cast * grads
    again = {"none": 0.0, "full": 1.0, "selective": recast / cast}[checkpointing] * forward
    return forward, backward, again


def te_fp8_cast_bytes(
    dims: TransformerDims, tokens: int, tp: int, checkpointing: str
) -> tuple[float, float, float, float]:
    """Bytes TransformerEngine's fp8 casts move (forward, backward, again, and the weights' once per
    step: Megatron-LM passes `is_first_microbatch`, and TE casts the weights on the first micro-batch
    and reuses that fp8 copy until the optimizer steps), per GPU of a `tp`-way group (the constants'
    account): the attention's and the MLP's inputs and the activation fused, the output projection's
    input and each output's gradient cast on their own."""
    h, q, f = dims.width, dims.q_width, dims.ffn_width
    column_outputs = sum(out for out, into in block_projections(dims, tp) if into == h)
    fused = tokens * (2 * h / tp + (f + latent_width(dims)) / tp)  # the norms' outputs, the activation's
    forward = dims.layers * (TE_FUSED_CAST_BYTES * fused + TE_CAST_BYTES * tokens * q / tp)
    backward = dims.layers * TE_CAST_BYTES * tokens * (column_outputs + 2 * h / tp)
    weights = TE_CAST_BYTES * dims.layers * sum(out * into for out, into in block_projections(dims, tp))
    again = forward if checkpointing == "full" else 0.0
    return forward, backward, again, weights


def fp8_attention_cast_bytes(
    dims: TransformerDims, tokens: int, tp: int, checkpointing: str
) -> tuple[float, float, float]:
    """Bytes fp8 attention's casts move in one micro-step (forward, backward, again), per GPU of a
    `tp`-way group: q, k and v cast before the forward, the output's gradient before the backward."""
    qkv = dims.heads * dims.qk_head_dim + dims.kv_heads * (dims.qk_head_dim + dims.v_head_dim)
    forward = dims.layers * FP8_CAST_BYTES * tokens * qkv / tp
    backward = dims.layers * FP8_CAST_BYTES * tokens * dims.q_width / tp
    return forward, backward, forward if checkpointing == "full" else 0.0


def recomputed(index: int, checkpointing: str) -> bool:
    """Whether checkpointing runs a block's `index`-th projection (block_projections' order) again
    in the backward: every one under full, every second one under selective (torchtitan's policy
    saves the others' outputs)."""
    return checkpointing == "full" or (checkpointing == "selective" and index % 2 == 1)


def _matmuls(
    dims: TransformerDims,
    tokens: int,
    gpu: GPUSpec,
    precision: str,
    checkpointing: str,
    tp: int,
    projections: str,
    accumulate: bool = False,
) -> Kernels:
    """The matmuls of a micro-step: the blocks' projections at `projections` (fp8 or the run's
    precision), the head at the run's; `accumulate`: the weight gradients added into fp32 buffers by
    their matmuls (gemm.py)."""
    block = Kernels()
    for index, (out, into) in enumerate(block_projections(dims, tp)):
        forward = gemm_seconds(tokens, out, into, gpu, projections)
        backward = gemm_seconds(tokens, into, out, gpu, projections) + gemm_seconds(
            out, into, tokens, gpu, projections, accumulate=accumulate, widths=(out, into)
        )
        again = forward if recomputed(index, checkpointing) else 0.0
        block += Kernels(forward, backward, again)
    head_out = dims.vocab // dims.head_split(tp)
    head = Kernels(
        gemm_seconds(tokens, head_out, dims.width, gpu, precision),
        gemm_seconds(tokens, dims.width, head_out, gpu, precision)
        + gemm_seconds(
            head_out, dims.width, tokens, gpu, precision, accumulate=accumulate, widths=(head_out, dims.width)
        ),
    )
    return Kernels(block.forward * dims.layers, block.backward * dims.layers, block.again * dims.layers) + head


def _norm_bytes(dims: TransformerDims, r: Regime, compiled: bool, fused_norm: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes per element of one norm."""
    out = r.residual if r.autocast else r.matmul
    if compiled or fused_norm:
        return r.residual + out, 2 * r.residual + out
    if dims.rms_norm:
        forward = RMSNORM_EAGER_BYTES[r.residual]
        return forward, 2 * forward
    return r.residual + out, 2 * r.residual + out


def elementwise_bytes_per_token(
    dims: TransformerDims,
    r: Regime,
    compiled: bool,
    tp: int,
    fused_norm: bool = False,
    complex_rope: bool = False,
    sequence_parallel: bool = True,
) -> tuple[float, float]:
    """(forward, backward) bytes one block's elementwise work moves per token on one of `tp` GPUs
    (tensor parallel splits the heads' and the MLP's work; the residual stream's, its norms,
    residual adds and the casts of the projections' inputs, is split by sequence parallelism alike,
    and without it, as Megatron-LM ran before 2022, every GPU of the group runs them over the whole
    sequence)."""
    h, f, q, kv = dims.width, dims.ffn_width, dims.q_width, dims.kv_width
    a, res = r.matmul, r.residual
    norm_f, norm_b = _norm_bytes(dims, r, compiled, fused_norm)
    qk = q + kv
    expand = 2 * (q + kv) * a if dims.kv_heads < dims.heads else 0.0
    residual_split = tp if sequence_parallel else 1
    latent_f = latent_b = 0.0
    if dims.mla is not None:  # the latents' norms; rotary on the rope parts; q and k assembled from their parts
        qk = rotary_elements(dims.heads, dims.mla)
        latent_f, latent_b = norm_f * latent_width(dims), norm_b * latent_width(dims)
        expand = 0.0 if compiled else 2 * a * assembled_elements(dims.heads, dims.mla)
    if compiled:
        junction_f, junction_b = (2 * res + 2 * a) * h, (3 * res + a) * h
        act_f, act_b = (3 * f * a, 5 * f * a) if dims.gated_mlp else (2 * f * a, 3 * f * a)
        rotary = (10 if complex_rope else 2) * a * qk if dims.rotary else 0.0
        return (
            (2 * junction_f + latent_f) / residual_split + (act_f + rotary + expand) / tp,
            (2 * junction_b + latent_b) / residual_split + (act_b + rotary + expand) / tp,
        )
    casts = 0.0
    if r.autocast:
        consumers = (1 if dims.fused_qkv else 3) + (2 if dims.gated_mlp else 1)
        casts = consumers * (res + a) * h
    act_f, act_b = (5 * f * a, 9 * f * a) if dims.gated_mlp else (2 * f * a, 3 * f * a)
    rotary = 10 * a * qk if dims.rotary else 0.0
    cast_back = 2 * (res + a) * h if r.autocast else 0.0
    stream_f = 2 * norm_f * h + casts + 2 * (2 * res + a) * h + latent_f
    stream_b = 2 * norm_b * h + casts + 2 * 3 * res * h + cast_back + latent_b
    return (
        stream_f / residual_split + (act_f + rotary + expand) / tp,
        stream_b / residual_split + (act_b + rotary + expand) / tp,
    )


def _elementwise(
    dims: TransformerDims,
    tokens: int,
    r: Regime,
    compiled: bool,
    checkpointing: str,
    tp: int,
    bandwidth: float,
    fused_norm: bool = False,
    complex_rope: bool = False,
    sequence_parallel: bool = True,
) -> Kernels:
    forward, backward = elementwise_bytes_per_token(dims, r, compiled, tp, fused_norm, complex_rope, sequence_parallel)
    block = Kernels(forward, backward, forward if checkpointing != "none" else 0.0)
    # Outside the blocks: the embedding's lookup and its gradient, the final norm.
    norm_f, norm_b = _norm_bytes(dims, r, compiled, fused_norm)
    root = Kernels((2 * r.residual + norm_f) * dims.width, (2 * r.residual + norm_b) * dims.width)
    per_token = Kernels(block.forward * dims.layers, block.backward * dims.layers, block.again * dims.layers) + root
    scale = tokens / bandwidth
    return Kernels(per_token.forward * scale, per_token.backward * scale, per_token.again * scale)


def _attention(
    dims: TransformerDims,
    micro_batch: int,
    seq_len: int,
    gpu: GPUSpec,
    kernel: str,
    precision: str,
    checkpointing: str,
    tp: int,
) -> Kernels:
    forward, backward = every_layer_attention_seconds(
        dims, gpu, kernel, precision, micro_batch=micro_batch, seq_len=seq_len, tp=tp
    )
    return Kernels(forward, backward, forward if checkpointing == "full" else 0)


def compute_work(
    shape: ModelShape,
    *,
    micro_batch: int,
    seq_len: int,
    precision: str,
    mixed_precision: str,
    compiled: bool,
    checkpointing: str,
    fused_loss: bool,
    attention: str,
    gpu: GPUSpec,
    tp: int = 1,
    optimizer_params: float,
    engine: str,
    copy_bytes: float = 0.0,
    matmul_precision: str | None = None,
    fused_norm: bool = False,
    complex_rope: bool = False,
    qk_norm: bool = False,
    te_fp8: bool = False,
    sequence_parallel: bool = True,
    fp8_block_scaling: bool = False,
    fp8_attention: bool = False,
    accumulate: bool = False,
) -> ComputeWork:
    """The parts of one micro-step of micro_batch x seq_len tokens on one GPU, and the step's
    optimizer over `optimizer_params` parameters; `qk_norm`: an RMSNorm on each head's queries
    and keys, moving their elements as a norm of the matmuls' dtype does; `te_fp8`: fp8 projections
    cast as TransformerEngine casts them (te_fp8_cast_bytes); `fp8_attention`: the attention in fp8, its
    kernel's fp8 rate beside its casts (fp8_attention_cast_bytes); `accumulate`: the weight gradients
    added into fp32 buffers by their matmuls (Megatron's gradient accumulation fusion, gemm.py)."""
    tokens = micro_batch * seq_len
    regime = Regime.of(precision, mixed_precision)
    bandwidth = memory_bytes_per_s(gpu)
    optimizer = OPTIMIZER_BYTES[engine] * optimizer_params / bandwidth
    dims = shape.dims
    if dims is None:
        flops = shape.flops_per_token(seq_len) * tokens * (4 / 3 if checkpointing != "none" else 1)
        matmul = flops / (gpu.matmul_efficiency * gpu.peak_flops[precision])
        return ComputeWork(matmul, 0.0, 0.0, 0.0, 0.0, matmul / 3, optimizer)
    projections = matmul_precision or precision
    matmuls = _matmuls(dims, tokens, gpu, precision, checkpointing, tp, projections, accumulate)
    kernel = FP8_KERNELS[attention] if fp8_attention else attention
    attn = _attention(dims, micro_batch, seq_len, gpu, kernel, precision, checkpointing, tp)
    elementwise = _elementwise(
        dims, tokens, regime, compiled, checkpointing, tp, bandwidth, fused_norm, complex_rope, sequence_parallel
    )
    if regime.autocast:  # the weights' casts, forward and backward (again when recomputed)
        block_weights = sum(o * i for o, i in block_projections(dims, tp)) * dims.layers
        weights = block_weights + dims.vocab * dims.width / dims.head_split(tp)
        casts = AUTOCAST_WEIGHT_BYTES * weights / bandwidth
        elementwise += Kernels(casts * 6 / AUTOCAST_WEIGHT_BYTES, casts * 14 / AUTOCAST_WEIGHT_BYTES)
    elementwise += Kernels(0.0, copy_bytes / bandwidth)
    if qk_norm:
        rms = replace(dims, rms_norm=True)
        norm_f, norm_b = _norm_bytes(rms, Regime(regime.matmul, regime.matmul, False), compiled, fused_norm)
        moved = (dims.q_width + dims.kv_width) * tokens * dims.layers / tp / bandwidth
        elementwise += Kernels(norm_f * moved, norm_b * moved, norm_f * moved if checkpointing != "none" else 0.0)
    weight_casts = 0.0
    if projections == "fp8" and te_fp8 and not fp8_block_scaling:
        *per_micro_step, weight_bytes = te_fp8_cast_bytes(dims, tokens, tp, checkpointing)
        elementwise += Kernels(*(moved / bandwidth for moved in per_micro_step))
        weight_casts = weight_bytes / bandwidth
    elif projections in LOW_PRECISION:
        casts = fp8_cast_bytes(dims, tokens, tp, checkpointing, projections, fp8_block_scaling)
        elementwise += Kernels(*(moved / bandwidth for moved in casts))
    if fp8_attention:
        attention_casts = fp8_attention_cast_bytes(dims, tokens, tp, checkpointing)
        elementwise += Kernels(*(moved / bandwidth for moved in attention_casts))
    loss_bytes = LOSS_BYTES_PER_LOGIT["fused" if fused_loss else "eager"]
    loss = loss_bytes * tokens * dims.vocab / dims.head_split(tp) / bandwidth
    forward = matmuls.forward + attn.forward + elementwise.forward + loss / 3
    again = matmuls.again + attn.again + elementwise.again
    return ComputeWork(matmuls.total, attn.total, elementwise.total, loss, again, forward, optimizer, weight_casts)


# Kernels a block launches, by what launches them (forward, backward): each projection's matmul,
# and its two gradients' (block_projections); attention (flash and cuDNN: one kernel forward, the
# backward's pre-processing, main and dq conversion; math: two batched matmuls and a softmax
# forward, twice that backward); and the elementwise work as eager PyTorch runs it, op by op
# (the module docstring's list):
# Eager RMSNorm: the fp32 upcast, pow, mean, +eps, rsqrt, x*r, *w (and the cast back); LayerNorm or a
# fused RMSNorm: one kernel, two backward (the input's gradient, the weight's).
NORM_KERNELS = {"eager-rms": (7, 14), "one-kernel": (1, 2)}
MATH_ATTENTION_KERNELS = (3, 6)
FUSED_ATTENTION_KERNELS = (1, 3)
RESIDUAL_KERNELS = (1, 1)  # the add; backward the sum of the branch's and the stream's gradients
ACTIVATION_KERNELS = {"gated": (2, 3), "plain": (1, 1)}  # SiLU and the product; GELU
ROTARY_KERNELS = (6, 6)  # q and k each: the upcast, the complex product, the cast back
REPEAT_KV_KERNELS = (2, 2)  # keys and values expanded to every head (a copy), their sums back
HEAD_LAYOUT_KERNELS = (1, 1)  # attention's output made contiguous across heads
CAST_KERNELS = 1  # autocast: a weight's bf16 copy per forward, its gradient's fp32 add per backward
ACCUMULATE_KERNELS = 1  # backward: each parameter's gradient added into .grad (or its bucket)
# backward: a projection's bias gradient, the output's gradient summed over the tokens (autograd's
# addmm and linear backward: a reduction of its own beside the two matmuls; torch's profiler shows
# the aten::sum on a CPU, tests/plan/speed/test_host_issue.py)
BIAS_GRAD_KERNELS = 1
# Outside the blocks, eager: the embedding (its gather; backward its scatter-add), the final norm, the
# head's matmuls, the loss (fp32 copy, log-softmax, gather; backward the softmax's gradient, the cast)
ROOT_KERNELS = (6, 8)
# Compiled (Inductor) each elementwise chain between two matmuls is one kernel: before the
# attention's projections, the rotary embedding, after the output projection (residual and
# norm), the activation, after the down projection, forward; backward the norms' two reductions
# each, the activation's, the rotary embedding's and the heads' layout.
COMPILED_CHAINS = (5, 8)


def block_kernels(
    dims: TransformerDims,
    *,
    compiled: bool,
    autocast: bool,
    attention: str,
    params: int,
    biased: int = 0,
    fused_norm: bool = False,
    complex_rope: bool = False,
) -> Kernels:
    """Kernels one block of `params` parameter tensors, `biased` of them projections' biases, launches,
    forward and backward (what checkpointing runs again is the caller's): the same on every GPU of a
    tensor-parallel group."""
    projections = len(block_projections(dims, 1))
    attention_k = MATH_ATTENTION_KERNELS if attention in UNFUSED else FUSED_ATTENTION_KERNELS
    forward = projections + attention_k[0]
    backward = 2 * projections + attention_k[1] + ACCUMULATE_KERNELS * params + BIAS_GRAD_KERNELS * biased
    if compiled:
        chains = COMPILED_CHAINS
        if complex_rope and dims.rotary:  # Inductor leaves complex operators eager
            chains = (chains[0] + ROTARY_KERNELS[0], chains[1] + ROTARY_KERNELS[1])
        return Kernels(forward + chains[0], backward + chains[1])
    norm = NORM_KERNELS["eager-rms" if dims.rms_norm and not fused_norm else "one-kernel"]
    activation = ACTIVATION_KERNELS["gated" if dims.gated_mlp else "plain"]
    parts = [(norm[0] * 2, norm[1] * 2), (2 * RESIDUAL_KERNELS[0], 2 * RESIDUAL_KERNELS[1]), activation]
    parts.append(HEAD_LAYOUT_KERNELS)
    if dims.rotary:
        parts.append(ROTARY_KERNELS)
    if dims.kv_heads < dims.heads:
        parts.append(REPEAT_KV_KERNELS)
    if dims.mla is not None:  # the latents' norms, q and k assembled from their parts
        latents = len(dims.mla.latents)
        parts.append((norm[0] * latents + 2, norm[1] * latents + 2))
    if autocast:
        parts.append((CAST_KERNELS * projections, CAST_KERNELS * projections))
    return Kernels(forward + sum(f for f, _ in parts), backward + sum(b for _, b in parts))


def micro_step_kernels(
    shape: ModelShape,
    checkpointing: str,
    *,
    compiled: bool = False,
    autocast: bool = False,
    attention: str = "flash",
    fused_norm: bool = False,
    complex_rope: bool = False,
) -> Kernels:
    """Kernels one micro-step of the model launches (forward, backward, and the forward's kernels
    checkpointing runs again in the backward: every block's under full, half of its matmuls and
    its elementwise work under selective)."""
    if shape.dims is None:  # a model without transformer sizes: each tensor's matmul and its two gradients
        tensors = len(shape.tensors or ())
        return Kernels(tensors + ROOT_KERNELS[0], 2 * tensors + ROOT_KERNELS[1])
    params = sum(1 for t in shape.tensors or () if t.block == 0) or len(block_projections(shape.dims, 1))
    biased = sum(1 for t in shape.tensors or () if t.block == 0 and t.projection_bias)
    block = block_kernels(
        shape.dims,
        params=params,
        biased=biased,
        compiled=compiled,
        autocast=autocast,
        attention=attention,
        fused_norm=fused_norm,
        complex_rope=complex_rope,
    )
    again = {"none": 0.0, "full": block.forward, "selective": block.forward / 2}[checkpointing]
    layers = shape.dims.layers
    return Kernels(layers * block.forward + ROOT_KERNELS[0], layers * block.backward + ROOT_KERNELS[1], layers * again)


def kernel_launches(shape: ModelShape, checkpointing: str) -> int:
    """Kernels one eager micro-step launches (what a host that launches them one by one pays for)."""
    return int(micro_step_kernels(shape, checkpointing).total)
