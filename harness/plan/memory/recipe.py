"""How a run trains, beyond the strategy: the choices people make that change what a GPU holds.
Each is a plan option (`runner.py plan key=value`), off by default, planned as the library that
offers it does it (docs/planner.md cites each):

  pure_bf16          bf16 parameters, gradients and AdamW state, no fp32 master copy: torchtune's
                     full fine-tunes (`dtype: bf16`: the model is cast, and torch's AdamW keeps its
                     moments in the parameters' dtype). Torch-engine strategies only: DeepSpeed's
                     bf16 mode keeps its fp32 master whatever the model's dtype.
  megatron_mixed_precision  Megatron-LM's: bf16 (fp16) parameters the model computes with in
                     place, and in the optimizer an fp32 master copy beside fp32 moments, sharded
                     with them under the distributed optimizer (docs/source/distrib_optimizer.md).
                     The gradients stay in the parameters' dtype unless fp32_grad_accum is given too
                     (its `main_grad`): 6 bytes a parameter held whole + 12 over the data-parallel
                     ranks, 18 without the distributed optimizer. DeepSpeed holds this already.
  optimizer=adamw8bit  AdamW's two moments in 8 bits, block-wise quantized (bitsandbytes
                     AdamW8bit; torchao's AdamW8bit alike): one byte per element and one fp32 scale
                     per 256-element block per moment; tensors under 4,096 elements keep 32-bit
                     moments.
  tied_embeddings    the output head shares the embedding's weight (GPT-2, Gemma, Llama 3.2 1B/3B):
                     true drops a separate head from a model that has one, false adds one.
  qk_norm            an RMSNorm on each head's queries and keys before attention (OLMo 2, Qwen3,
                     Gemma 3): its saved input and statistics per token, and its elementwise work.
  fp32_grad_accum    gradients accumulated in fp32 buffers beside bf16 parameters (Megatron-LM's
                     `main_grad`, `accumulate_allreduce_grads_in_fp32`; DeepSpeed's
                     `data_types.grad_accum_dtype: fp32`): 4 bytes a gradient element where the
                     strategy would keep 2. The torch engine keeps fp32 gradients already.
  fp8_all_gather     FSDP2 gathers the blocks' fp8-cast weights, not bf16 (torchao's
                     `Float8LinearConfig(enable_fsdp_float8_all_gather=True)`): one byte a gathered
                     block-matrix element, in memory and on the wire. With precision=fp8 under a
                     torch-engine sharding strategy. Megatron-FSDP alike where Megatron-core's
                     weights are fp8 (`fp8_param_gather`: its weight buffer is uint8,
                     megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py @ 41eecc45).
  fp8_saved_inputs   with precision=fp8, the fp8 projections keep their inputs for the backward as
                     the fp8 cast (TransformerEngine's Linear and LayerNormLinear save it for the
                     weight gradient): one byte an element of each projection's input, where bf16
                     training keeps two, and a byte more for the output projection's, whose bf16
                     copy attention keeps for its own backward. torchao's Float8Linear saves the
                     bf16 input (`ctx.save_for_backward(input_hp, weight_hp_t)`): off for it.
  te_fp8             with precision=fp8, the projections' casts as TransformerEngine runs them under
                     Megatron-LM and NeMo (compute.py's te_fp8_cast_bytes): delayed scaling (no
                     amax pass), the casts fused into the norm and activation kernels, and the fp8
                     weights cast once a step, reused by every micro-batch (`is_first_microbatch`).
                     Off: torchao's float8 linears, which cast each weight every forward.
  fp8_block_scaling  with precision=fp8, MXFP8: a scale for every 32 elements, computed as each tensor
                     is cast (no amax pass over it first) and applied by the tensor cores at the fp8
                     rate (Blackwell's and CDNA4's); TransformerEngine's MXFP8BlockScaling writes the
                     rowwise and the columnwise cast of each tensor from one read (compute.py).
  fp8_attention      with precision=fp8 or fp4 and attention=cudnn, the attention itself in fp8
                     (TransformerEngine's fp8 DotProductAttention, `fp8_dpa`, as MLPerf's Llama
                     configs set FP8_DPA=1): cuDNN's fp8 kernel at its published rate, beside the
                     casts TransformerEngine adds (compute.py's fp8_attention_cast_bytes).
  activation_offload the saved activations copied to pinned host memory in the forward and back in
                     the backward (torchtune's `enable_activation_offloading`, its OffloadActivations
                     on a side stream): the GPU keeps two blocks' worth, the copies hide behind the
                     compute where PCIe keeps up.
  activation_offload_layers  Megatron-core's `cpu_offloading_num_layers` (TransformerEngine's CPU
                     offload context, as Megatron-Bridge's Grace-Blackwell recipes set it): that many
                     blocks' saved activations go to host memory and come back for their backward,
                     the others stay. The copies run on a side stream (TransformerEngine's
                     double-buffered handler), the last one out done before the forward ends, so
                     the peak holds the other blocks' alone (two at least: the last copy out and
                     the block computed meanwhile). Megatron refuses it beside
                     activation recomputation, beside a pipeline and at the model's whole depth, and
                     so does the plan.
  loss_in_place      with fused_loss=true, a cross-entropy that writes the logits' gradient over the
                     logits in its forward, so the head keeps them once, in the compute dtype
                     (TransformerEngine's parallel cross-entropy, Megatron-core's
                     cross_entropy_fusion_impl='te': transformer_engine/common/triton/cross_entropy.py
                     @ 42d22740 stores the gradient into its input; Megatron-Bridge's performance
                     recipes use it).
  fused_linear_loss  with fused_loss=true, the head's matmul and the cross-entropy run together a chunk
                     of tokens at a time, the logits' gradient turned into the hidden states' and the
                     head weight's gradients in the forward, so no whole logits are ever held: the
                     hidden states' gradient (a token's width) and one chunk's logits, Liger-Kernel's
                     chunk holding as many logits as the hidden states have elements (its chunk size
                     tokens x hidden / vocabulary: src/liger_kernel/ops/fused_linear_cross_entropy.py
                     @ ead96b61 `inc_factor`; Cut Cross-Entropy keeps less).
  attention_dropout  dropout on the attention's probabilities, hidden_dropout on each block's two
                     branch outputs, each a probability (Megatron-LM's defaults are 0.1 each, GPT-2's
                     configs alike; 0: none, as Llama-style recipes train): their masks in memory
                     (activations.py) and the bytes and kernels they add (speed/dropout.py).
  fragmentation      the share of the activations the caching allocator cannot hand out again at
                     large micro-batches (freed blocks of one size that the next allocation cannot
                     reuse): measured as a run's max reserved over max allocated, it is counted as
                     a buffer at the peak. 0 by default: the reference H100's runs lost nothing
                     beyond the allocator's 4% (capacity.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from harness.plan.model.model_shape import ModelShape, ParamTensor, PlanError

OPTIMIZERS = ("adamw", "adamw8bit")
EIGHT_BIT_BLOCK = 256  # elements per quantization block (bitsandbytes, torchao)
EIGHT_BIT_MIN_ELEMENTS = 4096  # smaller tensors keep 32-bit moments (bitsandbytes min_8bit_size, torchao alike)
OFFLOAD_BLOCKS_ON_GPU = 2  # the block being computed and the one in flight to or from the host
FRAGMENTATION_LIMIT = 1.0
# Megatron-core's `--recompute-modules` (recompute_granularity selective): what each recomputes in the
# backward instead of keeping (megatron/core/transformer/transformer_config.py): the core attention,
# the norms' outputs, the experts' SwiGLU, the whole MoE layer, the dense and shared FFNs, latent
# attention's up-projections (a model with latent attention only: mla_shape.py).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "moe", "mlp", "mla_up_proj")


@dataclass(frozen=True)
class Recipe:
    pure_bf16: bool = False
    megatron_mixed_precision: bool = False
    optimizer: str = "adamw"
    tied_embeddings: bool | None = None  # None: as the model is
    qk_norm: bool = False
    fp32_grad_accum: bool = False
    fp8_all_gather: bool = False
    fp8_saved_inputs: bool = False
    te_fp8: bool = False
    fp8_block_scaling: bool = False
    fp8_attention: bool = False
    activation_offload: bool = False
    activation_offload_layers: int = 0
    loss_in_place: bool = False
    fused_linear_loss: bool = False
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    fragmentation: float = 0.0
    # A mixture of experts: the busiest GPU's expert load over the mean (1.0: balanced, as published
    # Megatron-Bridge benchmarks force it), and Megatron-core's recomputed modules.
    moe_imbalance: float = 1.0
    recompute_modules: tuple[str, ...] = ()

    def check(self, precision: str) -> None:
        """One-line errors for choices that cannot go together."""
        if self.optimizer not in OPTIMIZERS:
            raise PlanError(f"optimizer={self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.fragmentation <= FRAGMENTATION_LIMIT:
            raise PlanError(
                f"fragmentation={self.fragmentation} must be a share of the activations in [0, 1]: a run's "
                "max reserved over max allocated, less one, at a large micro-batch"
            )
        if self.pure_bf16 and precision not in ("bf16", "fp8"):
            raise PlanError(f"pure_bf16=true keeps everything in bf16: give precision=bf16 (or fp8), not {precision}")
        if self.megatron_mixed_precision and self.pure_bf16:
            raise PlanError(
                "megatron_mixed_precision=true keeps an fp32 master copy, pure_bf16=true keeps none: give one of them"
            )
        if self.megatron_mixed_precision and precision not in ("bf16", "fp16", "fp8"):
            raise PlanError(
                f"megatron_mixed_precision=true holds bf16 or fp16 parameters: give precision=bf16, fp16 or fp8, "
                f"not {precision}"
            )
        if self.fp8_all_gather and precision != "fp8":
            raise PlanError("fp8_all_gather=true gathers the fp8 projections' weights: give precision=fp8 as well")
        if self.fp8_saved_inputs and precision not in ("fp8", "fp4"):
            raise PlanError("fp8_saved_inputs=true keeps the fp8 projections' inputs: give precision=fp8 as well")
        if self.te_fp8 and precision != "fp8":
            raise PlanError("te_fp8=true casts fp8 projections as TransformerEngine does: give precision=fp8 as well")
        if self.fp8_attention and precision not in ("fp8", "fp4"):
            raise PlanError("fp8_attention=true runs the attention under the fp8 recipe: give precision=fp8 as well")
        if not 1.0 <= self.moe_imbalance < math.inf:  # NaN fails both; infinity is no load to plan
            raise PlanError(
                f"moe_imbalance={self.moe_imbalance} is the busiest expert GPU's tokens over the mean: give 1.0 "
                "(balanced) or a finite number above it"
            )
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown:
            raise PlanError(
                f"recompute_modules: {', '.join(unknown)} is not a module the planner recomputes: give some of "
                f"{', '.join(RECOMPUTE_MODULES)} (Megatron-core's names)"
            )
        if self.activation_offload_layers < 0:
            raise PlanError(
                f"activation_offload_layers={self.activation_offload_layers} is a count of blocks whose activations go "
                "to host memory: give 0 or more"
            )
        if self.activation_offload and self.activation_offload_layers:
            raise PlanError(
                "activation_offload=true sends every block's activations to host memory, activation_offload_layers= "
                "that many blocks': give one of them"
            )
        for name in ("attention_dropout", "hidden_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise PlanError(f"{name}={getattr(self, name)} is a dropout probability: give 0 (none) up to below 1")
        if self.fp8_block_scaling and precision != "fp8":
            raise PlanError(
                "fp8_block_scaling=true is MXFP8's scaling of the fp8 projections: give precision=fp8 as well"
            )

    @property
    def low_precision_params(self) -> bool:
        """Whether the model's own parameters are bf16 (fp16) rather than fp32."""
        return self.pure_bf16 or self.megatron_mixed_precision

    def describe(self) -> list[str]:
        """The non-default choices, for the plan's header."""
        said = []
        if self.pure_bf16:
            said.append("pure bf16")
        if self.megatron_mixed_precision:
            said.append("Megatron mixed precision")
        if self.optimizer != "adamw":
            said.append(self.optimizer)
        if self.tied_embeddings is not None:
            said.append("tied embeddings" if self.tied_embeddings else "untied embeddings")
        if self.qk_norm:
            said.append("QK-norm")
        if self.fp32_grad_accum:
            said.append("fp32 gradient accumulation")
        if self.fp8_all_gather:
            said.append("fp8 all-gathers")
        if self.fp8_saved_inputs:
            said.append("fp8 saved inputs")
        if self.te_fp8:
            said.append("TransformerEngine fp8")
        if self.fp8_block_scaling:
            said.append("MXFP8")
        if self.fp8_attention:
            said.append("fp8 attention")
        if self.activation_offload:
            said.append("activations offloaded")
        if self.activation_offload_layers:
            said.append(f"{self.activation_offload_layers} blocks' activations offloaded")
        if self.loss_in_place:
            said.append("cross-entropy in place")
        if self.fused_linear_loss:
            said.append("head and cross-entropy fused in chunks")
        if self.attention_dropout or self.hidden_dropout:
            said.append(
                f"dropout {self.attention_dropout:g} on attention, {self.hidden_dropout:g} on the blocks' outputs"
            )
        if self.fragmentation:
            said.append(f"{self.fragmentation:.0%} fragmentation")
        if self.moe_imbalance != 1.0:
            said.append(f"expert load imbalance {self.moe_imbalance:g} (busiest over mean)")
        if self.recompute_modules:
            said.append(f"recomputed modules {', '.join(self.recompute_modules)}")
        return said


PLAIN = Recipe()  # every choice as the strategy makes it


def moment_bytes(tensors: list[int], optimizer: str, dtype_bytes: int = 4) -> float:
    """Bytes of AdamW's two moments over tensors of these element counts."""
    if optimizer == "adamw":
        return 2 * dtype_bytes * sum(tensors)
    total = 0.0
    for n in tensors:
        if n < EIGHT_BIT_MIN_ELEMENTS:
            total += 2 * 4 * n
        else:
            total += 2 * (n + 4 * math.ceil(n / EIGHT_BIT_BLOCK))
    return total


def with_tied_embeddings(shape: ModelShape, tied: bool | None) -> ModelShape:
    """`shape` with its output head tied to the embedding (or a separate one), where it has the sizes."""
    if tied is None or shape.dims is None or shape.tensors is None:
        return shape
    square = (shape.dims.vocab, shape.dims.width)
    root = [i for i, t in enumerate(shape.tensors) if t.block is None and t.shape == square]
    head = shape.dims.vocab * shape.dims.width
    if tied and len(root) >= 2:
        tensors = tuple(t for i, t in enumerate(shape.tensors) if i != root[-1])
        return replace(shape, tensors=tensors, params=shape.params - head, flops_params=shape.flops_params - head)
    if not tied and len(root) == 1:
        tensors = (*shape.tensors, ParamTensor(square, None))
        return replace(shape, tensors=tensors, params=shape.params + head, flops_params=shape.flops_params + head)
    return shape
