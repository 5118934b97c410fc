"""The layouts of the many-node strategies, in-process: which rank reads which data, the default
sizes (one node), degenerate meshes said as such, one-line errors for meshes that do not fit,
the plan models the planner reads, and the checkpoint layout's optimizer groups."""

from __future__ import annotations

import pytest
import torch

from strategies.base import RunContext
from strategies.dcp_layout import merged_groups, split_groups
from strategies.deepspeed_zeropp import hpz_layout
from strategies.mesh_layout import MeshError, MeshLayout
from strategies.parallel_dims import mesh_layout
from strategies.registry import default_registry

NEW_NAMES = ("hsdp", "fsdp-tp", "zero3-hpz", "zero3-zeropp", "accelerate-hsdp", "accelerate-fsdp-tp")


def hybrid_layout(world_size: int, per_node: int, shard_size: int | None) -> MeshLayout:
    return mesh_layout("fsdp", "replicate x shard", {"shard_size": shard_size}, world_size, per_node)


def tensor_parallel_layout(world_size: int, per_node: int, tp_size: int | None) -> MeshLayout:
    return mesh_layout("fsdp", "shard x tp", {"tp_size": tp_size}, world_size, per_node)


def test_ranks_are_laid_out_row_major_as_init_device_mesh():
    mesh = MeshLayout((2, 3), ("a", "b"), ("a", "b"))
    assert [mesh.coordinates(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_hybrid_sharding_reads_data_on_every_rank():
    mesh = hybrid_layout(4, 2, None)
    assert (mesh.shape, mesh.dims) == ((2, 2), ("replicate", "shard"))
    assert [mesh.data_parallel(r) for r in range(4)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert all(mesh.leads_its_group(r) for r in range(4))
    assert mesh.describe() == "mesh 2 x 2: replicate x shard"


def test_a_tensor_parallel_group_reads_one_micro_batch_and_counts_its_loss_once():
    mesh = tensor_parallel_layout(8, 4, 2)
    assert (mesh.shape, mesh.dims, mesh.data_dims) == ((4, 2), ("shard", "tp"), ("shard",))
    assert [mesh.data_parallel(r) for r in range(8)] == [(i // 2, 4) for i in range(8)]
    assert [mesh.leads_its_group(r) for r in range(8)] == [True, False] * 4


@pytest.mark.parametrize(
    "layout, local, expected_shape",
    [
        (hybrid_layout, 8, (2, 8)),  # shard_size: one node's ranks
        (lambda w, n, _: tensor_parallel_layout(w, n, None), 16, (2, 8)),  # tp_size: min(8, a node's)
        (lambda w, n, _: tensor_parallel_layout(w, n, None), 4, (4, 4)),
        (hpz_layout, 8, (2, 8)),  # zero_hpz_partition_size: one node's ranks
    ],
)
def test_sizes_default_to_one_node(layout, local, expected_shape):
    assert layout(16, local, None).shape == expected_shape


@pytest.mark.parametrize(
    "mesh, note",
    [
        (hybrid_layout(2, 2, None), "one replica: the layout of fsdp"),
        (hybrid_layout(2, 2, 1), "shards of one rank: every rank holds the whole model, as under ddp"),
        (tensor_parallel_layout(2, 2, None), "one data-parallel rank: tensor parallel alone"),
        (tensor_parallel_layout(2, 2, 1), "tp 1: no tensor parallel, the layout of fsdp"),
        (hpz_layout(2, 2, None), "one group: the secondary copy spans every rank as the primary partition does"),
    ],
)
def test_a_degenerate_mesh_says_what_it_amounts_to(mesh, note):
    """At compare's default nproc=2 on one node every layout has a dimension of one: the header,
    summary.json and the report say so rather than passing it off as the layout asked for."""
    assert any(n.startswith(note) for n in mesh.notes) and note in mesh.describe()
    assert mesh.as_dict()["notes"] == list(mesh.notes)


@pytest.mark.parametrize(
    "name, options, expected",
    [
        ("hsdp", {"shard_size": 3}, "shard_size=3 does not divide the world size 4: use one of 1, 2, 4"),
        ("fsdp-tp", {"tp_size": 8}, "strategy_options.tp_size=8 does not divide the world size 4"),
        ("fsdp-tp", {"tp_size": 0}, "strategy_options.tp_size=0 must be a whole number >= 1"),
        ("zero3-hpz", {"zero_hpz_partition_size": 3}, "zero_hpz_partition_size=3 does not divide"),
        ("accelerate-hsdp", {"shard_size": 3}, "shard_size=3 does not divide"),
    ],
)
def test_a_mesh_that_does_not_fit_the_world_is_one_line_naming_what_would(name, options, expected):
    with pytest.raises(MeshError, match=expected) as err:
        default_registry().mesh_layout(name, 4, 4, **options)
    assert "\n" not in str(err.value)


def test_the_new_names_are_registered_with_the_plan_fields_the_planner_reads():
    registry = default_registry()
    plans = {name: registry.get(name).plan for name in NEW_NAMES}
    assert plans["hsdp"].hybrid_shard and plans["accelerate-hsdp"].hybrid_shard
    assert plans["fsdp-tp"].tensor_parallel and plans["accelerate-fsdp-tp"].tensor_parallel
    assert plans["zero3-hpz"].secondary_partition and not plans["zero3-hpz"].quantized_comm
    assert plans["zero3-zeropp"].secondary_partition and plans["zero3-zeropp"].quantized_comm
    assert plans["accelerate-hsdp"].via_accelerate
    # The planner reads the sizes from these option names, by default one node's GPUs (None).
    for name, option in [
        ("hsdp", "shard_size"),
        ("accelerate-hsdp", "shard_size"),
        ("fsdp-tp", "tp_size"),
        ("accelerate-fsdp-tp", "tp_size"),
        ("zero3-hpz", "zero_hpz_partition_size"),
    ]:
        assert registry.get(name).user_options()[option] is None


def test_a_strategy_without_a_mesh_is_every_rank_data_parallel():
    ctx = RunContext(
        rank=3,
        world_size=4,
        local_rank=3,
        device=torch.device("cpu"),
        precision="fp32",
        micro_batch=1,
        grad_accum=1,
        grad_clip=1.0,
    )
    strategy = default_registry().create("ddp", ctx)
    assert strategy.data_parallel == (3, 4) and not strategy.mesh.declared


def test_optimizer_groups_split_by_mesh_are_stored_merged_and_split_again():
    settings = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.1}
    no_decay = {**settings, "weight_decay": 0.0}
    live = [
        {**settings, "params": ["a", "b"]},  # decay, 2D mesh
        {**settings, "params": ["c"]},  # decay, FSDP's mesh
        {**no_decay, "params": ["d"]},
    ]
    stored = merged_groups(live)
    assert stored == [{**settings, "params": ["a", "b", "c"]}, {**no_decay, "params": ["d"]}]
    loaded = [{**settings, "lr": 5e-4, "params": ["a", "b", "c"]}, {**no_decay, "lr": 5e-4, "params": ["d"]}]
    assert split_groups(loaded, live) == [
        {**settings, "lr": 5e-4, "params": ["a", "b"]},
        {**settings, "lr": 5e-4, "params": ["c"]},
        {**no_decay, "lr": 5e-4, "params": ["d"]},
    ]
