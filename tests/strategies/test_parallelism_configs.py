"""What the many-node names hand their backend, checked against the backend's own reading of it:
Accelerate's ParallelismConfig (the mesh Accelerate builds from it, rank by rank, against the
run's layout; accelerate-fsdp-tp's training is tests/strategies/test_equivalence_mesh.py's) and
`accelerate launch`'s parallelism flags; DeepSpeed's ZeRO++ settings through DeepSpeed's own
config parser (zero3-zeropp's kernels need a GPU)."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest
import torch

from harness.train.distributed import free_port
from strategies.base import RunContext, StrategyError
from tests.helpers import ROOT, env_for_tests

needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")


@needs_accelerate
@pytest.mark.parametrize(
    "name, option, sizes, accelerate_dims",
    [
        (
            "accelerate-hsdp",
            "shard_size",
            {"dp_replicate_size": "replicate", "dp_shard_size": "shard"},
            ("dp_replicate", "dp_shard"),
        ),
        ("accelerate-fsdp-tp", "tp_size", {"dp_shard_size": "shard", "tp_size": "tp"}, ("dp_shard", "tp")),
    ],
)
def test_the_parallelism_config_is_the_runs_mesh(name, option, sizes, accelerate_dims):
    from strategies.accelerate.hsdp_mode import parallelism_config
    from strategies.registry import default_registry

    mesh = default_registry().mesh_layout(name, 8, 4, **{option: 2})
    config = parallelism_config(mesh, **sizes)
    dims, shape = config._get_mesh()
    assert (dims, shape) == (accelerate_dims, mesh.shape)
    assert config.total_size == 8 and config.data_parallel_size == mesh.data_parallel(0)[1]
    # The dimensions Accelerate averages the loss over and feeds different batches: the run's data dimensions.
    assert len(config.dp_dim_names) == len(mesh.data_dims)


# Four gloo processes: the device mesh Accelerate builds from the config, rank by rank, against
# the run's layout (which micro-batch each rank reads, which ranks form a tensor-parallel group).
MESH_PROBE = """
import os, sys, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK=sys.argv[2], WORLD_SIZE="4")
dist.init_process_group("gloo")
from strategies.accelerate.hsdp_mode import parallelism_config
from strategies.parallel_dims import mesh_layout
rank = dist.get_rank()
hsdp = mesh_layout("fsdp", "replicate x shard", {}, 4, 2)
acc = parallelism_config(hsdp, dp_replicate_size="replicate", dp_shard_size="shard").build_device_mesh("cpu")
assert acc["dp"].get_local_rank() == hsdp.data_parallel(rank)[0], "hsdp data rank"
assert acc.size() == 4
tp = mesh_layout("fsdp", "shard x tp", {}, 4, 2)
acc = parallelism_config(tp, dp_shard_size="shard", tp_size="tp").build_device_mesh("cpu")
assert (acc["dp"].get_local_rank(), acc["dp"].size()) == tp.data_parallel(rank), "fsdp-tp data rank"
assert acc["tp"].get_local_rank() == tp.coordinates(rank)[1], "tp rank"
assert (acc["tp"].get_local_rank() == 0) == tp.leads_its_group(rank)
dist.destroy_process_group()
print("ok", rank)
"""


@needs_accelerate
def test_accelerate_builds_the_runs_mesh_from_the_config():
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MESH_PROBE, port, str(rank)],
            cwd=ROOT,
            env=env_for_tests(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(4)
    ]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0 and out.strip() == f"ok {rank}", err[-3000:]


@needs_accelerate
def test_accelerate_launchs_parallelism_flags_choose_the_mode_and_must_fit_the_run(monkeypatch):
    from strategies.accelerate.environment import launcher_mode
    from strategies.accelerate.hsdp_mode import parallelism_config
    from strategies.parallel_dims import mesh_layout

    fsdp = {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}
    with_config = {**fsdp, "ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    assert launcher_mode(fsdp) == "fsdp"
    assert launcher_mode({**with_config, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2"}) == "hsdp"
    assert launcher_mode({**with_config, "PARALLELISM_CONFIG_TP_SIZE": "2"}) == "fsdp-tp"
    for key, value in {**with_config, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    hsdp = mesh_layout("fsdp", "replicate x shard", {}, 4, 2)
    with pytest.raises(StrategyError, match="set parallelism_config_dp_shard_size=4 but this run's mesh 2 x 2"):
        parallelism_config(hsdp, dp_replicate_size="replicate", dp_shard_size="shard")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    parallelism_config(hsdp, dp_replicate_size="replicate", dp_shard_size="shard")


@needs_accelerate
def test_accelerate_fsdp_tp_says_why_it_cannot_run_exactly_when_accelerate_cannot():
    from strategies.accelerate.fsdp_tp_mode import accelerate_tp_blocker
    from strategies.registry import default_registry

    module = importlib.import_module("transformers.integrations.tensor_parallel")
    reason = default_registry().get("accelerate-fsdp-tp").unavailable_reason
    assert reason == accelerate_tp_blocker()
    assert (reason is None) == hasattr(module, "ReplicateParallel")
    if reason:
        assert "ReplicateParallel" in reason and "pip install 'transformers==5.0.0'" in reason


@needs_accelerate
def test_accelerate_fsdp_tp_beside_a_later_transformers_is_listed_unavailable_with_the_release_to_install(
    monkeypatch,
):
    from strategies.accelerate import fsdp_tp_mode
    from strategies.registry import builtin_registry

    installed = {"accelerate": "1.15.0", "transformers": "5.24.0"}
    monkeypatch.setattr(fsdp_tp_mode, "version", installed.__getitem__)
    assert builtin_registry().get("accelerate-fsdp-tp").unavailable_reason == (
        "Accelerate 1.15.0's tensor-parallel prepare() under FSDP2 imports ReplicateParallel from transformers, "
        "which transformers 5.24.0 no longer has: pip install 'transformers==5.0.0' (the last release with it, "
        "the one parabench's tests pin), or use fsdp-tp"
    )
    installed["transformers"] = "5.0.0"
    assert builtin_registry().get("accelerate-fsdp-tp").unavailable_reason is None


def _ctx(world_size: int) -> RunContext:
    return RunContext(
        rank=0,
        world_size=world_size,
        local_rank=0,
        device=torch.device("cpu"),
        precision="bf16",
        micro_batch=2,
        grad_accum=1,
        grad_clip=1.0,
    )


@needs_deepspeed
@pytest.mark.parametrize("name, quantized", [("zero3-hpz", False), ("zero3-zeropp", True)])
def test_deepspeed_reads_the_zeropp_settings_as_meant(name, quantized):
    from deepspeed.runtime.config import DeepSpeedConfig

    from models.zoo import build_model
    from strategies.deepspeed_config import final_config, model_size, sizing_config
    from strategies.registry import default_registry

    strategy = default_registry().create(name, _ctx(8), zero_hpz_partition_size=4)
    config = final_config(sizing_config(model_size(build_model("gpt-nano")), 3, 8), strategy.run_config, {})
    # Without a process group DeepSpeed's parser counts a world of one: the batch it checks is one rank's.
    config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
    parsed = DeepSpeedConfig(config).zero_config
    assert (parsed.stage, parsed.zero_hpz_partition_size) == (3, 4)
    assert parsed.zero_quantized_weights is quantized and parsed.zero_quantized_gradients is quantized
    assert (default_registry().get(name).unsupported_reason("cpu") is None) is not quantized


@needs_deepspeed
def test_a_users_deepspeed_json_cannot_change_what_a_zeropp_name_means(tmp_path):
    from strategies.deepspeed_config import DeepSpeedConfigError
    from strategies.registry import default_registry

    user = tmp_path / "ds.json"
    user.write_text('{"zero_optimization": {"zero_hpz_partition_size": 8}}')
    ctx = RunContext(**{**_ctx(8).__dict__, "config": type("Cfg", (), {"deepspeed_config": str(user)})()})
    with pytest.raises(DeepSpeedConfigError, match="sets zero_optimization.zero_hpz_partition_size=8 but the strategy"):
        default_registry().create("zero3-hpz", ctx, zero_hpz_partition_size=4)


def test_zeropp_quantization_is_skipped_on_a_cpu_with_the_reason():
    from strategies.registry import default_registry

    entry = default_registry().get("zero3-zeropp")
    assert "run on GPUs only" in entry.unsupported_reason("cpu") and entry.unsupported_reason("cuda") is None
    assert default_registry().get("zero3-hpz").unsupported_reason("cpu") is None
