"""ZeRO-3 as DeepSpeed ran it in 2021: each list collective split and copied rank by rank on the
host, with the GPU waiting (speed/list_collectives.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import plan_vs_published as published
from harness.common.hardware import gpu_spec
from harness.plan.model.model_shape import shape_of_description
from harness.plan.network.comm import ZERO3_LIST_COLLECTIVES, Collective, collectives, ranks_holding
from harness.plan.network.fabric import Group, default_fabric, topology_of
from harness.plan.parallel.backends import filled_in, model_of
from harness.plan.parallel.layout import layout_of
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL
from harness.plan.speed.list_collectives import (
    HOST_S_PER_PERSISTENT_COPY,
    HOST_S_PER_RANK,
    list_collectives_host_s,
)


def test_each_rank_of_each_call_costs_its_python_views_and_a_copy_launched_from_cpp():
    # _allgather_param makes one view a rank (narrow), _reduce_scatter_gradient two (view, narrow).
    assert HOST_S_PER_RANK["all-gather"] == pytest.approx(2e-6 + HOST_S_PER_KERNEL["compiled"])
    assert HOST_S_PER_RANK["reduce-scatter"] == pytest.approx(2 * 2e-6 + HOST_S_PER_KERNEL["compiled"])
    world = Group(1536, 192)
    gathers = Collective(
        "all-gather parameters (forward)", "all-gather", 1e9, 400, "forward", world, per_micro_step=True
    )
    scatters = Collective(
        "reduce-scatter gradients", "reduce-scatter", 1e9, 600, "backward", world, per_micro_step=True
    )
    # Neither an all-reduce (not a list collective here) nor a host copy.
    others = [
        Collective("all-reduce", "all-reduce", 1e9, 50, "backward", world, per_micro_step=True),
        Collective("parameter shards to GPU", "host-copy", 1e9, 1, None, per_micro_step=True),
    ]
    expected = 1536 * (400 * HOST_S_PER_RANK["all-gather"] + 600 * HOST_S_PER_RANK["reduce-scatter"])
    assert list_collectives_host_s([gathers, scatters, *others]) == pytest.approx(expected)
    # Twice the ranks, twice the host's work: what makes ZeRO-3 of 2021 slower per GPU as it grows.
    half = [
        Collective(c.what, c.kind, c.payload_bytes, c.calls, c.window, Group(768, 96), per_micro_step=True)
        for c in (gathers, scatters)
    ]
    assert list_collectives_host_s(half) == pytest.approx(list_collectives_host_s([gathers, scatters]) / 2)
    # Every micro-step's calls again under accumulation; the persistent parameters' copies once a step.
    persistent = Collective("persistent", "all-gather", 1e6, 1, None, world, host_copies=770 * 1536)
    once = 1536 * HOST_S_PER_RANK["all-gather"] + 770 * 1536 * HOST_S_PER_PERSISTENT_COPY
    assert HOST_S_PER_PERSISTENT_COPY == pytest.approx(3 * 2e-6 + HOST_S_PER_KERNEL["compiled"])
    assert list_collectives_host_s([gathers, scatters, persistent], grad_accum=4) == pytest.approx(4 * expected + once)


def test_the_persistent_parameters_are_gathered_after_each_step_one_copy_a_tensor_and_rank():
    """Megatron-LM's GPT (every linear and norm with a bias): 8 tensors a block under the 1e5-element
    persistence threshold and the final norm's 2, each copied from every rank whose slice holds any of it."""
    shape = shape_of_description(params=None, layers=96, width=12288, heads=96, vocab=51200, seq_len=2048, biases=True)
    backend = filled_in(model_of("zero3"), shape, "fp16", 1536, {ZERO3_LIST_COLLECTIVES: True})
    layout = layout_of(
        backend, shape, topology_of(gpu_spec("A100-80"), 1536, 192, default_fabric(gpu_spec("A100-80"), 8))
    )
    comms = collectives(shape, backend, layout, "fp16", 1536, 2048, layout.shard_group, "full")
    [persistent] = [c for c in comms if c.host_copies]
    assert persistent.kind == "all-gather" and persistent.calls == 1 and not persistent.per_micro_step
    assert persistent.window is None and persistent.host_copies == (96 * 8 + 2) * 1536
    # A norm of 20,480 elements over 2,240 ranks: slices of 10, so the last 192 ranks hold padding only.
    assert ranks_holding(20480, 2240) == 2048
    # Today's ZeRO-3 has no such loop.
    today = filled_in(model_of("zero3"), shape, "fp16", 1536, {})
    assert not any(
        c.host_copies for c in collectives(shape, today, layout, "fp16", 1536, 2048, layout.shard_group, "full")
    )


@pytest.fixture(scope="module")
def table2():
    rows = published.read_rows(Path(published.DATA) / "public_runs.csv")
    return [r for r in rows if r["source"].startswith("Narayanan et al. 2021 (arXiv 2104.04473) Table 2")]


def test_narayanans_zero3_rows_are_planned_with_2021s_collectives_and_slower_for_it(table2):
    assert len(table2) == 6 and all(ZERO3_LIST_COLLECTIVES in r["sharding"].split() for r in table2)
    for row in table2[1:3]:  # the 175B on 768 and 1,536 GPUs
        _, listed, _ = published.question(row)
        _, today, _ = published.question({**row, "sharding": row["sharding"].replace(ZERO3_LIST_COLLECTIVES, "")})
        host = list_collectives_host_s(listed.collectives)
        assert listed.time.overhead_s - today.time.overhead_s == pytest.approx(host, rel=1e-6)
        assert "2021" in listed.time.overhead_what
        # A reduce-scatter a parameter tensor, not a bucket's.
        [scatter] = [c for c in listed.collectives if c.kind == "reduce-scatter"]
        assert scatter.calls == len(published.shape_of_row(row).tensors)
        # Waited on by the next module's fetch, which drains the GPU: beside no compute.
        assert scatter.window is None
        [today_scatter] = [c for c in today.collectives if c.kind == "reduce-scatter"]
        assert today_scatter.window == "backward" and listed.time.exposed_comm_s > today.time.exposed_comm_s
        assert host > 0.1 * listed.time.step_s
