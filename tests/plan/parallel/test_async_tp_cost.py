"""Async tensor parallelism in the plan (harness/plan/parallel/async_tp_cost.py): which of a block's
tensor-parallel collectives Inductor's micro-pipeline pass fuses with matmuls, what the pipeline of
tp pieces and peer copies costs beyond the whole matmul (the copies no piece hides, the pieces'
own cost, the local copy or the partials' sum, the sequence-major copies for the weight
gradients, the copies' share of the memory), and the option's checks."""

from __future__ import annotations

import pytest

from harness.plan.model.model_shape import TransformerDims
from harness.plan.network.comm import PIPELINED
from harness.plan.parallel.async_tp_cost import (
    COPY_MEMORY_PASSES,
    AsyncTensorParallel,
    Fused,
    async_tp_cost,
    fused_collectives,
)
from harness.plan.parallel.layout import LayoutError
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy

LLAMA = TransformerDims(4, 1024, 16, 64, 4, 2816, 32000, gated_mlp=True, fused_qkv=False, rms_norm=True, rotary=True)
GPT = TransformerDims(4, 1024, 16, 64, 16, 4096, 50304)
RATE = 1e15  # flop/s of the synthetic matmuls: time exactly proportional to the flops


def _linear(launch: float = 0.0):
    return lambda m, n, k: launch + 2 * m * n * k / RATE


def _cost(fused: list[Fused], *, tp: int = 4, micro_batch: int = 1, launch: float = 0.0, copy: float = 1e11):
    return async_tp_cost(
        fused,
        layers=3,
        micro_batch=micro_batch,
        seq_len=4096,
        tp=tp,
        width=1024,
        checkpointing="none",
        matmul=_linear(launch),
        copy_bytes_per_s=copy,
        memory_bytes_per_s=2e12,
        held_bytes=2,
        fp8=False,
    )


def test_a_piece_that_outlasts_its_copy_hides_it_else_the_pieces_wait_on_the_copies() -> None:
    tokens, tp, layers = 4096, 4, 3
    shard = tokens / tp * 1024 * 2
    local_copy = layers * 2 * shard / 2e12  # the shard into the symmetric buffer, read and written
    wide = Fused("all-gather", "forward", ((8192, 1024),))  # c = 17 us a piece, p = 21 us a copy at 100 GB/s
    piece, copy = 2 * tokens / tp * 8192 * 1024 / RATE, shard / 1e11
    assert copy > piece
    cost = _cost([wide])
    # max(tp c, c + (tp-1) p): the copies are the slower, and tp-1 of them are waited for beyond the pieces.
    assert cost.exposed_s == pytest.approx(layers * (tp - 1) * (copy - piece))
    assert cost.hidden_s == pytest.approx(layers * (tp - 1) * piece)
    # Pieces that take exactly the whole matmul's time add only the local copy.
    assert cost.forward_s == pytest.approx(local_copy)
    fast = _cost([wide], copy=1e13)  # a copy a hundredth of a piece: every copy hidden
    assert fast.exposed_s == 0.0
    assert fast.hidden_s == pytest.approx(layers * (tp - 1) * shard / 1e13)


def test_cutting_a_matmul_into_tp_pieces_costs_a_kernel_each() -> None:
    layers, tp, launch = 3, 4, 6e-6
    scatter = Fused("reduce-scatter", "backward", ((1024, 2048),))
    with_launch = _cost([scatter], tp=tp, launch=launch)
    without = _cost([scatter], tp=tp)
    assert with_launch.backward_s - without.backward_s == pytest.approx(layers * (tp - 1) * launch)
    # The reduce-scatter's sum: the tp partial outputs read, the shard written.
    assert without.backward_s == pytest.approx(layers * (4096 + 4096 / tp) * 1024 * 2 / 2e12)
    assert without.forward_s == 0.0


def test_which_collectives_the_pass_fuses_by_checkpointing() -> None:
    def count(fused: list[Fused]) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for f in fused:
            out[(f.kind, f.phase)] = out.get((f.kind, f.phase), 0) + 1
        return out

    none = count(fused_collectives(LLAMA, 8, "none"))
    # Forward: two gathers (into q, k, v and into w1, w3) and two scatters (after wo and w2); backward:
    # the output gradients of wo and w2 gathered, the input gradients' scatters left to NCCL.
    assert none == {("all-gather", "forward"): 2, ("reduce-scatter", "forward"): 2, ("all-gather", "backward"): 2}
    full = count(fused_collectives(LLAMA, 8, "full"))
    assert full == {**none, ("all-gather", "again"): 2, ("reduce-scatter", "again"): 2}
    selective = fused_collectives(LLAMA, 8, "selective")
    again = [f for f in selective if f.phase == "again"]
    # torchtitan's policy recomputes wk and w3 (every second matmul), and keeps the scattered outputs.
    assert [f.kind for f in again] == ["all-gather", "all-gather"]
    assert [f.matmuls for f in again] == [((4 * 64 // 8, 1024),), ((2816 // 8, 1024),)]
    q, k, v = (1024 // 8, 1024), (256 // 8, 1024), (256 // 8, 1024)
    assert fused_collectives(LLAMA, 8, "none")[0].matmuls == (q, k, v)  # one fused op, three right operands
    # GPT-2's selective recomputes wo and the MLP's second matmul: its recomputed gathers feed kept
    # matmuls (qkv, the MLP's first), so they stay NCCL's.
    assert [f for f in fused_collectives(GPT, 8, "selective") if f.phase == "again"] == []


def test_sequence_major_gathers_are_copied_for_the_weight_gradients_when_a_micro_batch_has_several_sequences() -> None:
    fused = fused_collectives(LLAMA, 4, "none")
    one, two = _cost(fused, micro_batch=1), _cost(fused, micro_batch=2)
    gathers_read = 2 + 2  # the attention's and the MLP's inputs, wo's and w2's output gradients
    copies = 3 * gathers_read * 2 * (2 * 4096) * 1024 * 2 / 2e12
    # Everything else scales with the tokens; the copies come on top at two sequences.
    assert two.backward_s - 2 * one.backward_s == pytest.approx(copies)


def test_the_copies_slow_the_pieces_by_their_share_of_the_memory() -> None:
    cost = AsyncTensorParallel(0.0, 0.0, exposed_s=0.0, hidden_s=2.0, copy_bytes_per_s=300e9)
    assert cost.contention(3e12) == pytest.approx(2.0 * COPY_MEMORY_PASSES * 300e9 / 3e12)
    assert cost.contention(100e9) == 2.0  # at most the whole time the copies run


LLAMA_8B = dict(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, arch="llama", seq_len=8192)


@pytest.fixture(scope="module")
def vanilla_and_async():
    def plan(**options):
        cfg = PlanConfig(
            **LLAMA_8B,
            gpus=16,
            micro_batch=4,
            compile=True,
            activation_checkpointing="full",
            strategy_options={"tp_size": 8, **options},
        )
        return plan_strategy("fsdp-tp", question(cfg))

    return plan(), plan(async_tp=True)


def test_async_tp_hides_most_tensor_parallel_traffic_and_leaves_the_backward_scatters_exposed(vanilla_and_async):
    vanilla, fused = vanilla_and_async
    assert fused.time.tokens_per_s > vanilla.time.tokens_per_s
    assert fused.time.exposed_comm_s < vanilla.time.exposed_comm_s / 2
    tp = {(c.kind, c.window): c for c in fused.collectives if c.what.startswith("tensor-parallel")}
    layers = LLAMA_8B["layers"]
    # Left to NCCL: each block's two backward scatters, and the head's and the embedding's gather and scatter.
    assert tp[("reduce-scatter", None)].calls == 2 * layers + 2
    assert tp[("all-gather", None)].calls == 2
    pipelined = tp[("reduce-scatter", PIPELINED)].calls + tp[("all-gather", PIPELINED)].calls
    assert pipelined == 10 * layers  # forward and recomputed forward 4 each, the backward's 2 gathers
    # Same bytes on the wire; the copy engines' busy time replaces NCCL's.
    assert fused.time.wire_bytes == pytest.approx(vanilla.time.wire_bytes)
    # Memory is the vanilla layout's: the symmetric-memory workspace is not modelled.
    assert fused.peak_bytes == vanilla.peak_bytes


def test_async_tp_needs_compile_a_group_inside_a_node_and_sequence_parallel() -> None:
    def plan(gpus_per_node: int = 8, compile: bool = True, **options):
        cfg = PlanConfig(
            **LLAMA_8B,
            gpus=16,
            gpus_per_node=gpus_per_node,
            micro_batch=1,
            compile=compile,
            strategy_options={"tp_size": 8, **options},
        )
        return plan_strategy("fsdp-tp", question(cfg))

    with pytest.raises(LayoutError, match="needs compile=true"):
        plan(compile=False, async_tp=True)
    with pytest.raises(LayoutError, match="inside one node"):
        plan(gpus_per_node=4, async_tp=True)
    with pytest.raises(LayoutError, match="sequence_parallel=true"):
        plan(async_tp=True, sequence_parallel=False)
    with pytest.raises(LayoutError, match="must be true or false"):
        plan(async_tp="yes")
    # Without tensor parallelism the option is left, as tp_size is.
    cfg = PlanConfig(**LLAMA_8B, gpus=16, micro_batch=1, strategy_options={"async_tp": True})
    assert (
        plan_strategy("fsdp", question(cfg)).time
        == plan_strategy("fsdp", question(PlanConfig(**LLAMA_8B, gpus=16, micro_batch=1))).time
    )


def test_userbuffers_run_the_scattered_gemms_on_the_sms_they_leave() -> None:
    """TransformerEngine's tp_comm_overlap (a published Megatron run's): the forward's output and
    down projections run on the SMs their pipelined reduce-scatter leaves (24 and 16 of them)."""
    scatter = [f for f in fused_collectives(LLAMA, 4, "none") if f.kind == "reduce-scatter" and f.phase == "forward"]
    common = dict(layers=3, micro_batch=1, seq_len=4096, tp=4, width=1024, checkpointing="none", matmul=_linear())
    rates = dict(copy_bytes_per_s=1e11, memory_bytes_per_s=2e12, held_bytes=2, fp8=False)
    torch_pass = async_tp_cost(scatter, **common, **rates)
    userbuffers = async_tp_cost(scatter, **common, **rates, sms=132)
    whole = {f.restrided: sum(_linear()(4096, n, k) for n, k in f.matmuls) for f in scatter}
    margin = whole[True] * 24 / (132 - 24) + whole[False] * 16 / (132 - 16)
    assert userbuffers.forward_s - torch_pass.forward_s == pytest.approx(3 * margin)
