"""Tensor parallelism wider than a node shares its nodes' cards with the data-parallel collectives
the compute hides: the critical-path collectives wait for the share the data-parallel traffic
takes (comm.py's SharedCards), at most their own time and at most the data-parallel time; inside a
node (NVLink) nothing is shared."""

from __future__ import annotations

import pytest

from harness.plan.network.comm import SharedCards
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy

# Llama 3.1 8B's shape with 32 kv heads (tp 16 must divide them) on 4 nodes of 8 H100s.
SHAPE = dict(layers=32, width=4096, heads=32, kv_heads=32, ffn=14336, vocab=128256, arch="llama", seq_len=4096)


def _plan(strategy: str, tp: int):
    config = PlanConfig(
        **SHAPE, gpus=32, gpu="H100", micro_batch=1, strategies=[strategy], strategy_options={"tp_size": tp}
    )
    q = question(config)
    return plan_strategy(strategy, q), q.topology


@pytest.mark.parametrize("strategy", ["ddp-tp", "fsdp-tp"])
def test_a_group_across_nodes_waits_for_the_data_parallel_share_of_its_cards(strategy):
    plan, topology = _plan(strategy, 16)
    shared = [c for c in plan.collectives if isinstance(c, SharedCards)]
    assert shared, "tp 16 over 2 nodes beside data parallel over the others shares the cards"
    for c in shared:
        assert c.window is None and c.calls == 0 and c.wire_bytes() == 0.0
        tp = sum(t.seconds(topology, 1e10) for t in c.tensor_parallel)
        dp = sum(d.seconds(topology, 1e10) for d in c.data_parallel)
        assert 0 < c.seconds(topology, 1e10) <= min(tp, dp) + 1e-12
        assert all(t.group.nodes == 2 for t in c.tensor_parallel)
        assert all(d.window in ("forward", "backward") and d.group.nodes > 1 for d in c.data_parallel)
        assert c.seconds(topology, 1e10, tail=True) == 0.0
        # Priced from the step's final list (the recipe's fp8 gathers, the experts' reductions), not an earlier one.
        assert all(any(d is mine for mine in plan.collectives) for d in c.data_parallel + c.tensor_parallel)


def test_the_share_is_the_smaller_of_the_two():
    plan, topology = _plan("fsdp-tp", 16)
    [every] = [c for c in plan.collectives if isinstance(c, SharedCards) and c.per_micro_step]
    tp = sum(t.seconds(topology, 1e10) for t in every.tensor_parallel)
    dp = sum(d.seconds(topology, 1e10) for d in every.data_parallel)
    assert every.seconds(topology, 1e10) == pytest.approx(min(tp, dp))


def test_inside_a_node_nothing_is_shared():
    plan, _ = _plan("fsdp-tp", 8)
    assert not [c for c in plan.collectives if isinstance(c, SharedCards)]


def test_the_share_is_priced_from_the_recipes_fp8_gathers():
    config = PlanConfig(
        **SHAPE,
        gpus=32,
        gpu="H100",
        micro_batch=1,
        precision="fp8",
        fp8_all_gather=True,
        strategies=["fsdp-tp"],
        strategy_options={"tp_size": 16},
    )
    plan = plan_strategy("fsdp-tp", question(config))
    [every] = [c for c in plan.collectives if isinstance(c, SharedCards) and c.per_micro_step]
    gathers = [c for c in every.data_parallel if c.what.startswith("all-gather parameters")]
    assert gathers and all(any(g is mine for mine in plan.collectives) for g in gathers)
