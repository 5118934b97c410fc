"""nanotron's training step where it moves more memory than compute.py counts for Megatron-LM's
engine, whose column- and row-parallel layers, sequence-first activations and fused RMSNorm nanotron
shares. Each figure is read from huggingface/nanotron at the branch the Ultra-Scale Playbook's
benchmarks ran (nouamane/bench2 @ 67c5ebb6a925; the same code at e24d2483a4e5):

- The loss (`models/llama.py` LlamaModel `cast_to_fp32` and Loss, `tensor_parallel/functional.py`
  `_ShardedCrossEntropy`): the head's bf16 logits are cast to fp32 by a module of their own (read 2,
  write 4 bytes a logit), then the vocabulary-parallel cross-entropy takes the max (read 4),
  subtracts it into a new tensor (read 4, write 4), exponentiates in place (4 + 4), sums (4) and
  divides in place by the sum (4 + 4), keeping that softmax for the backward: 38 bytes a logit
  forward. The backward subtracts one at each target (a gather, no pass over the logits),
  multiplies the softmax by the loss's gradient in place (4 + 4) and the cast's backward writes the
  bf16 gradient (read 4, write 2): 14. compute.py's eager loss counts 36 in all.
- The MLP's activation (`models/llama.py` MLP, GLUActivation): gate and up are one column-parallel
  matmul (`gate_up_proj`) whose output is split (`torch.split`, views) before SiLU and the product;
  autograd's backward of the split concatenates the two gradients into the merged one (read 2,
  write 2 bytes an element of the 2 x ffn / tp a token), a pass compute.py's SwiGLU, two matmuls'
  outputs, does not have.
- The gradients (`optim/gradient_accumulator.py` FP32GradientAccumulator, `accumulate_grad_in_fp32`):
  autograd writes each parameter's bf16 gradient, which the accumulator adds into its fp32 buffer
  after every micro-step's backward (`fp32_grad.add_(half_param.grad)`: read 2, read 4, write 4),
  where Megatron-LM's weight-gradient GEMMs accumulate into fp32 themselves
  (`gradient_accumulation_fusion`). After the optimizer's step it copies each fp32 parameter into
  its bf16 one (`half_param.copy_(fp32_param)`: read 4, write 2) and zeroes the contiguous fp32
  buffer (`zero_()`: write 4), once a step. With data parallelism it wraps the model in torch's DDP
  (`trainer.py` init_model; `gradient_as_bucket_view` unset), which copies each bf16 gradient into
  its bucket (read 2, write 2) on the micro-step that synchronises, whose hook adds the bucket into
  the fp32 buffers and all-reduces them, bucket by bucket during the backward (`get_fp32_accum_hook`).
  The fused AdamW over the fp32 parameters and the gradient norm's clipping (`clip_grads.py`) are
  compute.py's OPTIMIZER_BYTES already.

What nanotron runs as compute.py counts it, so not changed here: FlashAttention-2
(`flash_attn_varlen_func`), the Triton RMSNorm, SiLU and the product as two kernels, two residual
adds a block, and around the attention of a model without grouped queries (the rows' MHA) the qkv
output permuted into q, k and v (`.contiguous()`), k and v stacked and permuted for flash-attn's
Triton rotary (in place on q and on k), the attention's output copied for the output projection:
40 bytes for each element of q's width a token forward and 44 backward, where compute.py's rotary
counts 20 for each element of q and of k each way (40).
"""

from __future__ import annotations

from dataclasses import replace

from harness.plan.model.model_shape import TransformerDims
from harness.plan.speed.compute import ComputeWork

# A plan option: the run is nanotron's (a published row's `nanotron` token).
NANOTRON_ENGINE = "nanotron_engine"
LOSS_FORWARD_BYTES_PER_LOGIT = (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4)
LOSS_BACKWARD_BYTES_PER_LOGIT = (4 + 4) + (4 + 2)
ACCUMULATE_BYTES_PER_PARAM = 2 + 4 + 4  # each micro-step: the bf16 gradient added into the fp32 buffer
GLU_SPLIT_BACKWARD_BYTES = 2 + 2  # an element of the merged gate-and-up gradient, read and written
ZERO_BYTES_PER_PARAM = 4  # each step: the fp32 gradient buffer zeroed
COPY_BACK_BYTES_PER_PARAM = 4 + 2  # each step: the fp32 parameter copied into the bf16 one
DDP_BUCKET_BYTES_PER_PARAM = 2 + 2  # each step with data parallelism: the bf16 gradient copied into DDP's bucket


def with_nanotron_step(
    work: ComputeWork,
    dims: TransformerDims,
    *,
    tokens: int,
    tp: int,
    params: float,
    optimizer_params: float,
    data_parallel: int,
    bandwidth: float,
) -> ComputeWork:
    """`work` (compute_work's, Megatron-LM's engine) as nanotron runs it: its loss for compute.py's
    (the forward's share with it); in each micro-step's backward the gated MLP's split gradients
    concatenated and `params` gradients accumulated in fp32; each step the fp32 buffers zeroed, the
    `optimizer_params` it steps copied back to bf16 and, over `data_parallel` replicas, the gradients
    copied into DDP's buckets; at the card's memory-bound rate `bandwidth`."""
    logits = tokens * dims.vocab / dims.head_split(tp)
    loss_forward = LOSS_FORWARD_BYTES_PER_LOGIT * logits / bandwidth
    loss = loss_forward + LOSS_BACKWARD_BYTES_PER_LOGIT * logits / bandwidth
    backward = ACCUMULATE_BYTES_PER_PARAM * params / bandwidth
    if dims.gated_mlp:
        merged = tokens * dims.layers * 2 * dims.ffn_width / tp
        backward += GLU_SPLIT_BACKWARD_BYTES * merged / bandwidth
    zeroed, copied = ZERO_BYTES_PER_PARAM * params, COPY_BACK_BYTES_PER_PARAM * optimizer_params
    bucketed = DDP_BUCKET_BYTES_PER_PARAM * params if data_parallel > 1 else 0.0
    return replace(
        work,
        loss_s=loss,
        forward_s=work.forward_s - work.loss_s / 3 + loss_forward,
        elementwise_s=work.elementwise_s + backward,
        optimizer_s=work.optimizer_s + (zeroed + copied + bucketed) / bandwidth,  # once a step
    )
