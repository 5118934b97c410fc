"""Temporary memory each backend allocates beside the model states and activations, named
after the buffer, with the phase in which it is alive.

torch engine: autocast's bf16 copies of every matmul weight (cached from forward until
each layer's backward); DDP's gradient buckets when .grad is not a view into them; FSDP2's
gathered parameters (the root for the whole step, a block in use plus one prefetched, or
every block when it does not reshard after forward) and one block's reduce-scatter (made by that
block's backward, so alive once the head's backward has freed the loss's buffers); FSDP2's
replicate (ddp-tp, zero1-tp) alike, its units copied on one rank and kept until their backward.
Megatron-FSDP (megatron/core/distributed/fsdp @ 41eecc45): its units are the transformer layers
alone (mcore_fsdp_adapter.py: fsdp_unit_modules=[TransformerLayer] under optim_grads_params), so the
embedding, the final norm and the output layer are gathered in their forward and released by no hook
(megatron_fsdp.py registers the release after forward and backward on the units only): gathered for
the step, as FSDP2's root. The units' gathered weights and their gradients for the reduce-scatter
each take two units' buffers (the one in use and the next; `fsdp_double_buffer`'s FixedPoolAllocator
holds exactly two, param_and_grad_buffer.py), gathered in fp8 where the model's weights are fp8
(`fp8_param_gather`: a uint8 weight buffer). The output layer's weight gradient (its own tensor, or
its gradient bucket under gradient accumulation fusion) is made beside the logits' gradient at the
start of the backward.
DeepSpeed: ZeRO-1/2's reduction bucket(s) (two with overlap_comm; allocated by the first
gradient hook, once the loss's buffers are freed), ZeRO-1's whole
gradients while accumulating, the fp32 gradient built for the optimizer step; ZeRO-3's
gathered blocks (the one in use plus its prefetch bucket). What the strategies' own
memory_breakdown already counts (ZeRO-3's reduction bucket and whole-kept parameters, the
offload staging buffers) is part of the model states instead (memory.py), not repeated here.
Tensor parallelism divides each of these by tp (every GPU holds its slice); hybrid sharding
gathers inside its shard group; torch.nn.DataParallel holds the replicas' gathered logits and
their loss on GPU 0. Not modelled: what DeepSpeed stages on the GPU for parameter offload beyond
the gathered parameters (zero3-offload measured 0.3 GB, 7.6%, above the model on an H100 at
gpt2-124m micro-batch 4); a calibration from a compare adds what it measured (calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.plan.memory.activations import LOSS_BYTES_PER_LOGIT
from harness.plan.memory.model_states import BYTES, compute_bytes
from harness.plan.memory.recipe import PLAIN, Recipe
from harness.plan.model.model_shape import ModelShape
from harness.plan.parallel.backends import MEGATRON_FSDP, Backend
from harness.plan.parallel.layout import Layout


@dataclass(frozen=True)
class Buffers:
    backward: dict[str, int] = field(default_factory=dict)  # alive at the start of backward, beside the activations
    # Allocated by the first gradient hook: the loss's buffers over the vocabulary are freed by then.
    hooks: dict[str, int] = field(default_factory=dict)
    step: dict[str, int] = field(default_factory=dict)  # alive during the optimizer step
    # Gradients allocated through the whole step (DDP's buckets, DeepSpeed's flat partitions)
    # rather than made in backward and freed by zero_grad(set_to_none=True).
    grads_resident: bool = False


def matmul_weights(shape: ModelShape) -> int:
    """Elements of the weights matmuls read: every block matrix and the output head."""
    head = shape.dims.vocab * shape.dims.width if shape.dims else 0
    if shape.tensors is None:
        return sum(shape.block_params()) + head
    return sum(t.numel for t in shape.tensors if t.block is not None and len(t.shape) >= 2) + head


def _torch_buffers(
    shape: ModelShape, backend: Backend, precision: str, layout: Layout, grad_accum: int, recipe: Recipe
) -> Buffers:
    if recipe.megatron_mixed_precision and backend.stage < 3:
        # Megatron-LM's DDP: the model computes with its own bf16 parameters, whole, and reduces
        # its contiguous gradient buffer (the states' gradients, alive through the step) in place.
        return Buffers(grads_resident=True)
    backward: dict[str, int] = {}
    tp = layout.tp
    blocks = [b // tp for b in shape.block_params()]
    if backend.stage == 0 and not backend.fsdp2_units:
        if precision != "fp32" and backend.mixed_precision == "autocast":
            backward["autocast weight copies"] = matmul_weights(shape) // tp * BYTES[precision]
        ddp = backend.ddp_wrapped(layout.data_parallel)
        if ddp and not backend.option("gradient_as_bucket_view"):
            grad_bytes = 2 if recipe.pure_bf16 and not recipe.fp32_grad_accum else 4
            backward["DDP gradient buckets (besides .grad)"] = shape.params // tp * grad_bytes
        return Buffers(backward=backward, grads_resident=ddp)
    unsharded = compute_bytes(precision)
    backward["root parameters gathered for the step"] = shape.root_params() // tp * unsharded
    if backend.options.get(MEGATRON_FSDP) and shape.dims is not None:
        head = shape.dims.vocab * shape.dims.width // tp
        backward["the output layer's weight gradient, beside the logits' gradient"] = head * unsharded
    largest = max(blocks) if blocks else 0
    # torchao's fp8 all-gather, Megatron-FSDP's fp8 weights: a block's matrices arrive as fp8, one byte an element.
    share = fp8_block_share(shape) if recipe.fp8_all_gather else 0.0
    per_element = share * 1 + (1 - share) * unsharded
    if backend.reshard_after_forward:
        # FSDP2 prefetches one block by itself; strategy_options.prefetch_blocks=n keeps n ahead.
        in_flight = 1 + max(1, int(backend.options.get("prefetch_blocks") or 0))
        backward["blocks gathered (in use + prefetched)"] = int(in_flight * largest * per_element)
    else:
        backward["every block kept gathered until backward"] = int(sum(blocks) * per_element)
    reduce_bytes = 4 if backend.reduce_in_fp32 or precision == "fp32" else BYTES[precision]
    # A block's gradients come with its own backward, after the head's: the first gradient hook's buffer.
    hooks = {"one block's unsharded gradients and reduce-scatter input": largest * (unsharded + reduce_bytes)}
    if grad_accum > 1 and not backend.sharded_grads_every_micro_step:
        # Without gradient sync FSDP2 keeps each block's unsharded gradient until the last micro-step.
        backward["unsharded gradients kept while accumulating"] = shape.params // tp * reduce_bytes
    return Buffers(backward=backward, hooks=hooks)


def fp8_block_share(shape: ModelShape) -> float:
    """The share of the blocks' parameters in their projections' matrices, which torchao casts to fp8."""
    blocks = sum(shape.block_params())
    head = shape.dims.vocab * shape.dims.width if shape.dims else 0
    return min(1.0, (matmul_weights(shape) - head) / blocks) if blocks else 0.0


def _deepspeed_buffers(
    shape: ModelShape, backend: Backend, precision: str, layout: Layout, grad_accum: int, recipe: Recipe
) -> Buffers:
    low = BYTES[precision]
    backward: dict[str, int] = {}
    step: dict[str, int] = {}
    part = -(-shape.params // (layout.shard * layout.tp))
    if backend.stage == 3:
        blocks = shape.block_params()
        largest = max(blocks) if blocks else shape.params
        # Backward starts at the head: its weight gathered again and its whole gradient made
        # before the reduction (GPT-2's head is the 38.6M-parameter embedding); past the head,
        # one block at a time. DeepSpeed prefetches up to its bucket of parameters ahead.
        head = max((t.numel for t in shape.tensors or () if t.block is None), default=0)
        prefetch = min(int(backend.option("stage3_prefetch_bucket_size")), max(shape.params - largest, 0))
        backward["gathered parameters in use (the head's, with its gradient) + prefetch bucket"] = (
            max(2 * head, largest) + prefetch
        ) * low
        if not backend.offload_optimizer:
            step["fp32 gradient of one optimizer sub-group"] = min(part, int(backend.option("sub_group_size"))) * 4
        return Buffers(backward=backward, step=step, grads_resident=True)
    buckets = 2 if backend.option("overlap_comm") else 1
    hooks = {
        "gradient reduction bucket" + ("s" if buckets > 1 else ""): buckets
        * int(backend.option("reduce_bucket_size"))
        * low
    }
    if backend.stage == 1 and grad_accum > 1:
        # ZeRO-1 reduces only in the last micro-step's backward: until then every gradient is whole.
        backward["whole gradients accumulated between micro-steps"] = shape.params * (
            4 if recipe.fp32_grad_accum else low
        )
    if not backend.offload_optimizer:
        step["fp32 gradient partition for the step"] = part * 4
    return Buffers(backward=backward, hooks=hooks, step=step, grads_resident=True)


def _gathered_logits(shape: ModelShape, precision: str, layout: Layout, tokens: int) -> dict[str, int]:
    """torch.nn.DataParallel: every replica's logits land on GPU 0, where the loss runs over them."""
    if layout.data_parallel <= 1 or shape.dims is None:
        return {}
    logits = (layout.data_parallel - 1) * tokens * shape.dims.vocab
    return {"replicas' logits and their loss on GPU 0": logits * (compute_bytes(precision) + LOSS_BYTES_PER_LOGIT)}


def backend_buffers(
    shape: ModelShape,
    backend: Backend,
    precision: str,
    layout: Layout,
    grad_accum: int,
    tokens: int = 0,
    recipe: Recipe = PLAIN,
) -> Buffers:
    """The buffers of `backend` beside the model states; `tokens` per micro-step."""
    if backend.engine == "deepspeed":
        return _deepspeed_buffers(shape, backend, precision, layout, grad_accum, recipe)
    buffers = _torch_buffers(shape, backend, precision, layout, grad_accum, recipe)
    if backend.replicas == "threads":
        gathered = _gathered_logits(shape, precision, layout, tokens)
        return Buffers({**buffers.backward, **gathered}, hooks=buffers.hooks, grads_resident=True)
    return buffers
