"""DeepSpeed ZeRO (strategies/deepspeed.py): the same losses as `single`, sharding
measured from DeepSpeed's own tensors, CPU offload, the `deepspeed` launcher, and
one-line errors for bad input.

Each 2-rank run costs ~25 s on two cores (mostly imports), so every run serves
several checks: zero1 and zero3-offload also accumulate over two micro-steps,
zero2 also carries a user DeepSpeed JSON, and zero3 runs under the `deepspeed`
launcher itself.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from harness.train.distributed import free_port
from strategies.base import RunContext, StrategyError
from strategies.deepspeed import CONFIG_FILE, DeepSpeedStrategy
from strategies.deepspeed_config import (
    DeepSpeedConfigError,
    ModelSize,
    check_user_config,
    check_zero_options,
    final_config,
    model_size,
    read_user_config,
    run_config,
    sizing_config,
)
from strategies.registry import StrategyRegistry
from tests.helpers import NANO, ROOT, max_rel_diff, read_run, run_cli, train

needs_deepspeed = pytest.mark.skipif(
    DeepSpeedStrategy.unavailable_reason() is not None, reason=str(DeepSpeedStrategy.unavailable_reason())
)
LOSS_TOLERANCE = 1e-4  # relative, every step, fp32
# A user's JSON in Hugging Face's style: "auto" values, plus tuning the run leaves free.
USER_JSON = {
    "train_micro_batch_size_per_gpu": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": 2048},
}
EXTRA_ARGS = {"zero1": ["grad_accum=2"], "zero2-offload": [], "zero3-offload": ["grad_accum=2"]}
# A DeepSpeed run's import and engine set-up take a while on a loaded two-core host.
RUN_TIMEOUT = 480
runs_deepspeed = pytest.mark.timeout(600)


def _launched_by_deepspeed(out_dir: Path) -> tuple[dict, list[dict]]:
    launcher = Path(sys.executable).parent / "deepspeed"
    # --num_accelerators: the launcher counts no GPUs on a CPU host; a free port: other
    # jobs on this host may hold DeepSpeed's default 29500.
    prefix = [str(launcher), "--num_accelerators", "2", "--master_port", str(free_port())]
    proc = run_cli(["train", "strategy=zero3", f"out_dir={out_dir}", *NANO], prefix=prefix, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, (
        f"deepspeed launcher exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return read_run(out_dir)


@pytest.fixture(scope="module")
def zero_run(tmp_path_factory):
    """zero_run(name) -> (summary, rows, out_dir), each run trained once per module, on first use."""
    runs: dict[str, tuple[dict, list[dict], Path]] = {}

    def get(name: str) -> tuple[dict, list[dict], Path]:
        if name not in runs:
            out_dir = tmp_path_factory.mktemp(name)
            if name == "zero3":
                summary, rows = _launched_by_deepspeed(out_dir)
            elif name == "zero2":
                user_json = out_dir / "user_ds.json"
                user_json.write_text(json.dumps(USER_JSON))
                summary, rows = train(
                    out_dir, name, nproc=2, extra=[f"deepspeed_config={user_json}"], timeout=RUN_TIMEOUT
                )
            else:
                summary, rows = train(out_dir, name, nproc=2, extra=EXTRA_ARGS[name], timeout=RUN_TIMEOUT)
            runs[name] = (summary, rows, out_dir)
        return runs[name]

    return get


def _ds_config(out_dir: Path) -> dict:
    return json.loads((out_dir / CONFIG_FILE).read_text())


@needs_deepspeed
@runs_deepspeed
@pytest.mark.parametrize(
    "name",
    [
        "zero1",
        "zero2",
        "zero3",
        # The offload variants, each stage's run with its state on the host: under --all.
        pytest.param("zero2-offload", marks=pytest.mark.extended),
        pytest.param("zero3-offload", marks=pytest.mark.extended),
    ],
)
def test_losses_match_single_at_every_step(name, zero_run, reference_run):
    summary, rows, _ = zero_run(name)
    assert summary["world_size"] == 2 and summary["steps"] == len(reference_run[1])
    deviation = max_rel_diff(rows, reference_run[1])
    print(f"{name}: largest relative loss deviation from single {deviation:.2e}")
    assert deviation < LOSS_TOLERANCE


def _held(summary: dict, category: str) -> int:
    return summary[f"mem_{category}_bytes"]  # the maximum over ranks


@needs_deepspeed
@runs_deepspeed
def test_each_stage_shards_what_it_names(zero_run, reference_run):
    single = reference_run[0]
    # AdamW's moments are 8 bytes a parameter; DeepSpeed adds its fp32 master copy (4 more),
    # which parabench counts as optimizer state: 12 bytes a parameter, split over 2 ranks.
    half_optimizer = single["mem_optimizer_bytes"] * 12 / 8 / 2
    for name in ("zero1", "zero2", "zero3"):
        summary, _, out_dir = zero_run(name)
        assert 0.9 < _held(summary, "optimizer") / half_optimizer < 1.1, name
        grads = _held(summary, "grads")
        if name == "zero3":
            # ZeRO-3 also holds its reduction bucket all run long: one rank's share of the model, in fp32 here.
            bucket = _ds_config(out_dir)["zero_optimization"]["reduce_bucket_size"] * 4
            assert bucket == pytest.approx(_held(single, "grads") / 2, rel=0.01)
            grads -= bucket
        # Reduced gradients are partitioned (a parameter straddling the partition edge is kept whole).
        assert grads < 0.7 * _held(single, "grads"), name
    for name in ("zero1", "zero2"):
        assert _held(zero_run(name)[0], "params") == _held(single, "params"), f"{name} keeps the whole model"
    zero3 = zero_run("zero3")[0]
    assert 0.45 < _held(zero3, "params") / _held(single, "params") < 0.6


@needs_deepspeed
@runs_deepspeed
@pytest.mark.extended
def test_offload_variants_put_optimizer_state_on_the_cpu(zero_run, reference_run):
    single = reference_run[0]
    zero2, zero2_offload, zero3_offload = (zero_run(n) for n in ("zero2", "zero2-offload", "zero3-offload"))
    assert _ds_config(zero2[2])["zero_optimization"]["offload_optimizer"]["device"] == "none"
    assert _ds_config(zero2_offload[2])["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    zero3_section = _ds_config(zero3_offload[2])["zero_optimization"]
    assert zero3_section["offload_optimizer"]["device"] == zero3_section["offload_param"]["device"] == "cpu"
    assert set(zero2_offload[0]["memory_by_device_rank0"]["optimizer"]) == {"cpu"}
    assert set(zero3_offload[0]["memory_by_device_rank0"]["optimizer"]) == {"cpu"}
    assert set(zero3_offload[0]["memory_by_device_rank0"]["params"]) == {"cpu"}
    # Offloaded or not, the shards are the same size...
    assert 0.45 < _held(zero3_offload[0], "params") / _held(single, "params") < 0.6
    # ...but ZeRO-2 offload keeps a host copy of its parameter partition to upload
    # updated weights from: on a CPU host that extra copy is what tells it apart.
    extra = _held(zero2_offload[0], "params") - _held(zero2[0], "params")
    assert 0.45 < extra / _held(single, "params") < 0.55


@needs_deepspeed
@runs_deepspeed
def test_user_json_is_merged_over_the_built_config(zero_run):
    config = _ds_config(zero_run("zero2")[2])
    zero = config["zero_optimization"]
    assert zero["overlap_comm"] is False and zero["reduce_bucket_size"] == 2048  # the user's values
    assert config["train_micro_batch_size_per_gpu"] == 4  # "auto": the run's 8 sequences over 2 ranks
    assert config["bf16"]["enabled"] is False and config["gradient_clipping"] == 1.0


@needs_deepspeed
@runs_deepspeed
def test_deepspeed_launcher_writes_the_same_files(zero_run):
    summary, rows, out_dir = zero_run("zero3")
    assert {p.name for p in out_dir.iterdir()} >= {"metrics.jsonl", "summary.json", CONFIG_FILE}
    assert summary["strategy"] == "zero3" and summary["world_size"] == 2 and summary["micro_batch"] == 4
    assert [r["step"] for r in rows] == list(range(1, 11))


@needs_deepspeed
@pytest.mark.parametrize(
    "args, json_text, expected",
    [
        (
            ["strategy=zero2", "strategy_options.stage=3"],
            None,
            "strategy 'zero2' means stage=2: drop strategy_options.stage",
        ),
        (
            ["strategy=ddp", "strategy_options.offload_optimizer=true"],
            None,
            "strategy 'ddp' has no option offload_optimizer",
        ),
        (
            ["strategy=zero1"],
            '{"train_micro_batch_size_per_gpu": 3}',
            "sets train_micro_batch_size_per_gpu=3 but this run has 16: set micro_batch=",
        ),
        (["strategy=zero1"], "{not json", "is not valid JSON"),
    ],
)
def test_cli_bad_input_is_one_line(args, json_text, expected, tmp_path):
    if json_text is not None:
        (tmp_path / "ds.json").write_text(json_text)
        args = [*args, f"deepspeed_config={tmp_path / 'ds.json'}"]
    proc = run_cli(["train", *args, "steps=1"], timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("parabench: error: ") and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert expected in proc.stderr


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, "not found: give the path of a DeepSpeed JSON file"),
        ("[1, 2]", "must hold a JSON object of DeepSpeed settings"),
    ],
)
def test_user_json_that_is_missing_or_not_an_object_is_refused(text, expected, tmp_path):
    path = tmp_path / "ds.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(DeepSpeedConfigError, match=expected):
        read_user_config(str(path))


def _ctx(precision: str = "fp32") -> RunContext:
    return RunContext(
        rank=0,
        world_size=2,
        local_rank=0,
        device=torch.device("cpu"),
        precision=precision,
        micro_batch=4,
        grad_accum=2,
        grad_clip=0.0,
    )


def _run(stage: int = 2, **kw) -> dict:
    options = dict(offload_optimizer=False, offload_params=False, torch_optimizer_offloaded=False) | kw
    return run_config(_ctx(), stage=stage, **options)


@pytest.mark.parametrize(
    "user, expected",
    [
        ({"bf16": {"enabled": True}}, "sets bf16.enabled=true but the run's precision is fp32: set precision=bf16"),
        ({"bfloat16": {"enabled": True}}, "set precision=bf16"),
        (
            {"zero_optimization": {"stage": 3}},
            "sets zero_optimization.stage=3 but the strategy runs stage 2: use strategy=zero3",
        ),
        ({"gradient_accumulation_steps": 4}, "set grad_accum="),
        ({"gradient_clipping": 1.0}, "set grad_clip="),
        ({"optimizer": {"type": "Adam"}}, "remove it and set lr="),
        ({"scheduler": {"type": "WarmupLR"}}, "has a section 'scheduler'"),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, "offload comes from the strategy name"),
        ({"zero_optimization": 2}, "zero_optimization must be an object"),
        ({"activation_checkpointing": {"cpu_checkpointing": True}}, "no parabench model calls it"),
    ],
)
def test_user_json_that_contradicts_the_run_is_refused(user, expected):
    with pytest.raises(DeepSpeedConfigError, match=expected.replace("(", r"\(")):
        check_user_config(user, _run(), "ds.json")


def test_user_json_that_agrees_or_says_auto_is_accepted():
    user = {
        "train_micro_batch_size_per_gpu": 4,
        "train_batch_size": "auto",
        "fp16": {"enabled": False},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}, "overlap_comm": True},
    }
    check_user_config(user, _run(), "ds.json")
    merged = final_config(sizing_config(ModelSize(params=8193, hidden=64), 2, world_size=2), _run(), user)
    assert merged["train_batch_size"] == 16 and merged["zero_optimization"]["overlap_comm"] is True
    assert merged["zero_optimization"]["reduce_bucket_size"] == 8194  # the model's size, made even
    assert merged["gradient_clipping"] == 0.0  # written even when off: DeepSpeed would clip at 1.0


@pytest.mark.parametrize(
    "options, expected",
    [
        ((0, False, False), "not a ZeRO stage"),
        ((True, False, False), "not a ZeRO stage"),
        ((2, "cpu", False), "offload_optimizer=cpu must be true or false"),
        ((2, True, True), "offloading parameters needs ZeRO stage 3"),
    ],
)
def test_bad_plugin_options_are_refused(options, expected):
    with pytest.raises(DeepSpeedConfigError, match=expected):
        check_zero_options(*options)


def test_run_config_sets_what_the_run_fixes():
    offload = run_config(
        _ctx("bf16"), stage=3, offload_optimizer=True, offload_params=True, torch_optimizer_offloaded=True
    )
    assert offload["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert offload["zero_force_ds_cpu_optimizer"] is False  # our torch AdamW steps the host partitions
    # Gradients are reduced in DeepSpeed's default dtype, the model's, as a hand-written loop does.
    assert offload["bf16"]["enabled"] and "communication_data_type" not in offload
    assert offload["train_batch_size"] == 4 * 2 * 2
    fp16 = run_config(
        _ctx("fp16"), stage=1, offload_optimizer=False, offload_params=False, torch_optimizer_offloaded=False
    )
    assert fp16["fp16"]["loss_scale"] == 0  # dynamic loss scaling


def test_model_size_counts_tied_parameters_once_and_finds_the_width_most_matrices_share():
    from models.zoo import build_model

    model = build_model("gpt-nano")
    assert model_size(model) == ModelSize(params=sum(p.numel() for p in model.parameters()), hidden=64)
    assert model_size(torch.nn.LayerNorm(8)) == ModelSize(params=16, hidden=None)


def test_sizing_keeps_deepspeeds_defaults_and_cuts_only_what_exceeds_a_ranks_share():
    small, large = ModelSize(params=124_000_000, hidden=768), ModelSize(params=7_000_000_000, hidden=4096)
    # ZeRO-1/2: the model's size, one reduction per step as DeepSpeed's 5e8 default; ZeRO-3: one rank's share.
    assert sizing_config(small, 2, world_size=8) == {"zero_optimization": {"reduce_bucket_size": 124_000_000}}
    assert sizing_config(small, 3, world_size=8)["zero_optimization"]["reduce_bucket_size"] == 15_500_000
    assert sizing_config(small, 3, world_size=1)["zero_optimization"]["reduce_bucket_size"] == 124_000_000
    assert sizing_config(large, 1, world_size=8) == {"zero_optimization": {"reduce_bucket_size": 500_000_000}}
    # ZeRO-3 keeps DeepSpeed's persistence threshold unless it would keep every matrix of the model whole.
    assert "stage3_param_persistence_threshold" not in sizing_config(small, 3, world_size=8)["zero_optimization"]
    assert sizing_config(ModelSize(params=100_000, hidden=64), 3, world_size=1)["zero_optimization"] == {
        "reduce_bucket_size": 100_000,
        "stage3_param_persistence_threshold": 640,
    }


def test_plugin_loads_and_is_listed_unavailable_without_deepspeed(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` now fails
    # A fresh copy of the module: it must import with deepspeed missing.
    spec = importlib.util.spec_from_file_location("ds_plugin_copy", ROOT / "strategies" / "deepspeed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry = StrategyRegistry()
    registry.register_class(module.DeepSpeedStrategy)
    assert registry.names() == ["zero1", "zero2", "zero3", "zero2-offload", "zero3-offload"]
    assert registry.available_names() == []
    with pytest.raises(StrategyError, match="deepspeed is not installed: pip install deepspeed"):
        registry.create("zero3", _ctx())
