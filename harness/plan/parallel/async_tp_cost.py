"""Async tensor parallelism as the planner prices it (`strategy_options.async_tp=true` on a
tensor-parallel strategy; torchtitan's `enable_async_tensor_parallel`).

Under torch.compile, Inductor's micro-pipeline pass (torch/_inductor/fx_passes/micro_pipeline_tp.py)
replaces an all-gather whose result is the left operand of matmuls by
`symm_mem.fused_all_gather_matmul`, and the reduce-scatter of one matmul's output by
`symm_mem.fused_matmul_reduce_scatter` (torch/distributed/_symmetric_memory/__init__.py). Each cuts
its matmul along the tokens into tp pieces, and moves the collective's bytes as copies out of the
peers' symmetric-memory buffers over NVLink, one peer after another, on the copy engines (no SMs),
each beside a piece's matmul:

- all-gather + matmul (`_pipelined_all_gather_and_consume`): this GPU's shard copied into its
  buffer first (exposed), then the local piece beside the first peer's copy, each peer's piece
  once its shard has landed;
- matmul + reduce-scatter (`_pipelined_produce_and_all2all`): each peer's piece computed into the
  buffer and pulled by that peer while the next one computes, the own piece last; then the tp
  partial results summed, a memory-bound kernel that reads the whole output and writes its shard.

With c one piece's matmuls and p one shard's copy, either pipeline takes max(tp c, c + (tp-1) p), a
two-stage flow shop whose first piece needs no copy: the copies hide where a piece outlasts a copy,
else the pieces wait on them. Beside the whole matmul the compute model already counts, a fused
collective adds the pieces' own cost (tp kernels of a smaller shape, gemm.py), the local copy or
the sum, and the copies the pieces do not hide; the NCCL collective it replaces, and DTensor's
copy along the sequence around it (comm.py's local_copy_bytes), are gone. The fused all-gather
returns the gathered tensor, and its matmuls' outputs, shard by shard: sequence-major, as its
meta function says (`A.movedim(0, gather_dim)`). Elementwise kernels read that as it is, but a
weight gradient contracts over the tokens in batch-major order, so where a micro-batch holds
more than one sequence each gathered tensor a weight gradient reads is copied once into that
order: a block's attention and MLP inputs, and wo's and w2's output gradients. The fused
reduce-scatter wants its matmul's input sequence-major too (`restride_A_for_fused_matmul_reduce_scatter`):
free where Inductor's own kernel writes it (w2's input, an fp8 cast), a copy of wo's input, the
attention kernel's output, otherwise.

What the pass fuses in a block (torchtitan's Llama plan, sequence parallel): in the forward, the
attention's input gathered into wq, wk, wv (one fused op, several right operands), wo's output
scattered, the MLP's input gathered into w1 (and w3), w2's output scattered; a recomputed forward
the same (selective checkpointing: each recomputed gather into the matmuls it recomputes; one
with none stays NCCL's); in the backward, the gradients of wo's and w2's outputs gathered into
their input gradients. Not fused, so NCCL's and in the critical path as vanilla tensor
parallelism's: the backward's reduce-scatters of the attention's and the MLP's input gradients
(each the sum of several projections' input gradients, where the pass needs one matmul's output),
and the head's and the embedding's collectives, which run outside the compiled graphs (torchtitan,
like parabench's strategies/base.py compile_blocks, compiles each block, not the whole model).

The copies run at the rate NCCL's ring sustains on the same links (fabric.py: 0.80 of NVLink):
each brings one peer's shard into this GPU over its own NVLink ports, as a ring's step does. They
take no SMs, but while they run a shard is written into this GPU's memory and another read out of
it for a peer: COPY_MEMORY_PASSES times their bytes, the share of the memory the pieces beside them
lose, as step_time.py prices compute beside NCCL's collectives (there three passes and 16 SMs).
Symmetric memory maps the peers' memory over NVLink, so a tensor-parallel group wider than a node
is a one-line error, as is a plan without compile=true (torchtitan refuses async TP without it) or
without sequence parallelism (whose gathers and scatters are what is fused).

Not modelled: the barrier between steps (one signal over NVLink each), the symmetric-memory
workspace (two pieces' output, allocated outside torch's caching allocator).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.plan.model.model_shape import TransformerDims
from harness.plan.parallel.backends import Backend
from harness.plan.parallel.layout import Layout, LayoutError
from harness.plan.speed.compute import block_projections, recomputed

ASYNC_TP = "async_tp"
# A copied shard is written into this GPU's memory while a peer reads this GPU's own shard out of it.
COPY_MEMORY_PASSES = 2
PHASES = ("forward", "again", "backward")

# Seconds of a matmul (m x k) by (k x n), as the blocks' projections run.
Matmul = Callable[[float, float, float], float]


@dataclass(frozen=True)
class Fused:
    """One collective of every block that the pass pipelines with its matmuls."""

    kind: str  # all-gather | reduce-scatter
    phase: str  # forward | again (checkpointing's recomputed forward) | backward
    matmuls: tuple[tuple[int, int], ...]  # (n, k) of each matmul, over the collective's tokens: tokens x n, inner k
    restrided: bool = False  # its matmul's input, written by the attention kernel, is copied sequence-major

    def element_bytes(self, held: int, fp8: bool) -> int:
        """Bytes per element on the wire: torchao's float8 gathers the inputs and the output
        gradients cast to fp8; reduce-scatters stay in the compute dtype."""
        return 1 if fp8 and self.kind == "all-gather" else held


def async_tp_of(backend: Backend, layout: Layout, compiled: bool) -> bool:
    """Whether `backend` runs its tensor parallelism asynchronously (its async_tp option), checked
    against what the fused ops need; False without tensor parallelism, as tp_size is left there."""
    value = backend.options.get(ASYNC_TP, False)
    if not isinstance(value, bool):
        raise LayoutError(f"{backend.name}: async_tp={value!r} must be true or false")
    if not value or layout.tp <= 1:
        return False
    if layout.tp_group.nodes > 1:
        raise LayoutError(
            f"{backend.name}: async_tp needs the tensor-parallel group inside one node (symmetric memory maps the "
            f"peers' memory over NVLink), and tp_size={layout.tp} spans {layout.tp_group.nodes} nodes: use a tp_size "
            f"of at most {layout.tp_group.per_node}"
        )
    if not compiled:
        raise LayoutError(
            f"{backend.name}: async_tp=true needs compile=true: Inductor's micro-pipeline pass is what fuses the "
            "tensor-parallel collectives with their matmuls"
        )
    if not backend.sequence_parallel:
        raise LayoutError(
            f"{backend.name}: async_tp pipelines sequence parallelism's all-gathers and reduce-scatters: "
            "give sequence_parallel=true"
        )
    return True


def fused_collectives(dims: TransformerDims, tp: int, checkpointing: str) -> list[Fused]:
    """The tensor-parallel collectives of one micro-step that the pass fuses with matmuls (the
    module's account), as one of `tp` GPUs runs them."""
    projections = block_projections(dims, tp)
    attention_inputs = 1 if dims.fused_qkv else 3
    out_proj, down = attention_inputs, len(projections) - 1
    gathers = (range(attention_inputs), range(out_proj + 1, down))  # the attention's, the MLP's inputs
    scatters = (out_proj, down)
    fused: list[Fused] = []
    for phase in ("forward", "again"):
        for inputs in gathers:
            consumers = tuple(
                (projections[i][0], projections[i][1])
                for i in inputs
                if phase == "forward" or recomputed(i, checkpointing)
            )
            if consumers:
                fused.append(Fused("all-gather", phase, consumers))
        if phase == "forward" or checkpointing == "full":  # selective keeps the scattered outputs
            fused += [Fused("reduce-scatter", phase, (projections[i],), restrided=i == out_proj) for i in scatters]
    # Backward: each row-parallel projection's output gradient gathered into its input gradient.
    fused += [Fused("all-gather", "backward", ((projections[i][1], projections[i][0]),)) for i in scatters]
    return fused


@dataclass(frozen=True)
class AsyncTensorParallel:
    """What async tensor parallelism's fused collectives cost one micro-step, beyond the whole
    matmuls the compute model counts."""

    forward_s: float  # compute the forward's fused ops add: the pieces, the local copies, the sums
    backward_s: float  # the same in the backward, checkpointing's recomputed forward included
    exposed_s: float  # copies no piece hides
    hidden_s: float  # copies beside the pieces
    copy_bytes_per_s: float  # the rate a copy moves a shard at

    def contention(self, memory_bytes_per_s: float) -> float:
        """Seconds the pieces lose to the copies beside them: no SMs, but COPY_MEMORY_PASSES times
        the copies' bytes through the GPU's memory, the memory share of step_time.py's contention."""
        return self.hidden_s * min(1.0, COPY_MEMORY_PASSES * self.copy_bytes_per_s / memory_bytes_per_s)


def weight_gradient_gathers(fused: list[Fused], checkpointing: str) -> list[Fused]:
    """The fused all-gathers whose gathered tensor a weight gradient reads: a block input's last
    gather (checkpointing's recomputed one, where it recomputes them) and the backward's."""
    read = "forward" if checkpointing == "none" else "again"
    return [f for f in fused if f.kind == "all-gather" and f.phase in (read, "backward")]


def async_tp_cost(
    fused: list[Fused],
    *,
    layers: int,
    micro_batch: int,
    seq_len: int,
    tp: int,
    width: int,
    checkpointing: str,
    matmul: Matmul,
    copy_bytes_per_s: float,
    memory_bytes_per_s: float,
    held_bytes: int,
    fp8: bool,
) -> AsyncTensorParallel:
    """The pipelines of `fused` (fused_collectives) over a micro-step of micro_batch x seq_len tokens
    on one of `tp` GPUs (the module's account); `width` elements per token cross the wire."""
    tokens = micro_batch * seq_len
    piece = tokens / tp
    added = dict.fromkeys(PHASES, 0.0)
    exposed = hidden = 0.0
    for f in fused:
        whole = sum(matmul(tokens, n, k) for n, k in f.matmuls)
        c = sum(matmul(piece, n, k) for n, k in f.matmuls)
        shard = piece * width * f.element_bytes(held_bytes, fp8)
        p = shard / copy_bytes_per_s
        waited = max(0.0, (tp - 1) * (p - c))  # the pipeline's max(tp c, c + (tp-1) p) beyond tp c
        if f.kind == "all-gather":
            side = 2 * shard  # the local shard read and written into the symmetric buffer
        else:
            side = (tokens + piece) * width * held_bytes  # the partial results read, the shard written
            if f.restrided and not fp8:
                side += 2 * tokens * f.matmuls[0][1] * held_bytes
        added[f.phase] += layers * (tp * c - whole + side / memory_bytes_per_s)
        exposed += layers * waited
        hidden += layers * ((tp - 1) * p - waited)
    if micro_batch > 1:  # sequence-major gathered tensors copied for the weight gradients (the module's account)
        for f in weight_gradient_gathers(fused, checkpointing):
            moved = 2 * tokens * width * f.element_bytes(held_bytes, fp8)
            added["backward"] += layers * moved / memory_bytes_per_s
    return AsyncTensorParallel(added["forward"], added["again"] + added["backward"], exposed, hidden, copy_bytes_per_s)
