"""The torch mesh's sizes in pure Python (strategies/parallel_dims.py): every preset's defaults on one
node and on several, every size a run may add, the model's heads and blocks bounding the defaults,
the same sizes read back from the layout, and each refusal in one line naming sizes that fit."""

from __future__ import annotations

import itertools
import math

import pytest

from strategies.base import StrategyError
from strategies.mesh_layout import MeshError, divisors
from strategies.parallel_dims import (
    MAX_DEFAULT_CP,
    MAX_DEFAULT_TP,
    SCHEDULES,
    ModelFacts,
    ParallelDims,
    dims_for,
    mesh_dims,
    shares_heads,
    splits_heads,
)
from strategies.registry import default_registry
from tests.strategies.constructed import constructed

MESH_PRESETS = ("fsdp", "fsdp-grad-op", "fsdp-offload", "hsdp", "fsdp-tp", "ddp-tp", "zero1-tp", "fsdp-pp", "fsdp-cp")
GPT_NANO = ModelFacts(blocks=2, heads=2, kv_heads=2)
LLAMA_8B = ModelFacts(blocks=32, heads=32, kv_heads=8)


def _sizes(name: str, world: int, per_node: int, model: ModelFacts | None = None, **options) -> dict[str, int]:
    mesh = default_registry().mesh_layout(name, world, per_node, model, **options)
    return dict(zip(mesh.dims, mesh.shape, strict=True))


@pytest.mark.parametrize(
    "name, world, per_node, expected",
    [
        ("fsdp", 8, 8, {"data": 8}),
        ("hsdp", 16, 8, {"replicate": 2, "shard": 8}),
        ("hsdp", 8, 8, {"replicate": 1, "shard": 8}),
        ("fsdp-tp", 16, 8, {"shard": 2, "tp": 8}),
        ("fsdp-tp", 32, 16, {"shard": 4, "tp": 8}),  # at most 8
        ("ddp-tp", 16, 8, {"replicate": 2, "tp": 8}),
        ("zero1-tp", 4, 4, {"replicate": 1, "tp": 4}),
        ("fsdp-pp", 16, 8, {"pp": 2, "shard": 8}),  # a stage per node
        ("fsdp-pp", 8, 8, {"pp": 2, "shard": 4}),  # two on one node
        ("fsdp-pp", 32, 4, {"pp": 8, "shard": 4}),
        ("fsdp-cp", 16, 8, {"shard": 2, "cp": 8}),
    ],
)
def test_each_preset_lays_out_its_dimensions_by_default(name, world, per_node, expected):
    assert _sizes(name, world, per_node) == expected


@pytest.mark.parametrize(
    "name, options, expected",
    [
        ("ddp-tp", {"pp_size": 2}, {"pp": 2, "replicate": 1, "tp": 4}),  # Megatron-LM's DDP x TP x PP
        ("zero1-tp", {"pp_size": 2, "tp_size": 2}, {"pp": 2, "replicate": 2, "tp": 2}),
        ("fsdp-tp", {"pp_size": 2, "cp_size": 2}, {"pp": 2, "shard": 1, "cp": 2, "tp": 2}),  # torchtitan's 4D
        ("fsdp-tp", {"cp_size": 2}, {"shard": 2, "cp": 2, "tp": 2}),
        ("hsdp", {"tp_size": 2}, {"replicate": 1, "shard": 4, "tp": 2}),
        ("fsdp", {"pp_size": 4}, {"pp": 4, "shard": 2}),
        ("fsdp-pp", {"tp_size": 2}, {"pp": 2, "shard": 2, "tp": 2}),
        ("fsdp-cp", {"pp_size": 2}, {"pp": 2, "shard": 1, "cp": 4}),
    ],
)
def test_a_run_adds_any_size_that_divides_the_world(name, options, expected):
    assert _sizes(name, 8, 8, ModelFacts(blocks=4, heads=4, kv_heads=4), **options) == expected


def test_context_parallel_defaults_to_what_the_heads_allow():
    """The all-to-all gives each rank whole attention heads, and whole key/value heads or one each
    repeated; the ring splits the sequence alone."""
    assert _sizes("fsdp-cp", 8, 8, ModelFacts(heads=4, kv_heads=2)) == {"shard": 2, "cp": 4}  # kv heads repeated
    assert _sizes("fsdp-cp", 8, 8, ModelFacts(heads=12, kv_heads=6)) == {"shard": 4, "cp": 2}
    assert _sizes("fsdp-cp", 8, 8, GPT_NANO, cp_attention="ring") == {"shard": 1, "cp": 8}
    # fsdp-cp at nproc=4 on gpt-nano's 2 heads runs cp 2, where a node's 4 would not split them.
    assert _sizes("fsdp-cp", 4, 4, GPT_NANO) == {"shard": 2, "cp": 2}
    assert _sizes("fsdp-cp", 4, 4) == {"shard": 1, "cp": 4}  # heads unknown: a node's ranks
    # Tensor parallel over a node's 8 leaves none of the node to context parallel.
    assert _sizes("fsdp-cp", 16, 8, LLAMA_8B, tp_size=8) == {"shard": 2, "cp": 1, "tp": 8}


def test_tensor_parallel_defaults_to_a_node_at_most_eight_dividing_the_heads():
    assert _sizes("fsdp-tp", 8, 8, ModelFacts(heads=12, kv_heads=4)) == {"shard": 2, "tp": 4}
    assert _sizes("fsdp-tp", 8, 8, GPT_NANO) == {"shard": 4, "tp": 2}
    assert _sizes("fsdp-tp", 24, 12, LLAMA_8B) == {"shard": 6, "tp": 4}  # 8 does not divide a node of 12


def test_a_pipeline_never_has_more_stages_than_blocks():
    assert _sizes("fsdp-pp", 16, 2, ModelFacts(blocks=4)) == {"pp": 4, "shard": 4}
    with pytest.raises(MeshError, match="schedule=interleaved-1f1b runs a pipeline, and this layout has pp 1"):
        _sizes("fsdp-pp", 8, 8, GPT_NANO, schedule="interleaved-1f1b")  # 2 blocks: no 2 x 2 virtual stages
    assert _sizes("fsdp-pp", 6, 2, ModelFacts(blocks=32)) == {"pp": 3, "shard": 2}


@pytest.mark.parametrize("name", MESH_PRESETS)
@pytest.mark.parametrize("world, per_node", [(w, n) for w in (1, 2, 3, 4, 6, 8, 12, 16) for n in divisors(w)])
@pytest.mark.parametrize("model", [None, GPT_NANO, ModelFacts(blocks=3, heads=6, kv_heads=2), LLAMA_8B])
def test_defaults_always_fit_the_world_and_the_model(name, world, per_node, model):
    entry = default_registry().get(name)
    options = entry.option_values()
    dims = dims_for(options["engine"], options["mesh_dims"], options, world, per_node, model)
    mesh = default_registry().mesh_layout(name, world, per_node, model)
    assert dims == ParallelDims.from_layout(mesh, dims_engine(name))
    assert dims.tp <= MAX_DEFAULT_TP and per_node % dims.tp == 0
    assert dims.cp <= MAX_DEFAULT_CP and per_node % dims.cp == 0
    facts = model or ModelFacts()
    assert splits_heads(dims.tp, facts) and shares_heads(dims.cp, facts, dims.tp, "all-to-all")
    if model is not None and model.blocks:
        assert dims.pp <= model.blocks
    named = mesh_dims(options["mesh_dims"])
    if "pp" not in named:
        assert dims.pp == 1
    if "tp" not in named:
        assert dims.tp == 1


def dims_engine(name: str) -> str:
    return default_registry().get(name).options["engine"]


@pytest.mark.parametrize("name", MESH_PRESETS)
@pytest.mark.parametrize("tp, pp, cp", list(itertools.product((1, 2, 4), repeat=3)))
def test_every_combination_that_divides_the_world_lays_out_as_asked(name, tp, pp, cp):
    takes = default_registry().get(name).user_options()
    options = {k: v for k, v in (("tp_size", tp), ("pp_size", pp), ("cp_size", cp)) if k in takes}
    if 16 % math.prod(options.values()):
        with pytest.raises(MeshError, match="does not divide the world size 16"):
            default_registry().mesh_layout(name, 16, 8, **options)
        return
    mesh = default_registry().mesh_layout(name, 16, 8, **options)
    dims = ParallelDims.from_layout(mesh, dims_engine(name))
    for option, size in options.items():
        assert getattr(dims, option.removesuffix("_size")) == size, option
    assert dims.data_parallel * dims.tp * dims.pp * dims.cp == 16
    assert mesh.data_parallel(15)[1] == dims.data_parallel


@pytest.mark.parametrize(
    "name, options, model, says",
    [
        (
            "fsdp-tp",
            {"tp_size": 3},
            None,
            "strategy_options.tp_size=3 does not divide the world size 8: use one of 1, 2, 4, 8",
        ),
        (
            "fsdp-tp",
            {"tp_size": 4, "pp_size": 4},
            None,
            "strategy_options.tp_size=4 x pp_size=4 = 16 ranks does not divide the world size 8: use sizes whose "
            "product is one of 1, 2, 4, 8",
        ),
        (
            "fsdp-tp",
            {"tp_size": 4},
            GPT_NANO,
            "strategy_options.tp_size=4 does not divide the model's 2 attention heads: use "
            "strategy_options.tp_size=1 or 2",
        ),
        (
            "fsdp-tp",
            {"tp_size": 4},
            ModelFacts(heads=4, kv_heads=2),
            "strategy_options.tp_size=4 does not divide the model's 2 key/value heads: use "
            "strategy_options.tp_size=1 or 2",
        ),
        (
            "fsdp-tp",
            {"tp_size": 2, "cp_size": 4},
            ModelFacts(heads=4, kv_heads=4),
            "strategy_options.cp_size=4 does not share out each tensor-parallel rank's 2 attention heads (the "
            "all-to-all gives each rank whole heads): use strategy_options.cp_size=1 or 2, or "
            "strategy_options.cp_attention=ring",
        ),
        (
            "fsdp-cp",
            {"cp_size": 8},
            ModelFacts(heads=12, kv_heads=6),
            "strategy_options.cp_size=8 does not share out the model's 12 attention heads and 6 key/value heads",
        ),
        (
            "fsdp-pp",
            {"pp_size": 4, "schedule": "interleaved-1f1b"},
            ModelFacts(blocks=6),
            "8 pipeline stages need at least 8 blocks (4 ranks x 2 virtual stages), and the model has 6",
        ),
        ("hsdp", {"shard_size": 3}, None, "strategy_options.shard_size=3 does not divide the world size 8"),
        ("fsdp-cp", {"cp_size": 0}, None, "strategy_options.cp_size=0 must be a whole number >= 1"),
    ],
)
def test_a_size_that_does_not_fit_is_one_line_naming_sizes_that_would(name, options, model, says):
    with pytest.raises(MeshError) as err:
        default_registry().mesh_layout(name, 8, 8, model, **options)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name, options, says",
    [
        ("fsdp", {"tp_size": 2}, "strategy 'fsdp' has no option tp_size"),
        ("ddp-tp", {"prefetch_blocks": 2}, "strategy 'ddp-tp' means prefetch_blocks=0"),
        ("fsdp-pp", {"reshard_after_forward": True}, "strategy 'fsdp-pp' means reshard_after_forward=False"),
        ("zero1-tp", {"engine": "fsdp"}, "strategy 'zero1-tp' means engine=zero1"),
    ],
)
def test_what_a_preset_does_not_take_or_fixes_is_refused(name, options, says):
    with pytest.raises(StrategyError, match=says):
        default_registry().mesh_layout(name, 8, 8, **options)


def test_each_preset_takes_the_sizes_of_its_dimensions_and_those_a_run_may_add():
    registry = default_registry()
    for name in MESH_PRESETS:
        takes = registry.get(name).user_options()
        assert {"pp_size", "cp_size"} <= set(takes), name
        assert ("tp_size" in takes) == (name not in ("fsdp", "fsdp-grad-op", "fsdp-offload")), name
        assert ("shard_size" in takes) == (name == "hsdp"), name


@pytest.mark.parametrize(
    "options, micro_batch, says",
    [
        ({"schedule": "gpipe"}, 4, "strategy_options.schedule=gpipe runs a pipeline, and this layout has pp 1"),
        (
            {"pp_size": 2, "sync_each_micro_step": False},
            4,
            "sync_each_micro_step=false does not apply under a pipeline",
        ),
        ({"pp_size": 2, "schedule": "zb"}, 4, "strategy_options.schedule='zb' is not one of"),
        ({"cp_attention": "ring"}, 4, "strategy_options.cp_attention=ring splits sequences, and this layout has cp 1"),
    ],
)
def test_pipeline_options_without_a_pipeline_or_against_it_are_refused(options, micro_batch, says):
    """With the layout, where the planner refuses them too (strategies/parallel_dims.py check_options)."""
    with pytest.raises(MeshError, match=says):
        constructed("fsdp-tp", 8, micro_batch, tp_size=2, **options)
    with pytest.raises(MeshError, match=says):
        dims_for("fsdp", "shard x tp", {"tp_size": 2, **options}, 8, 8)


def test_gradients_sync_as_each_engine_does_unless_the_run_says():
    assert constructed("fsdp-tp", 4, tp_size=2).sync_each_micro_step is True
    assert constructed("ddp-tp", 4, tp_size=2).sync_each_micro_step is False
    assert constructed("ddp-tp", 4, tp_size=2, sync_each_micro_step=True).sync_each_micro_step is True
    assert constructed("ddp-tp", 8, tp_size=2, pp_size=2).sync_each_micro_step is True  # the schedule reduces


def test_a_pipelined_layout_checkpoints_in_its_own_format():
    assert constructed("fsdp-pp", 4, pp_size=2).checkpoint_format == "dcp-pipeline"
    assert constructed("fsdp-pp", 4, pp_size=1).checkpoint_format == "dcp"
    assert constructed("ddp-tp", 8, tp_size=2, pp_size=2).checkpoint_format == "dcp-pipeline"
    assert constructed("hsdp", 4).checkpoint_format == "dcp"


def test_the_schedules_virtual_stages():
    assert {name: stages for name, (_, stages) in SCHEDULES.items()} == {
        "gpipe": 1,
        "1f1b": 1,
        "interleaved-1f1b": 2,
        "zero-bubble": 2,
    }
