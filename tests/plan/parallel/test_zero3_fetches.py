"""DeepSpeed ZeRO-3's parameter gathers as its coordinator runs them: a module at a time, the next
one prefetched beside the compute while the gathered parameters stay under
stage3_max_live_parameters; FSDP a block at a time."""

from __future__ import annotations

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
