"""A user's own Accelerate YAML and DeepSpeed JSON as strategies (`accelerate:<file.yaml>`,
`deepspeed:<file.json>`): what each file resolves to, what contradicts a run (one line naming
the key) and what is followed (said), and real compares, CPU, world size 2, gpt-nano, fp32, of
`single` against five files, each of which must match it (three on every change, two `extended`).

The files are written as `accelerate config` and Hugging Face's DeepSpeed templates write them
(FSDP2 with CPU-RAM-efficient loading on, its default, or without the key, which accelerate launch
then turns on; ZeRO-2 with its settings inline; "auto" everywhere a template has it).
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
import torch

from configs.schema import RunConfig
from strategies.accelerate.environment import check_launcher_settings, launcher_mode
from strategies.base import RunContext, StrategyError
from strategies.config_files import split_spec
from strategies.mesh_layout import MeshError
from strategies.registry import default_registry
from tests.helpers import NANO, max_rel_diff, run_cli, train

needs_backends = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("accelerate", "deepspeed", "transformers")),
    reason="needs accelerate, deepspeed and transformers",
)
pytestmark = needs_backends

# As `accelerate config` (1.15) writes them.
FSDP2_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
# The same without the key: accelerate launch then turns CPU-RAM-efficient loading on, its default.
FSDP2_NO_LOADING_KEY_YAML = FSDP2_YAML.replace("  fsdp_cpu_ram_efficient_loading: true\n", "")
MULTI_CPU_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""
MULTI_GPU_YAML = MULTI_CPU_YAML.replace("MULTI_CPU", "MULTI_GPU").replace("use_cpu: true", "use_cpu: false")
# DeepSpeed ZeRO-2 through Accelerate, its settings inline (no JSON), as `accelerate config` writes it.
ZERO2_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 1
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def accelerate_naming(json_file: Path) -> dict:
    """An Accelerate config (in JSON, which Accelerate reads as well) that names a DeepSpeed JSON:
    `accelerate config` then writes no mixed_precision, the JSON's precision being Accelerate's."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "deepspeed_config": {"deepspeed_config_file": str(json_file), "zero3_init_flag": False},
        "distributed_type": "DEEPSPEED",
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": 1,
        "num_processes": 2,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }


# Hugging Face's ZeRO-2 template, less its scheduler (tests/strategies/test_deepspeed_auto_files.py runs it whole).
HF_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {
        "stage": 2,
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": "auto",
        "contiguous_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def write(folder: Path, name: str, content: str | dict) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2) if isinstance(content, dict) else textwrap.dedent(content))
    return path


def ctx(world_size: int = 2, precision: str = "fp32", **config) -> RunContext:
    """Rank 0 of a run of batch_size 8 (micro-batch 4 per rank at world size 2)."""
    cfg = RunConfig(**{"batch_size": 8, "precision": precision, **config})
    micro, accum = cfg.world_batch(world_size)
    return RunContext(0, world_size, 0, torch.device("cpu"), precision, micro, accum, cfg.grad_clip, cfg)


def created(spec: str, run: RunContext | None = None):
    return default_registry().create(spec, run or ctx())


# ---- what a file resolves to -------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, builtin, options",
    [
        (MULTI_CPU_YAML, "accelerate-ddp", {}),
        (MULTI_GPU_YAML, "accelerate-ddp", {}),
        (FSDP2_YAML, "accelerate-fsdp", {}),
        (FSDP2_NO_LOADING_KEY_YAML, "accelerate-fsdp", {}),
        (ZERO2_YAML, "accelerate-zero2", {"stage": 2}),
        (
            FSDP2_YAML
            + "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 4\n",
            "accelerate-hsdp",
            {"shard_size": 4},
        ),
        (FSDP2_YAML + "parallelism_config:\n  parallelism_config_tp_size: 2\n", "accelerate-fsdp-tp", {"tp_size": 2}),
        (
            MULTI_GPU_YAML.replace("MULTI_GPU", "DEEPSPEED") + "deepspeed_config:\n  zero_stage: 3\n",
            "accelerate-zero3",
            {"stage": 3},
        ),
    ],
)
def test_an_accelerate_config_runs_as_the_builtin_it_amounts_to(tmp_path, content, builtin, options):
    path = write(tmp_path, "mine.yaml", content)
    entry = default_registry().get(f"accelerate:{path}")
    built = default_registry().get(builtin)
    assert entry.resolves_to == builtin and entry.cls is built.cls
    assert entry.plan == built.plan  # the planner plans it as that built-in
    assert entry.options == {**built.options, **options}
    assert entry.description.endswith(f"run as {builtin}")


def test_a_deepspeed_json_named_by_an_accelerate_config_decides_its_stage_and_is_part_of_it(tmp_path):
    json_file = write(tmp_path, "ds.json", {**HF_ZERO2, "zero_optimization": {"stage": 3}})
    path = write(tmp_path, "mine.json", accelerate_naming(json_file))
    entry = default_registry().get(f"accelerate:{path}")
    assert entry.resolves_to == "accelerate-zero3"
    assert entry.config_file.choice.files == {"deepspeed_config.deepspeed_config_file": json_file}


@pytest.mark.parametrize(
    "zero, builtin",
    [
        ({"stage": 1}, "zero1"),
        ({"stage": 2, "overlap_comm": True}, "zero2"),
        ({"stage": 3}, "zero3"),
        ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zero2-offload"),
        ({"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, "zero3-offload"),
        ({"stage": 3, "zero_hpz_partition_size": 2}, "zero3-hpz"),
    ],
)
def test_a_deepspeed_json_runs_as_the_zero_name_of_its_stage_and_offload(tmp_path, zero, builtin):
    path = write(tmp_path, "ds.json", {**HF_ZERO2, "zero_optimization": zero})
    entry = default_registry().get(f"deepspeed:{path}")
    assert entry.resolves_to == builtin and entry.plan == default_registry().get(builtin).plan


def test_a_file_keeping_parameters_gathered_is_planned_without_resharding(tmp_path):
    path = write(
        tmp_path,
        "mine.yaml",
        FSDP2_YAML.replace("fsdp_reshard_after_forward: true", "fsdp_reshard_after_forward: false"),
    )
    entry = default_registry().get(f"accelerate:{path}")
    assert entry.resolves_to == "accelerate-fsdp" and entry.plan.reshard_after_forward is False


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("v1.yaml", FSDP2_YAML.replace("fsdp_version: 2", "fsdp_version: 1"), "fsdp_config.fsdp_version: 1"),
        ("no.yaml", MULTI_GPU_YAML.replace("MULTI_GPU", "'NO'"), "distributed_type: NO"),
        ("false.yaml", MULTI_GPU_YAML.replace("MULTI_GPU", "NO"), "distributed_type: False"),
        ("xla.yaml", MULTI_GPU_YAML.replace("MULTI_GPU", "XLA"), "distributed_type: XLA"),
        ("dyn.yaml", MULTI_GPU_YAML + "dynamo_config:\n  dynamo_backend: INDUCTOR\n", "dynamo_config.dynamo_backend"),
        ("old.yaml", MULTI_GPU_YAML + "ipex_config:\n  ipex: false\n", "cannot read it"),
        (
            "off.yaml",
            FSDP2_YAML.replace("fsdp_offload_params: false", "fsdp_offload_params: true"),
            "fsdp_offload_params",
        ),
        (
            "ac.yaml",
            FSDP2_YAML.replace("fsdp_activation_checkpointing: false", "fsdp_activation_checkpointing: true"),
            "fsdp_activation_checkpointing",
        ),
        (
            "cp.yaml",
            FSDP2_YAML + "parallelism_config:\n  parallelism_config_cp_size: 2\n",
            "parallelism_config_cp_size",
        ),
        (
            "rep.yaml",
            FSDP2_YAML + "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n",
            "parallelism_config_dp_shard_size: 1",
        ),
        (
            "ds0.yaml",
            MULTI_GPU_YAML.replace("MULTI_GPU", "DEEPSPEED") + "deepspeed_config:\n  zero_stage: 0\n",
            "deepspeed_config.zero_stage: 0",
        ),
        (
            "dsoff.yaml",
            MULTI_GPU_YAML.replace("MULTI_GPU", "DEEPSPEED")
            + "deepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: cpu\n",
            "deepspeed_config.offload_optimizer_device: cpu",
        ),
        ("s0.json", {"zero_optimization": {"stage": 0}}, "stage 0"),
        ("none.json", {"train_batch_size": 8}, "sets no zero_optimization.stage"),
        ("auto.json", {"zero_optimization": {"stage": "auto"}}, "zero_optimization.stage"),
        ("s1off.json", {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}, "at stage 1"),
        ("nvme.json", {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "offload_param.device"),
        ("q.json", {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "ZeRO++"),
    ],
)
def test_a_file_no_builtin_can_run_is_one_line_naming_the_key(tmp_path, name, content, words):
    path = write(tmp_path, name, content)
    kind = "deepspeed" if name.endswith(".json") else "accelerate"
    with pytest.raises(StrategyError, match=words.replace(".", r"\.").replace("+", r"\+")) as caught:
        default_registry().get(f"{kind}:{path}")
    assert "\n" not in str(caught.value)


def test_a_missing_file_or_unknown_kind_says_what_to_give(tmp_path):
    with pytest.raises(StrategyError, match="names no file"):
        default_registry().get(f"accelerate:{tmp_path / 'missing.yaml'}")
    with pytest.raises(StrategyError, match="or accelerate:<file>"):
        default_registry().get(f"megatron:{tmp_path / 'x.yaml'}")
    assert split_spec("fsdp") is None and split_spec("accelerate:a:b.yaml") == ("accelerate", "a:b.yaml")


def test_an_edited_file_is_read_again(tmp_path):
    path = write(tmp_path, "ds.json", {"zero_optimization": {"stage": 1}})
    assert default_registry().get(f"deepspeed:{path}").resolves_to == "zero1"
    write(tmp_path, "ds.json", {"zero_optimization": {"stage": 3}, "train_batch_size": "auto"})
    assert default_registry().get(f"deepspeed:{path}").resolves_to == "zero3"


# ---- against the run: refused in one line, or followed and said --------------------------------


def test_another_precision_is_refused_naming_the_key(tmp_path):
    path = write(tmp_path, "fp16.yaml", MULTI_GPU_YAML.replace("mixed_precision: 'no'", "mixed_precision: fp16"))
    with pytest.raises(
        StrategyError,
        match=r"sets mixed_precision: fp16 but the run's precision is fp32: set "
        r"mixed_precision: 'no' in it, or precision=fp16",
    ):
        created(f"accelerate:{path}")
    json_file = write(tmp_path, "bf16.json", {**HF_ZERO2, "bf16": {"enabled": True}})
    with pytest.raises(StrategyError, match=r"bf16\.enabled=true but the run's precision is fp32"):
        created(f"deepspeed:{json_file}")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"train_batch_size": 32}, r"train_batch_size=32 but the global batch of the comparison is 8"),
        ({"gradient_clipping": 0.5}, r"gradient_clipping=0\.5 but the run clips at grad_clip=1\.0"),
        ({"gradient_accumulation_steps": 3}, r"gradient_accumulation_steps=3, which does not divide the 4"),
        (
            {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
            r"train_micro_batch_size_per_gpu=4 x gradient_accumulation_steps=2 = 8 sequences per rank",
        ),
        (
            {"scheduler": {"type": "WarmupCosineLR", "params": {}}},
            r"scheduler\.type=\"WarmupCosineLR\", a schedule the other strategies cannot",
        ),
        ({"optimizer": {"type": "SGD", "params": {"lr": "auto"}}}, r"optimizer\.type=SGD"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}, r"optimizer\.params\.lr=0\.0001"),
        ({"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}}, r"allgather_bucket_size to \"auto\""),
    ],
)
def test_a_deepspeed_json_contradicting_the_run_is_one_line_naming_the_key(tmp_path, changes, words):
    path = write(tmp_path, "ds.json", {**HF_ZERO2, **changes})
    with pytest.raises(StrategyError, match=words) as caught:
        created(f"deepspeed:{path}")
    assert "\n" not in str(caught.value)


def test_the_templates_auto_values_and_adamw_are_followed_and_said(tmp_path):
    path = write(tmp_path, "ds.json", HF_ZERO2)
    strategy = created(f"deepspeed:{path}")
    assert "optimizer" not in strategy.user_config  # parabench's AdamW is that optimizer
    assert any("AdamW is the run's AdamW" in line for line in strategy.followed)
    assert any('"auto" values' in line and "reduce_bucket_size" in line for line in strategy.followed)


def test_the_files_accumulation_is_followed_unless_the_run_fixed_another(tmp_path):
    path = write(tmp_path, "ds.json", {**HF_ZERO2, "gradient_accumulation_steps": 2, "train_batch_size": 8})
    strategy = created(f"deepspeed:{path}")
    assert (strategy.ctx.micro_batch, strategy.ctx.grad_accum) == (2, 2)
    assert strategy.run_config["gradient_accumulation_steps"] == 2
    assert any("gradient_accumulation_steps=2: micro-batch 2 x 2 micro-steps x 2 ranks" in f for f in strategy.followed)
    with pytest.raises(StrategyError, match="drop micro_batch= and grad_accum= to follow the file"):
        created(f"deepspeed:{path}", ctx(micro_batch=4))
    yaml = (
        MULTI_GPU_YAML.replace("MULTI_GPU", "DEEPSPEED")
        + "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4\n"
    )
    strategy = created(f"accelerate:{write(tmp_path, 'z2.yaml', yaml)}")
    assert (strategy.ctx.micro_batch, strategy.ctx.grad_accum) == (1, 4)


def test_the_device_and_process_count_are_the_runs_and_said(tmp_path):
    strategy = created(f"accelerate:{write(tmp_path, 'gpu.yaml', MULTI_GPU_YAML)}")
    assert any("MULTI_GPU, on a machine without GPUs" in line for line in strategy.followed)
    strategy = created(f"accelerate:{write(tmp_path, 'fsdp.yaml', FSDP2_YAML)}")
    assert any("num_processes: 8: the run's 2 processes instead" in line for line in strategy.followed)
    assert any("fsdp_cpu_ram_efficient_loading: true is off here" in line for line in strategy.followed)


@pytest.mark.parametrize(
    "name, content, mode",
    [("cpu.yaml", MULTI_CPU_YAML, "ddp"), ("gpu.yaml", MULTI_GPU_YAML, "ddp"), ("fsdp.yaml", FSDP2_YAML, "fsdp")],
)
def test_the_settings_are_what_accelerate_launch_sets_from_the_file(tmp_path, name, content, mode):
    """Made by Accelerate's own launch code: its mode is the built-in's, and nothing in them
    contradicts the run (the same check as under `accelerate launch`)."""
    strategy = created(f"accelerate:{write(tmp_path, name, content)}")
    env = strategy._file_env
    assert launcher_mode(env) == mode and env["ACCELERATE_MIXED_PRECISION"] == "no"
    check_launcher_settings(env, mode, strategy.ctx)
    assert not [key for key in env if not key.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))]


def test_cpu_ram_efficient_loading_is_off_whether_the_file_sets_it_or_leaves_it_to_the_launcher(tmp_path):
    """accelerate launch turns it on where the file has no key: what decides is what it sets, the
    same for both files, and what each file says is named."""
    with_key = created(f"accelerate:{write(tmp_path, 'key.yaml', FSDP2_YAML)}")
    without = created(f"accelerate:{write(tmp_path, 'nokey.yaml', FSDP2_NO_LOADING_KEY_YAML)}")
    assert without._file_env == with_key._file_env and with_key._file_env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "false"
    assert any(
        "fsdp_cpu_ram_efficient_loading (not in the file: accelerate launch's default, true) is off here" in line
        for line in without.followed
    )
    off = FSDP2_YAML.replace("fsdp_cpu_ram_efficient_loading: true", "fsdp_cpu_ram_efficient_loading: false")
    strategy = created(f"accelerate:{write(tmp_path, 'off.yaml', off)}")
    assert strategy._file_env == with_key._file_env and not [f for f in strategy.followed if "efficient" in f]


def test_a_file_accelerate_launch_refuses_is_one_line_naming_its_keys(tmp_path):
    yaml = FSDP2_NO_LOADING_KEY_YAML.replace("fsdp_version: 2", "fsdp_sync_module_states: false\n  fsdp_version: 2")
    with pytest.raises(StrategyError, match=r"accelerate launch refuses it \(When using `fsdp_cpu_ram_efficient_load"):
        created(f"accelerate:{write(tmp_path, 'nosync.yaml', yaml)}")


def test_accelerates_own_fsdp_mixed_precision_is_said(tmp_path):
    bf16 = FSDP2_YAML.replace("mixed_precision: 'no'", "mixed_precision: bf16")
    strategy = created(f"accelerate:{write(tmp_path, 'bf16.yaml', bf16)}", ctx(precision="bf16"))
    assert any("gradients reduced in bf16 (accelerate-fsdp reduces them in fp32)" in f for f in strategy.followed)


def test_weights_prepare_unties_are_refused_naming_them():
    """A move to the meta device and back (CPU-RAM-efficient loading's) leaves the head and the
    embedding two parameters: the check after prepare() refuses that model in one line."""
    from models.zoo import build_model
    from strategies.accelerate.tied_parameters import check_still_shared, shared_parameters

    model = build_model("gpt-nano", {})
    shared = shared_parameters(model)
    assert shared == [("wte.weight", "lm_head.weight")]
    check_still_shared(shared, model, "fsdp")
    with pytest.raises(StrategyError, match=r"made wte\.weight and lm_head\.weight separate parameters") as caught:
        check_still_shared(shared, model.to("meta"), "fsdp")
    assert "\n" not in str(caught.value)


def test_a_parallelism_config_must_lay_out_the_runs_processes(tmp_path):
    yaml = (
        FSDP2_YAML
        + "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 4\n"
    )
    with pytest.raises(StrategyError, match=r"lays out 2 x 4 x 1 = 8 processes .* but the run has 2"):
        created(f"accelerate:{write(tmp_path, 'hsdp.yaml', yaml)}")


@pytest.mark.parametrize(
    "name, content, key",
    [
        ("tp.yaml", FSDP2_YAML + "parallelism_config:\n  parallelism_config_tp_size: 4\n", "config_tp_size: 4"),
        (
            "hsdp.yaml",
            FSDP2_YAML
            + "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 3\n",
            "parallelism_config_dp_shard_size: 3",
        ),
        ("hpz.json", {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}}, "zero_hpz_partition_size: 3"),
    ],
)
def test_a_size_the_file_sets_that_the_world_cannot_lay_out_names_the_files_key(tmp_path, name, content, key):
    """The user wrote no strategy_options: the size's error, where the run's preflight lays the mesh
    out (and where a DeepSpeed file's strategy is built), leads with the file's key, in the layout
    error's class (a compare skips the file on this world size, as it would the built-in)."""
    kind = "deepspeed" if name.endswith(".json") else "accelerate"
    spec = f"{kind}:{write(tmp_path, name, content)}"
    refusals = [lambda: default_registry().mesh_layout(spec, 2, 2)]
    if kind == "deepspeed":  # an Accelerate file's own check of its process count comes first there
        refusals.append(lambda: created(spec))
    for refused in refusals:
        with pytest.raises(MeshError) as caught:
            refused()
        message = str(caught.value)
        assert message.startswith(f"{spec} sets ") and key in message and "change it in the file" in message
        assert "does not divide the world size 2" in message and "\n" not in message


def test_a_wrapped_class_the_model_lacks_is_refused_naming_the_key(tmp_path):
    from models.zoo import build_model

    yaml = FSDP2_YAML.replace(
        "fsdp_transformer_layer_cls_to_wrap: Block", "fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer"
    )
    strategy = created(f"accelerate:{write(tmp_path, 'llama.yaml', yaml)}")
    with torch.device("meta"):
        model = build_model("gpt-nano", {})
    with pytest.raises(StrategyError, match=r"fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer, .*Block"):
        strategy.check_model(model)


def test_a_file_strategy_under_accelerate_launch_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    with pytest.raises(StrategyError, match="not accelerate launch"):
        created(f"accelerate:{write(tmp_path, 'gpu.yaml', MULTI_GPU_YAML)}")


def test_a_parallelism_config_runs_as_hybrid_sharding_on_the_cpu_and_matches_single(tmp_path, reference_run):
    """2 replicas x 2 shards at world size 4: on a CPU Accelerate is given the file's ParallelismConfig
    once FSDP is on, as accelerate-hsdp is given its own."""
    yaml = FSDP2_YAML + (
        "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n"
    )
    summary, rows = train(tmp_path / "run", f"accelerate:{write(tmp_path, 'hsdp.yaml', yaml)}", nproc=4)
    assert summary["mesh"]["shape"] == [2, 2] and max_rel_diff(rows, reference_run[1]) < 1e-4


# ---- compares: each file beside single, on the same model, data, seed and global batch ---------------

# label -> what the file runs as, and its run's folder in the compare. Two files named zero2.json (one
# Accelerate config, one DeepSpeed JSON): told apart by their folders.
RUNS_AS = {
    "fsdp2.yaml": ("accelerate-fsdp", "accelerate-fsdp2.yaml"),
    "multi_cpu.yaml": ("accelerate-ddp", "accelerate-multi_cpu.yaml"),
    "deepspeed/zero2.json": ("zero2", "deepspeed-deepspeed-zero2.json"),
    "accelerate/zero2.json": ("accelerate-zero2", "accelerate-accelerate-zero2.json"),
    "deepspeed_zero2.yaml": ("accelerate-zero2", "accelerate-deepspeed_zero2.yaml"),
}
# On every change an Accelerate YAML, a DeepSpeed JSON and an Accelerate config naming it (the two
# zero2.json); the other two files' compare is `extended`.
EVERY_CHANGE_FILES = ("fsdp2.yaml", "deepspeed/zero2.json", "accelerate/zero2.json")
OTHER_FILES = ("multi_cpu.yaml", "deepspeed_zero2.yaml")


def compare_args(out: Path, specs: list[str]) -> list[str]:
    return ["compare", f"strategies=[single,{','.join(specs)}]", "noise_runs=0", f"out_dir={out}", *NANO, "nproc=2"]


def compare_of(folder: Path, labels: tuple[str, ...]) -> tuple[Path, dict[str, str], str]:
    """single beside the files `labels` names, written into `folder`: (out_dir, label -> spec, stdout)."""
    deepspeed_json = folder / "deepspeed" / "zero2.json"
    writers = {
        # Without the loading key: accelerate launch's default would have it on (and untie the head).
        "fsdp2.yaml": lambda: f"accelerate:{write(folder, 'fsdp2.yaml', FSDP2_NO_LOADING_KEY_YAML)}",
        "multi_cpu.yaml": lambda: f"accelerate:{write(folder, 'multi_cpu.yaml', MULTI_CPU_YAML)}",
        "deepspeed/zero2.json": lambda: (
            f"deepspeed:{write(folder / 'deepspeed', 'zero2.json', {**HF_ZERO2, 'gradient_accumulation_steps': 2})}"
        ),
        "accelerate/zero2.json": lambda: (
            f"accelerate:{write(folder / 'accelerate', 'zero2.json', accelerate_naming(deepspeed_json))}"
        ),
        "deepspeed_zero2.yaml": lambda: f"accelerate:{write(folder, 'deepspeed_zero2.yaml', ZERO2_YAML)}",
    }
    specs = {label: writers[label]() for label in labels}
    out = folder / "compare"
    proc = run_cli(compare_args(out, list(specs.values())), timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    return out, specs, proc.stdout


@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    return compare_of(tmp_path_factory.mktemp("files"), EVERY_CHANGE_FILES)


@pytest.fixture(scope="module")
def compare_of_the_others(tmp_path_factory):
    return compare_of(tmp_path_factory.mktemp("other-files"), OTHER_FILES)


def each_file_matched_single_in_fp32(compare: tuple[Path, dict[str, str], str]) -> None:
    out, specs, _ = compare
    results = {r["name"]: r for r in json.loads((out / "results.json").read_text())["strategies"]}
    assert set(results) == {"single", *specs}
    for name, result in results.items():
        assert result["status"] == "ok", (name, result["error"])
        assert result["verdict_kind"] == ("reference" if name == "single" else "matches"), (name, result["verdict"])
    runs_as = {name: r["runs_as"] for name, r in results.items()}
    assert runs_as == {"single": None, **{label: RUNS_AS[label][0] for label in specs}}
    # The planner planned each as the built-in it ran as.
    assert {r["prediction"]["planned_as"] for n, r in results.items() if n != "single"} == set(runs_as.values()) - {
        None
    }


def each_file_ran_in_a_folder_of_its_own(compare: tuple[Path, dict[str, str], str]) -> None:
    out, specs, _ = compare
    folders = sorted(p.name for p in out.iterdir() if (p / "run.json").is_file())
    assert folders == sorted(["single", *(RUNS_AS[label][1] for label in specs)])


def the_report_lists_them_by_file_name(compare: tuple[Path, dict[str, str], str]) -> None:
    out, specs, _ = compare
    report = (out / "report.md").read_text()
    assert "## Config files" in report
    for label, spec in specs.items():
        assert f"| `{label}` | `{spec}` |" in report


def test_each_file_matches_single_in_fp32(compare):
    each_file_matched_single_in_fp32(compare)


def test_each_file_ran_in_a_folder_of_its_own_as_its_file_says(compare):
    each_file_ran_in_a_folder_of_its_own(compare)
    out, _, stdout = compare
    summary = json.loads((out / "deepspeed-deepspeed-zero2.json" / "summary.json").read_text())
    assert (summary["micro_batch"], summary["grad_accum"]) == (2, 2)  # the file's accumulation, the same batch
    assert "followed its gradient_accumulation_steps=2" in stdout
    log = (out / "accelerate-fsdp2.yaml" / "log.txt").read_text()
    assert "accelerate: mode fsdp (accelerate config fsdp2.yaml): FSDP v2, 2 processes" in log
    assert "accelerate launch's default, true) is off here" in stdout


def test_the_report_lists_them_by_file_name(compare):
    the_report_lists_them_by_file_name(compare)


@pytest.mark.extended
def test_the_other_files_match_single_in_their_own_folders_and_the_report(compare_of_the_others):
    each_file_matched_single_in_fp32(compare_of_the_others)
    each_file_ran_in_a_folder_of_its_own(compare_of_the_others)
    the_report_lists_them_by_file_name(compare_of_the_others)


def test_an_edited_file_is_another_configuration_to_resume(compare):
    out, specs, _ = compare
    json_file = Path(split_spec(specs["deepspeed/zero2.json"])[1])
    json_file.write_text(json.dumps({**HF_ZERO2, "gradient_accumulation_steps": 4}))
    proc = run_cli([*compare_args(out, list(specs.values())), "resume=auto"], timeout=240)
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    # The DeepSpeed JSON is the deepspeed: strategy's file and, in turn, the file its Accelerate config names.
    assert error.startswith("parabench: error: ") and "file.strategy" in error and "another configuration" in error


@pytest.mark.parametrize(
    "name, content, key",
    [
        ("fp16.yaml", MULTI_GPU_YAML.replace("mixed_precision: 'no'", "mixed_precision: fp16"), "mixed_precision"),
        ("big.json", {**HF_ZERO2, "train_batch_size": 64}, "train_batch_size"),
    ],
)
def test_a_compare_refuses_a_contradicting_file_in_one_line(tmp_path, name, content, key):
    path = write(tmp_path, name, content)
    kind = "deepspeed" if name.endswith(".json") else "accelerate"
    args = ["compare", f"strategies=[single,{kind}:{path}]", f"out_dir={tmp_path / 'out'}", *NANO, "nproc=2"]
    proc = run_cli(args, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("parabench: error: "), proc.stderr
    assert f"sets {key}" in lines[0]
