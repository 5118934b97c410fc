"""DeepSpeed ZeRO-3's parameter gathers as its coordinator runs them: a module at a time, the next
one prefetched beside the compute while the gathered parameters stay under
stage3_max_live_parameters; FSDP a block at a time."""

from __future__ import annotations

import pytest

from harness.plan.network.comm import Fetches
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy

LLAMA_8B = dict(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, arch="llama", seq_len=4096)
# Two blocks of a 1T GPT (DeepSpeed's Azure post): each MLP matrix holds 2.6e9 elements, over the 1e9 limit.
WIDE = dict(layers=2, width=25600, heads=160, ffn=102400, vocab=50304, seq_len=1024)


def _plan(strategy: str, model: dict, gpus: int = 16):
    config = PlanConfig(**model, gpus=gpus, micro_batch=1, strategies=[strategy])
    return plan_strategy(strategy, question(config))


def _gathers(plan, window: str):
    return [c for c in plan.collectives if c.what.startswith(f"all-gather parameters ({window})")]


def test_zero3_gathers_each_matrix_as_its_module_runs():
    zero3, fsdp = _plan("zero3", LLAMA_8B), _plan("fsdp", LLAMA_8B)
    [forward] = _gathers(zero3, "forward")
    [per_block] = _gathers(fsdp, "forward")
    # Seven matrices a block and the embedding and head, against one unit a block and the root.
    assert (forward.calls, per_block.calls) == (7 * 32 + 2, 32 + 1)
    # The same bytes, less the norms ZeRO-3 keeps whole on every rank (under the persistence threshold).
    assert (
        forward.window == "forward"
        and 0 < per_block.payload_bytes - forward.payload_bytes < 1e-4 * forward.payload_bytes
    )


def test_a_module_over_the_live_limit_leaves_the_next_one_unprefetched_and_exposed():
    plan = _plan("zero3", WIDE)
    for window in ("forward", "backward"):
        prefetched, waited = _gathers(plan, window)
        assert waited.window is None and prefetched.window == window
        # At least what follows each block's qkv (2.0e9 elements) and first MLP matrix (2.6e9), of 4 a block.
        assert 2 * WIDE["layers"] <= waited.calls < prefetched.calls + waited.calls
    moved = sum(c.payload_bytes for c in _gathers(plan, "forward"))
    assert moved == sum(c.payload_bytes for c in _gathers(plan, "backward"))
    topology = question(PlanConfig(**WIDE, gpus=16, micro_batch=1, strategies=["zero3"])).topology
    assert plan.time.exposed_comm_s >= sum(c.seconds(topology, 1.0) for c in plan.collectives if c.window is None)
    assert not [c for c in _plan("fsdp", WIDE).collectives if "not prefetched" in c.what]


# Two blocks of the 175B GPT: qkv 4.5e8 elements, the projection 1.5e8, each MLP matrix 6.0e8.
GPT_175B_BLOCKS = dict(layers=2, width=12288, heads=96, vocab=51200, seq_len=2048)


def test_full_recomputation_gathers_again_what_the_reuse_distance_lets_go():
    """A recomputed block fetches each module for its forward again, then for its backward; DeepSpeed
    keeps only those recurring within stage3_max_reuse_distance (1e9) elements of the trace: the
    block's last matrix (nothing between its two uses), not the first MLP matrix (the second's 6.0e8
    twice between), the projection or qkv."""
    kept = _plan("zero3", GPT_175B_BLOCKS)
    recomputed = plan_strategy(
        "zero3",
        question(
            PlanConfig(
                **GPT_175B_BLOCKS,
                gpus=16,
                micro_batch=1,
                strategies=["zero3"],
                activation_checkpointing="full",
            )
        ),
    )
    [plain] = _gathers(kept, "backward")
    [again] = _gathers(recomputed, "backward")
    assert _gathers(kept, "forward")[0].payload_bytes == _gathers(recomputed, "forward")[0].payload_bytes
    width = GPT_175B_BLOCKS["width"]
    regathered = GPT_175B_BLOCKS["layers"] * (3 * width * width + width * width + 4 * width * width)
    assert again.payload_bytes - plain.payload_bytes == pytest.approx(regathered * 2)  # bf16
    assert again.calls - plain.calls == 3 * GPT_175B_BLOCKS["layers"]
    assert recomputed.time.comm_s > kept.time.comm_s


def test_a_longer_reuse_distance_keeps_every_recomputed_module():
    """The trace of one block's backward under recomputation: its modules forward, then back; with a
    reuse distance past twice the block, nothing is gathered twice; at none, every module (DeepSpeed
    stops looking before the first)."""
    numels, blocks = (3.0, 1.0, 4.0, 4.0), (0, 0, 0, 0)
    assert Fetches(numels, blocks, max_live=100.0, max_reuse=None).order("backward") == [4.0, 4.0, 1.0, 3.0]
    assert Fetches(numels, blocks, max_live=100.0, max_reuse=100.0).regathered("backward") == 0
    assert Fetches(numels, blocks, max_live=100.0, max_reuse=0.0).regathered("backward") == sum(numels)
    # 10: the first MLP matrix (8 elements after it, forward and back) is kept, the projection is not.
    assert Fetches(numels, blocks, max_live=100.0, max_reuse=10.0).order("backward") == [3.0, 1.0, 4.0, 4.0, 1.0, 3.0]
