"""Activation memory of one micro-batch, counted from the layer shapes: every tensor autograd
saves for backward, at the moment backward starts (when they are all alive).

Per token and block of width h, MLP width f, query width q = heads·head_dim and key/value
width k = kv_heads·head_dim (GPT-2: f = 4h, q = k = h):
  norms:                 LayerNorm keeps its input (residual dtype); RMSNorm as transformers
                         and torchtitan write it in eager PyTorch computes in fp32 and keeps
                         that fp32 input plus the normalised tensor in the residual dtype; a
                         fused RMSNorm kernel (fused_norm=true: torchtitan's Triton
                         TritonFusedRMSNorm, Apex's, Liger's) keeps its input and 1/rms only
                         (`ctx.save_for_backward(x, weight, rstd)`), as LayerNorm does
  matmul dtype:          attention input h (autocast: one bf16 copy per projection reading it),
                         q + 2k kept by SDPA, its output q (the same storage the output
                         projection reads: SDPA lays it out as (B, T, heads, head_dim), so the
                         transpose back is free), MLP input h, and 2f (GELU: its input and
                         output) or 4f (SwiGLU: gate, up, SiLU output, product)
  fp32:                  SDPA's log-sum-exp (4 bytes per head), each norm's statistics
                         (LayerNorm: mean and 1/std, 8 bytes; RMSNorm: 1/rms, 4 bytes)
Latent attention (DeepSeek-V3's, mla_shape.py) keeps its own account in place of q + 2k + q: its
latents' norms and up-projection inputs beside the attention input, then q and k at their query-key
width, v and the output at the value width.
SDPA's flash and memory-efficient kernels keep no T x T scores (the unfused `math` kernel keeps
its softmax, heads x T per token). The loss adds 12 bytes per token per vocabulary entry at the
start of backward: the fp32 log-softmax output, its incoming gradient and the gradient it makes;
a fused or chunked cross-entropy (fused_loss=true) keeps the logits and their gradient in the
compute dtype instead (compiled with the model: below); one that writes the gradient over the
logits in its forward (loss_in_place=true: TransformerEngine's parallel cross-entropy, its Triton
kernel storing the gradient into the logits, transformer_engine/common/triton/cross_entropy.py
@ 42d22740) keeps the logits alone; one fused with the head's matmul, a chunk of tokens at a time (linear_loss=true:
Liger-Kernel's fused linear cross-entropy, recipe.py's fused_linear_loss) keeps no logits: the
hidden states' gradient it makes in its forward and one chunk's logits, as many as the hidden
states have elements, each in the compute dtype (LINEAR_LOSS_WIDTHS widths a token), and the
fp32 loss of each token. Under torch's loss parallelism (the head split over the
vocabulary by tensor parallelism, DTensor's `loss_parallel`) the backward of the log-softmax and
the loss is one function, torch/distributed/tensor/parallel/loss.py
`_nll_loss_and_log_softmax_backward`, whose `(grad_input + torch.exp(x)) * grad_output` holds four
fp32 tensors of this GPU's logits at once (the saved log-softmax output, the zeros it scatters
into, the exponential and the sum, then the product in the exponential's place): 16 bytes a logit.
Megatron-LM's vocab-parallel cross-entropy keeps its own account (12).
The logits themselves (in a 16-bit compute dtype) are freed before the backward (torchtitan's
`del pred`), but the caching allocator keeps their block: each of the loss's fp32 tensors in the
backward is twice its size, and a request takes a cached block only as large or larger, else new memory, the cache
freed only when that fails (c10/cuda/CUDACachingAllocator.cpp, its header comment; under
`expandable_segments` too, the freed block lying below the saved log-softmax output). That block
is `logits_cached`: in torch's max reserved beside the peak, not in the fit. Under autocast the
residual stream stays fp32 (the embeddings' dtype) and matmuls run in bf16; FSDP's policy and
DeepSpeed run everything in the low precision.

Compiled (compile=true): torch.compile's AOTAutograd traces forward and backward as one graph and
inductor's partitioner (pytorch/pytorch:torch/_inductor/compile_fx.py@cf30153c `partition_fn`, its
joint-graph passes then torch/_functorch/partitioners.py `min_cut_rematerialization_partition`)
chooses what the forward saves: the cheapest cut, an op recomputed in the backward only if it is in
`get_default_op_list`'s recomputable ops (pointwise, casts, views; never a matmul or the attention
kernel) and its output is not read by a backward op it cannot fuse into (`should_ban_recomputation`,
`is_materialized_backwards`). So a matmul's input stays saved, its weight gradient reading it: the
MLP keeps GELU's input and output (2f, as eager) but SwiGLU's SiLU is rebuilt from the gate (3f, not
4f), and the projections' 16-bit input of each norm is one cast, shared (eager autocast casts it once
per projection). Each norm keeps its input (LayerNorm: the normalised tensor, as large) and 1/std or
1/rms (4 bytes; eager RMSNorm's fp32 copy and normalised tensor are rebuilt), the per-head norms on
queries and keys and latent attention's norms alike. With the loss in the
graph (the whole model compiled) the forward keeps the logits in the compute dtype and each token's
maximum and log-sum-exp (fp32), and the backward writes the logits' gradient over them: AOTAutograd
donates saved tensors no output aliases to the backward (torch/_functorch/_aot_autograd/graph_compile.py
`collect_bw_donated_buffer_idxs`, on by `torch._functorch.config.donated_buffer`) and inductor reuses
the logits' buffer for it. tests/plan/memory/test_compiled_activations.py counts the saved tensors of
the partitioned graph on the CPU: the partitioner decides by op, not device.

Checkpointing: `full` keeps each block's input and rebuilds one block at a time in the backward;
`selective` (torchtitan's op-level policy) keeps each block's input, the outputs of every second
matmul (the 1st, 3rd, ...) and attention's output, and rebuilds the rest of one block at a time.
Megatron-LM's selective recomputation (`core_attention_recompute`, beside no checkpointing) keeps
everything but the attention kernel's own tensors beyond q, k, v (its log-sum-exp; the unfused
kernel's softmax), which it rebuilds one layer at a time.
Tensor parallelism with sequence parallelism divides every activation by tp except the
gathered inputs of the column-parallel projections, which each GPU keeps whole, as torch's
DTensor plans save them. Megatron-LM's engine (`megatron`) keeps only this GPU's shard of them and
gathers them again in the backward (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.2),
and its fused SwiGLU (megatron/core/fusions/fused_bias_swiglu.py) saves its input alone, the gate
and the up projection, recomputing the SiLU in the backward: 3f where eager keeps 4f. Without sequence
parallelism (sequence_parallel=false) the residual stream between the blocks' matmuls is whole on
every GPU of the group: the norms keep their whole inputs and statistics, and checkpointing keeps
each block's whole input (Korthikanti et al. 2022, section 4.2.2 and table 2:
sbh(10 + 24/t + 5as/(ht)) per layer without it, sbh/t (34 + 5as/h) with it, their 5as/h with dropout).
Dropout (attention_dropout, hidden_dropout: speed/dropout.py) keeps each mask as a bool tensor, a
byte an element: the hidden dropout's two a block over the residual stream (on the sequence shard
under sequence parallelism); the unfused kernel's attention dropout its mask and the dropped
probabilities the second batched matmul saves, heads x T per token each, beside the softmax's
output. The fused kernels keep no mask: they draw it again from a seed in the backward.
tests/plan/test_plan.py checks the saved-tensor part against autograd's own saved tensors.

A model with no transformer sizes (a user's model) has its activations traced instead
(activation_trace.py): the same accounting, measured rather than counted from shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.plan.memory.model_states import BYTES, compute_bytes
from harness.plan.memory.recipe import OFFLOAD_BLOCKS_ON_GPU
from harness.plan.model.mla_shape import attention_kept_per_token, latent_kept_per_token
from harness.plan.model.model_shape import ModelShape, PlanError, TransformerDims
from harness.plan.speed.attention import UNFUSED
from harness.plan.speed.compute import block_projections
from harness.plan.speed.dropout import HIDDEN_SITES, MASK_BYTES

LOSS_BYTES_PER_LOGIT = 12
# torch's loss_parallel backward: four fp32 tensors of the local logits at once (module docstring).
LOSS_PARALLEL_BYTES_PER_LOGIT = 16
# Of those, the log-softmax's incoming gradient and the one it makes (fp32): made in backward,
# never saved, so a trace of the forward does not see them.
LOSS_GRADIENT_BYTES_PER_LOGIT = 8
LOGSUMEXP_BYTES = 4
FP8_BYTES = 1
NORM_STATS_BYTES = {False: 8, True: 4}  # per token: LayerNorm's mean and 1/std; RMSNorm's 1/rms (fp32)
# Compiled, per token: a norm's 1/std or 1/rms alone (fp32), LayerNorm's mean folded into its saved
# normalised tensor; the loss's row maximum and log-sum-exp (fp32) beside the logits (module docstring).
COMPILED_NORM_STATS_BYTES = 4
COMPILED_LOSS_STATS_BYTES = 8


@dataclass(frozen=True)
class Activations:
    """Bytes per GPU of one micro-batch's activations, alive at the start of backward."""

    blocks: int  # what the transformer blocks keep for backward (checkpointed: what the policy keeps)
    head: int  # final norm, head input and the loss's buffers over the vocabulary
    rebuilt: int = 0  # checkpointed: one block rebuilt in backward, less the loss buffers freed by then
    host: int = 0  # offloaded to host memory: copied out in the forward and back in the backward
    # The logits' freed block the caching allocator holds beside the loss's backward (module docstring):
    # reserved, not allocated, so in torch's max reserved but not in the fit.
    logits_cached: int = 0

    @property
    def total(self) -> int:
        return self.blocks + self.head + self.rebuilt


def _dtypes(precision: str, mixed_precision: str) -> tuple[int, int]:
    """(residual-stream bytes, matmul bytes) per element."""
    if precision == "fp32":
        return 4, 4
    low = BYTES[precision]
    return (4, low) if mixed_precision == "autocast" else (low, low)


def norm_bytes_per_token(dims: TransformerDims, residual: int, fused_norm: bool = False, compiled: bool = False) -> int:
    """What one norm saves per token: its input and statistics, and eager RMSNorm's fp32 copy
    and normalised tensor besides; `compiled`: its input (LayerNorm: the normalised tensor, as large)
    and 1/std or 1/rms, the rest recomputed in the backward."""
    if compiled:
        return dims.width * residual + COMPILED_NORM_STATS_BYTES
    if dims.rms_norm and not fused_norm:
        return dims.width * (4 + residual) + NORM_STATS_BYTES[True]
    return dims.width * residual + NORM_STATS_BYTES[dims.rms_norm]


def qk_norm_bytes_per_token(dims: TransformerDims, matmul: int, fused_norm: bool = False) -> int:
    """What an RMSNorm on each head's queries and keys saves per token: its input (and eager's fp32
    copy) over q + k, and 1/rms per head."""
    width = dims.q_width + dims.kv_width
    stats = (dims.heads + dims.kv_heads) * NORM_STATS_BYTES[True]
    return width * (matmul if fused_norm else 4 + matmul) + stats


def block_bytes_per_token(
    dims: TransformerDims,
    precision: str,
    mixed_precision: str,
    tp: int = 1,
    attention: str = "flash",
    seq_len: int = 0,
    fused_norm: bool = False,
    qk_norm: bool = False,
    fp8_inputs: bool = False,
    megatron: bool = False,
    sequence_parallel: bool = True,
    core_attention_kept: bool = True,
    attention_dropout: bool = False,
    hidden_dropout: bool = False,
    compiled: bool = False,
) -> float:
    """What one block saves for backward, per token, on one of `tp` GPUs. `fp8_inputs`: the
    projections keep their inputs as the fp8 cast (recipe.py fp8_saved_inputs); `megatron`:
    Megatron-LM's engine (the module's account); without `sequence_parallel` the norms keep the
    whole sequence's input on every tensor-parallel GPU (Korthikanti et al. 2022, section 4.1);
    without `core_attention_kept` the attention kernel's own tensors beyond q, k, v (its
    log-sum-exp, the unfused kernel's softmax) are not kept (core_attention_bytes_per_token);
    `attention_dropout`, `hidden_dropout`: their masks (the module's account); `compiled`: what
    AOTAutograd's partitioner saves of the block's graph (the module's account)."""
    residual, matmul = _dtypes(precision, mixed_precision)
    h, f = dims.width, dims.ffn_width
    q, kv = dims.q_width, dims.kv_width
    # Compiled, the projections reading one norm's output share a single cast of it (common subexpressions).
    autocast_copies = precision != "fp32" and mixed_precision == "autocast" and not compiled
    attention_inputs = 1 if dims.fused_qkv or not autocast_copies else 3
    mlp_inputs = 2 if dims.gated_mlp and autocast_copies else 1
    projection_input = FP8_BYTES if fp8_inputs else matmul
    gathered = (attention_inputs + mlp_inputs) * h * projection_input  # whole on every tensor-parallel GPU
    mlp = (3 if megatron or compiled else 4) if dims.gated_mlp else 2
    split = (q + 2 * kv + q + mlp * f) * matmul
    if dims.mla is not None:  # its own attention account (mla_shape.py); the latents whole as the inputs are
        attention_inputs = len(dims.mla.latents) if autocast_copies else 1
        gathered = (attention_inputs + mlp_inputs) * h * projection_input
        eager_norm = not (fused_norm or megatron or compiled)
        gathered += latent_kept_per_token(dims.mla, matmul, projection_input, eager_norm, NORM_STATS_BYTES[True])
        # The log-sum-exp is the kernel's own, counted with it below (core_attention_bytes_per_token).
        split = attention_kept_per_token(dims.heads, dims.mla, matmul, 0) + mlp * f * matmul
    if megatron and sequence_parallel:
        gathered /= tp
    if fp8_inputs:  # the down projection's input in fp8; the output projection's an fp8 copy beside attention's
        split += -f * (matmul - FP8_BYTES) + q * FP8_BYTES
    if core_attention_kept:
        split += core_attention_bytes_per_token(dims, matmul, attention, seq_len, attention_dropout)
    if qk_norm:
        split += qk_norm_bytes_per_token(dims, matmul, fused_norm or compiled)
    norms = 2 * norm_bytes_per_token(dims, residual, fused_norm, compiled)
    if hidden_dropout:
        norms += HIDDEN_SITES * dims.width * MASK_BYTES
    return norms / (tp if sequence_parallel else 1) + split / tp + gathered


def core_attention_bytes_per_token(
    dims: TransformerDims, matmul: int, attention: str, seq_len: int, dropout: bool = False
) -> int:
    """What the attention kernel keeps beyond q, k, v and its output, per token over every head
    (before tensor parallelism): the log-sum-exp, and the unfused kernel's softmax (heads x T), with
    `dropout` its mask and the dropped probabilities too."""
    kept = matmul + (MASK_BYTES + matmul if dropout else 0)
    softmax = dims.heads * seq_len * kept if attention in UNFUSED else 0
    return dims.heads * LOGSUMEXP_BYTES + softmax


def selective_bytes_per_token(
    dims: TransformerDims, precision: str, mixed_precision: str, tp: int = 1, sequence_parallel: bool = True
) -> float:
    """What torchtitan's op-level policy keeps of a block per token: its input (whole on each of the
    `tp` GPUs without sequence parallelism), every second matmul's output (1st, 3rd, ...) and
    attention's output and log-sum-exp."""
    residual, matmul = _dtypes(precision, mixed_precision)
    kept_outputs = sum(out for i, (out, _) in enumerate(block_projections(dims, 1)) if i % 2 == 0)
    block_input = dims.width * residual / (tp if sequence_parallel else 1)
    return block_input + ((kept_outputs + dims.q_width) * matmul + dims.heads * LOGSUMEXP_BYTES) / tp


LINEAR_LOSS_WIDTHS = 2  # the hidden states' gradient and a chunk's logits, a width each, per token
LOSS_PER_TOKEN_BYTES = 4  # the fp32 loss of each token, kept for the mean


def loss_bytes_per_logit(precision: str, fused: bool, vocab_parallel: bool = False, in_place: bool = False) -> int:
    """The loss's bytes per logit at its peak; `vocab_parallel`: torch's loss_parallel over a split
    head; `in_place`: a fused loss that writes the gradient over the logits."""
    if in_place:
        return compute_bytes(precision)
    if fused:
        return 2 * compute_bytes(precision)
    return LOSS_PARALLEL_BYTES_PER_LOGIT if vocab_parallel else LOSS_BYTES_PER_LOGIT


def logits_cached_per_token(dims: TransformerDims, precision: str, fused_loss: bool, tp: int = 1) -> float:
    """The logits' block (compute dtype, this GPU's share of the vocabulary) the caching allocator
    holds through an unfused loss's backward; a fused loss never makes the whole logits, and fp32
    logits are the loss's own input, whose freed block the backward's fp32 tensors reuse."""
    element = compute_bytes(precision)
    return 0.0 if fused_loss or element >= 4 else dims.vocab / dims.head_split(tp) * element


def head_bytes_per_token(
    dims: TransformerDims,
    precision: str,
    mixed_precision: str,
    fused_loss: bool,
    tp: int = 1,
    fused_norm: bool = False,
    sequence_parallel: bool = True,
    megatron: bool = False,
    loss_in_place: bool = False,
    linear_loss: bool = False,
    compiled: bool = False,
) -> float:
    """What the final norm, the head and the loss hold per token at the start of backward; `compiled`:
    in one graph with the loss, whose gradient the backward writes over the saved logits."""
    residual, matmul = _dtypes(precision, mixed_precision)
    vocab_parallel = dims.head_split(tp) > 1 and not megatron
    norm = norm_bytes_per_token(dims, residual, fused_norm, compiled) / (tp if sequence_parallel else 1)
    if linear_loss:  # no whole logits: the hidden states' gradient, a chunk's logits, the loss
        loss = LINEAR_LOSS_WIDTHS * dims.width * compute_bytes(precision) + LOSS_PER_TOKEN_BYTES
        return norm + loss + dims.width * matmul
    if compiled and not vocab_parallel:
        logits = compute_bytes(precision) * dims.vocab / dims.head_split(tp)
        return norm + logits + COMPILED_LOSS_STATS_BYTES + dims.width * matmul
    loss = loss_bytes_per_logit(precision, fused_loss, vocab_parallel, loss_in_place) * dims.vocab
    return norm + loss / dims.head_split(tp) + dims.width * matmul


def activations(
    shape: ModelShape,
    *,
    micro_batch: int,
    seq_len: int,
    precision: str,
    mixed_precision: str,
    checkpointing: str,
    fused_loss: bool = False,
    tp: int = 1,
    attention: str = "flash",
    fused_norm: bool = False,
    qk_norm: bool = False,
    offload: bool = False,
    offload_layers: int = 0,
    fp8_inputs: bool = False,
    megatron: bool = False,
    sequence_parallel: bool = True,
    core_attention_recompute: bool = False,
    with_head: bool = True,
    loss_in_place: bool = False,
    linear_loss: bool = False,
    attention_dropout: bool = False,
    hidden_dropout: bool = False,
    compiled: bool = False,
    head_compiled: bool = False,
) -> Activations | None:
    """One micro-batch's activations on one GPU; None where they are unknown (a model neither
    a known transformer nor traceable on the meta device: shape.note says which). `offload`: what
    the blocks keep goes to host memory but for the OFFLOAD_BLOCKS_ON_GPU blocks in flight;
    `offload_layers`: that many blocks' go there, the others' stay;
    `sequence_parallel`: tensor parallel splits the residual stream along the sequence too;
    `core_attention_recompute`: Megatron-LM's selective recomputation beside checkpointing=none
    (speed/core_attention_recompute.py), the kernel's own tensors rebuilt a layer at a time;
    without `with_head` (a pipeline's stages before the last) no final norm, head or loss, so nothing of
    theirs is freed before a block is rebuilt; `loss_in_place`: the fused cross-entropy writes the
    logits' gradient over them; `linear_loss`: it runs with the head's matmul a chunk at a time, no
    whole logits held; `attention_dropout`, `hidden_dropout`: their masks kept; `compiled`: each block
    compiled (what the partitioner saves, the module's account); `head_compiled`: the final norm, the
    head and the loss compiled with them, as one graph."""
    if loss_in_place and not fused_loss:
        raise PlanError(
            "loss_in_place=true is a fused cross-entropy that writes the logits' gradient over them: give "
            "fused_loss=true as well"
        )
    if linear_loss and not fused_loss:
        raise PlanError(
            "fused_linear_loss=true is a fused cross-entropy run with the head's matmul a chunk at a time: give "
            "fused_loss=true as well"
        )
    if core_attention_recompute and checkpointing != "none":
        raise PlanError(
            f"Megatron-LM's selective recomputation of the core attention is its own granularity: it does not "
            f"combine with activation_checkpointing={checkpointing}; use none beside it"
        )
    dims = shape.dims
    if dims is None:
        if checkpointing == "selective":
            raise PlanError(
                "activation_checkpointing=selective keeps the matmuls' outputs of each transformer block, and this "
                "model has no transformer layers the planner knows: use full (with blocks) or none"
            )
        from harness.plan.memory.traced import traced_activations  # torch: only a user's model gets here

        return traced_activations(
            shape,
            micro_batch=micro_batch,
            seq_len=seq_len,
            precision=precision,
            mixed_precision=mixed_precision,
            checkpointing=checkpointing == "full",
        )
    tokens = micro_batch * seq_len
    per_token = block_bytes_per_token(
        dims,
        precision,
        mixed_precision,
        tp,
        attention,
        seq_len,
        fused_norm,
        qk_norm,
        fp8_inputs,
        megatron,
        sequence_parallel,
        core_attention_kept=not core_attention_recompute,
        attention_dropout=attention_dropout,
        hidden_dropout=hidden_dropout,
        compiled=compiled,
    )
    block = per_token * tokens
    head = 0.0
    cached = 0.0
    if with_head:
        head = head_bytes_per_token(
            dims,
            precision,
            mixed_precision,
            fused_loss,
            tp,
            fused_norm,
            sequence_parallel,
            megatron=megatron,
            loss_in_place=loss_in_place,
            linear_loss=linear_loss,
            compiled=head_compiled,
        )
        head *= tokens
        cached = logits_cached_per_token(dims, precision, fused_loss, tp) * tokens
    residual_split = tp if sequence_parallel else 1  # the residual stream between blocks, on one GPU
    if checkpointing == "none":
        kept, rebuilt = block, 0.0
        if core_attention_recompute:  # one layer's kernel tensors, made again in its backward
            matmul = _dtypes(precision, mixed_precision)[1]
            rebuilt = core_attention_bytes_per_token(dims, matmul, attention, seq_len, attention_dropout)
            rebuilt *= tokens / tp
    elif checkpointing == "full":
        residual, _ = _dtypes(precision, mixed_precision)
        # The head's loss buffers are freed before the first block is rebuilt.
        kept, rebuilt = dims.width * residual * tokens / residual_split, max(0, block - head)
    else:
        kept = selective_bytes_per_token(dims, precision, mixed_precision, tp, sequence_parallel) * tokens
        rebuilt = max(0, block - kept - head)
    on_gpu, on_host = _offloaded(dims.layers, offload, offload_layers, checkpointing)
    return Activations(
        blocks=int(on_gpu * kept),
        head=int(head),
        rebuilt=int(rebuilt),
        host=int(on_host * kept),
        logits_cached=int(cached),
    )


def _offloaded(layers: int, offload: bool, offload_layers: int, checkpointing: str) -> tuple[int, int]:
    """Blocks whose saved activations the GPU holds at the peak, and those in host memory."""
    if offload:
        on_gpu = min(layers, OFFLOAD_BLOCKS_ON_GPU)
        return on_gpu, layers - on_gpu
    if not offload_layers:
        return layers, 0
    # Megatron-core's TransformerConfig refuses both (megatron/core/transformer/transformer_config.py).
    if checkpointing != "none":
        raise PlanError(
            f"activation_offload_layers= sends blocks' saved activations to the host, which Megatron-core does not do "
            f"beside recomputation: give activation_checkpointing=none, not {checkpointing}"
        )
    if offload_layers >= layers:
        raise PlanError(
            f"activation_offload_layers={offload_layers} must be fewer than the {layers} blocks each GPU holds "
            f"(Megatron-core's cpu_offloading_num_layers): give at most {layers - 1}"
        )
    # The peak is the forward's end, every offloaded copy long done, unless so few blocks stay that the
    # last copy out, beside the block computed meanwhile, holds more.
    return max(layers - offload_layers, OFFLOAD_BLOCKS_ON_GPU), offload_layers
