"""Context parallelism as the planner prices it: each sequence split over cp_size GPUs, every
activation a GPU keeps 1/cp of the sequence's (the planner plans the blocks at seq_len / cp), the
model states sharded by FSDP over the data-parallel and context-parallel ranks together (torchtitan's
`dp_shard_cp` mesh), and attention, which needs every earlier token, made whole one of two ways:

- all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023): before attention q, k and v are exchanged so
  that each GPU holds the whole sequence for heads / cp of the heads, after it the output goes back:
  four all-to-alls a layer in the forward, four in the backward (again in a recomputed forward),
  each GPU sending (cp-1)/cp of its part of the tensor, in the layer's critical path. NCCL runs an
  all-to-all as cp-1 sends and receives at once; its bytes a GPU are those of a ring all-gather of
  its part, and it is priced as that.
- ring (Ring Attention, Liu et al. 2023): attention over the whole sequence in cp sub-steps, one
  per shard of k and v, merged by their log-sum-exp, the shards reaching each GPU one of two ways:
  - passes (TransformerEngine's `p2p` exchange under Megatron-LM, torch's `alltoall` rotate method):
    cp-1 passes a layer, each sending this GPU's k and v to the next GPU while attention runs over
    the pair it holds; the backward passes k and v and their gradients. Hidden behind the attention
    it overlaps, exposed where the link is slower than the attention.
  - all-gather (torch's `allgather` rotate method, its default: `_ContextParallelOptions.rotate_method`
    in torch/distributed/tensor/experimental/_context_parallel/_attention.py, which torchtitan's
    `context_parallel_rotate_method` defaults to): `_AllGatherRotater` gathers every GPU's k and v in
    one all-gather, started beside the first sub-step (the local shard's attention) and waited on
    by the second, so only 1/cp of the attention hides it; the backward gathers them again the same
    way and passes the k and v gradients round the ring (its `dkv_rotater` is always all-to-all),
    hidden behind the backward's sub-steps; a recomputed forward gathers once more.

torch's ring (parabench's strategies and torchtitan's, not Megatron-LM's TransformerEngine ring) calls
SDPA with as many key and value heads as query heads, so its callers repeat grouped key/value heads to the
query heads first (models/hf_context_parallel.py `_ring`, torchtitan's Llama `repeat_kv`) and every shard
it gathers or passes is the query heads' width; its backward accumulates the k and v gradients in fp32
and passes them so (`_ContextParallelOptions.convert_to_f32`, True by default:
torch/distributed/tensor/experimental/_context_parallel/_attention.py). TransformerEngine's ring passes
the key/value heads themselves, its gradients in the activations' precision.

Attention's work: each GPU computes 1/cp of the whole sequence's causal attention (the chunks
load-balanced, as torchtitan's and Megatron's CP order them), at the kernel's rate for the whole
sequence's length.

Held against one rank of ring attention on an H200 (bench/ring_attention_rank.py,
bench/results/ring_attention_h200.md): its rounds' kernels and fp32 merges take 1.04x this share at
cp=1 and 1.11x at cp=8. torchtitan's published 8B runs at 128k (cp=4) and 256k (cp=8) run about
1.6x slower than planned, a gap one rank's compute does not explain: what the ring's passes cost
across cp GPUs is not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.common.hardware import GPUSpec
from harness.plan.model.model_shape import TransformerDims
from harness.plan.parallel.layout import LayoutError
from harness.plan.speed.attention import attention_seconds
from models.sequence_split import sequence_split_error
from strategies.parallel_dims import ModelFacts, context_heads_error

CP_ATTENTION = ("all-to-all", "ring")
# How a ring's k and v shards reach each GPU: torch's rotate methods (`cp_rotate`, torchtitan's
# experimental.context_parallel_rotate_method) and what the planner calls them.
CP_ROTATE = {"allgather": "all-gather", "alltoall": "passes"}
ULYSSES_EXCHANGES = 4  # q, k, v before attention, its output after


FP32_BYTES = 4  # torch's ring accumulates and passes the k and v gradients in fp32


@dataclass(frozen=True)
class ContextParallel:
    size: int  # cp_size: GPUs one sequence is split over
    attention: str  # all-to-all | ring
    rotate: str = "passes"  # a ring's k and v: passes | all-gather
    torch_ring: bool = False  # torch's ring: k and v at the query heads' width, their gradients in fp32

    def __post_init__(self) -> None:
        if self.attention not in CP_ATTENTION:
            raise LayoutError(f"cp_attention={self.attention!r} is not one of {', '.join(CP_ATTENTION)}")
        if self.rotate not in CP_ROTATE.values():
            raise LayoutError(f"cp_rotate={self.rotate!r} is not one of {', '.join(CP_ROTATE)}")


def context_parallel_of(
    options: dict,
    dims: TransformerDims | None,
    seq_len: int,
    tp: int,
    size: int,
    rotate: str = "passes",
    torch_ring: bool = False,
) -> ContextParallel:
    """Context parallelism over `size` GPUs (the layout's cp) as the strategy's options run it
    (cp_attention, and a ring's cp_rotate where given, else `rotate`: its engine's; `torch_ring`: a
    ring is torch's); a size that does not split the sequence, or, for all-to-all, the heads left on
    each tensor-parallel rank, is a one-line error."""
    attention = str(options.get("cp_attention") or "all-to-all").lower()
    named = options.get("cp_rotate")
    if named is not None and named not in CP_ROTATE:
        raise LayoutError(f"cp_rotate={named!r} is not one of {', '.join(CP_ROTATE)}")
    cp = ContextParallel(size, attention, CP_ROTATE[named] if named else rotate, torch_ring and attention == "ring")
    if size <= 1:
        return cp
    if dims is None:
        raise LayoutError("context parallelism needs a transformer the planner knows the attention of")
    # The runtime's rules and words: strategies/parallel_dims.py's heads, models/sequence_split.py's sequence.
    why = context_heads_error(size, ModelFacts(dims.layers, dims.heads, dims.kv_heads), tp, attention)
    why = why or sequence_split_error(seq_len, size, attention)
    if why is not None:
        raise LayoutError(why)
    return cp


def exchange_bytes(dims: TransformerDims, tokens: float, tp: int, element_bytes: int, size: int) -> float:
    """Bytes of one layer's forward all-to-alls on one GPU (its part of q, k, v and the output): k and v
    at least a head for each of the `size` GPUs, fewer key/value heads than GPUs each repeated first
    (models/all_to_all_attention.py `spread_kv_heads`)."""
    kv_heads = max(dims.kv_heads / tp, size)
    return tokens * (2 * dims.q_width / tp + 2 * kv_heads * dims.head_dim) * element_bytes


def ring_pass_bytes(dims: TransformerDims, tokens: float, tp: int, element_bytes: int, cp: ContextParallel) -> float:
    """Bytes of one ring pass in the forward: this GPU's k and v, at the query heads' width in torch's ring."""
    width = dims.q_width if cp.torch_ring else dims.kv_width
    return tokens * 2 * width * element_bytes / tp


def ring_gradient_bytes(pass_bytes: float, element_bytes: int, cp: ContextParallel) -> float:
    """Bytes of one ring pass of the k and v gradients in the backward: fp32 in torch's ring."""
    return pass_bytes * FP32_BYTES / element_bytes if cp.torch_ring else pass_bytes


def extra_attention_s(
    dims: TransformerDims,
    gpu: GPUSpec,
    kernel: str,
    precision: str,
    *,
    micro_batch: int,
    seq_len: int,
    cp: int,
    tp: int,
    layers: int,
    recompute: bool,
) -> float:
    """Attention a micro-step on one GPU computes beyond the blocks planned at seq_len / cp: 1/cp of
    the whole sequence's causal attention, less the local chunk's own that the plan already has."""
    heads = dims.heads // tp

    def seconds(seq: float) -> float:
        forward, backward = attention_seconds(
            gpu, kernel, precision, batch=micro_batch, seq=seq, heads=heads, head_dim=dims.head_dim
        )
        return forward * (2 if recompute else 1) + backward

    return layers * max(0.0, seconds(seq_len) / cp - seconds(seq_len / cp))
