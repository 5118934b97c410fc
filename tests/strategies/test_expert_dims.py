"""Expert parallel's size on the torch mesh in pure Python (strategies/parallel_dims.py): ep borrowed
from the data-parallel ranks (shard under FSDP2, the replicas under replicate), its default where a
preset names it, the layout read back, and each refusal in one line naming sizes that fit."""

from __future__ import annotations

import pytest

from strategies.mesh_layout import MeshError
from strategies.parallel_dims import ModelFacts, ParallelDims, dims_for
from strategies.registry import default_registry

MOE_NANO = ModelFacts(blocks=2, heads=2, kv_heads=2, experts=4)
EP_PRESETS = ("fsdp", "fsdp-grad-op", "fsdp-offload", "hsdp", "fsdp-tp", "ddp-tp", "fsdp-pp", "fsdp-cp")
EP_PRESETS += ("fsdp-ep", "ddp-ep")


def _layout(name: str, world: int, model: ModelFacts | None = MOE_NANO, **options) -> dict[str, int]:
    mesh = default_registry().mesh_layout(name, world, world, model, **options)
    return dict(zip(mesh.dims, mesh.shape, strict=True))


@pytest.mark.parametrize(
    "name, world, options, expected",
    [
        ("fsdp-ep", 4, {}, {"shard": 1, "ep": 4}),  # the most data ranks that divide the 4 experts
        ("fsdp-ep", 8, {}, {"shard": 2, "ep": 4}),
        ("fsdp-ep", 4, {"ep_size": 2}, {"shard": 2, "ep": 2}),
        ("ddp-ep", 4, {"ep_size": 2}, {"replicate": 2, "ep": 2}),
        ("fsdp", 4, {"ep_size": 2}, {"shard": 2, "ep": 2}),
        ("hsdp", 8, {"shard_size": 4, "ep_size": 2}, {"replicate": 2, "shard": 2, "ep": 2}),
        ("fsdp-tp", 8, {"tp_size": 2, "ep_size": 2}, {"shard": 2, "ep": 2, "tp": 2}),
        ("ddp-tp", 8, {"tp_size": 2, "ep_size": 4}, {"replicate": 1, "ep": 4, "tp": 2}),
        ("fsdp-pp", 8, {"pp_size": 2, "ep_size": 2}, {"pp": 2, "shard": 2, "ep": 2}),
    ],
)
def test_ep_is_laid_out_inside_the_data_dimension_it_is_borrowed_from(name, world, options, expected):
    assert _layout(name, world, **options) == expected
    entry = default_registry().get(name)
    mesh = default_registry().mesh_layout(name, world, world, MOE_NANO, **options)
    dims = ParallelDims.from_layout(mesh, entry.options["engine"])
    assert dims.ep == expected["ep"] and dims.data_parallel == mesh.data_parallel(world - 1)[1]


def test_the_ranks_of_an_ep_group_read_different_data():
    mesh = default_registry().mesh_layout("fsdp-tp", 8, 8, MOE_NANO, tp_size=2, ep_size=2)
    # shard x ep x tp: ranks 0 and 2 share a tensor-parallel coordinate and differ along ep.
    assert mesh.data_parallel(0) == (0, 4) and mesh.data_parallel(2) == (1, 4)
    assert mesh.data_parallel(1) == mesh.data_parallel(0)  # a tensor-parallel pair shares its data


def test_an_ep_preset_with_one_expert_group_says_so():
    mesh = default_registry().mesh_layout("ddp-ep", 4, 4, ModelFacts(experts=1))
    assert mesh.shape == (4, 1) and "ep 1: no expert parallel, the layout of ddp" in mesh.notes


def test_the_planner_reads_ep_from_dims_for():
    dims = dims_for("fsdp", "shard x ep", {"ep_size": 2}, 16, 8, ModelFacts(blocks=4, heads=4, kv_heads=4, experts=8))
    assert (dims.dp_shard, dims.ep, dims.expert_ranks("fsdp")) == (16, 2, 16)
    assert dims_for("fsdp", "shard", {}, 16, 8).ep == 1  # no ep_size, no ep


@pytest.mark.parametrize(
    "name, world, options, says",
    [
        ("fsdp-ep", 4, {"ep_size": 3}, "strategy_options.ep_size=3 does not divide the world size 4: use one of 1, 2"),
        (
            "fsdp-tp",
            4,
            {"tp_size": 2, "ep_size": 4},
            "strategy_options.ep_size=4 does not divide the 2 data-parallel ranks of shard it is taken from (tp, cp "
            "and pp ranks are not): use strategy_options.ep_size=1 or 2",
        ),
        (
            "ddp-ep",
            8,
            {"ep_size": 8},
            "strategy_options.ep_size=8 does not divide the model's 4 experts: use strategy_options.ep_size=1 or 2",
        ),
        ("fsdp-ep", 4, {"ep_size": 0}, "strategy_options.ep_size=0 must be a whole number >= 1"),
        (
            "fsdp-cp",
            8,
            {"cp_size": 2, "ep_size": 2},
            "strategy_options.ep_size=2 beside cp_size=2 is not laid out: expert parallel takes its ranks from the "
            "data-parallel ones alone; drop strategy_options.cp_size or ep_size",
        ),
    ],
)
def test_a_bad_ep_size_is_one_line_naming_sizes_that_fit(name, world, options, says):
    with pytest.raises(MeshError) as err:
        default_registry().mesh_layout(name, world, world, MOE_NANO, **options)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_the_zero1_engine_refuses_ep():
    with pytest.raises(MeshError, match="does not go with the zero1 engine"):
        dims_for("zero1", "replicate x tp", {"ep_size": 2, "tp_size": 1}, 4, 4, MOE_NANO)
    with pytest.raises(Exception, match="strategy 'zero1-tp' has no option ep_size"):
        default_registry().check_options("zero1-tp", {"ep_size": 2})


@pytest.mark.parametrize("name", EP_PRESETS)
def test_every_preset_whose_engine_allows_it_takes_ep_size(name):
    assert "ep_size" in default_registry().get(name).user_options()


def test_a_torch_ep_checkpoints_weights_are_read_from_singles_file(tmp_path):
    """ddp-ep's `torch-ep<N>` checkpoints hold the whole model in single's file: a resume under any
    mesh name, or export, carries its weights over."""
    import torch

    from strategies.single import MODEL_FILE

    weights = {"blocks.0.mlp.experts.gate_up_proj": torch.ones(4, 2, 3)}
    torch.save(weights, tmp_path / MODEL_FILE)
    read = default_registry().get("ddp-ep").cls.read_full_state_dict(tmp_path, torch.nn.Linear(1, 1))
    assert read.keys() == weights.keys() and torch.equal(read["blocks.0.mlp.experts.gate_up_proj"], torch.ones(4, 2, 3))
