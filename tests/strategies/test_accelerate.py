"""Accelerate's five modes against `single` (CPU, gloo, world size 2, fp32), `accelerate
launch` with the shipped config files, and the one-line refusals of launch settings
that contradict the strategy or the run.

Five two-process runs, shared by every check: ddp and zero3 under `accelerate launch`
(its ACCELERATE_* settings), fsdp, zero1 and zero2 configured in code; fsdp and zero2
also accumulate (micro_batch=2: 2 ranks x 2 x 2 accumulation = the same batch of 8).
zero1's and zero2's checks are `extended`, and their runs made only then.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from harness.train.distributed import free_port
from strategies.accelerate.ddp_mode import AccelerateDDPStrategy
from strategies.accelerate.environment import ACCELERATE_PRECISION, check_launcher_settings, launcher_mode
from strategies.accelerate.fsdp_mode import AccelerateFSDPStrategy
from strategies.accelerate.zero_mode import AccelerateDeepSpeedStrategy
from strategies.base import RunContext, StrategyError
from strategies.registry import default_registry
from tests.helpers import (
    NANO,
    ROOT,
    OnFirstUse,
    env_for_tests,
    forked_torchrun,
    max_rel_diff,
    read_run,
    run_bounded,
    run_cli,
    train,
)

TOLERANCE = 1e-4  # relative, every step: only the order of floating-point sums differs
ACCELERATE_CLI = Path(sys.executable).parent / "accelerate"
CONFIGS = ROOT / "configs" / "accelerate"
MODES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
# Accelerate's ParallelismConfig layouts, run in tests/strategies/test_equivalence_mesh.py.
MESH_MODES = ("hsdp", "fsdp-tp")

needs_backends = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("accelerate", "deepspeed", "transformers"))
    or not ACCELERATE_CLI.exists(),
    reason="needs accelerate (with its CLI), deepspeed and transformers",
)


def _accelerate_launch(config: str, num_processes: int) -> list[str]:
    return [
        str(ACCELERATE_CLI),
        "launch",
        "--config_file",
        str(CONFIGS / f"{config}.yaml"),
        "--num_processes",
        str(num_processes),
        "--main_process_port",
        str(free_port()),
    ]


def train_accelerate(
    out_dir: Path, mode: str, *, launch_config: str | None = None, nproc: int = 2, extra: list[str] | None = None
) -> tuple[dict, list[dict], str]:
    """One run of accelerate-<mode> on `nproc` processes, started by `accelerate launch
    --config_file configs/accelerate/<launch_config>.yaml` or by nproc=: (summary, rows, stdout)."""
    args = ["train", f"strategy=accelerate-{mode}", f"out_dir={out_dir}", *NANO, *(extra or [])]
    if launch_config:
        proc = run_cli(args, timeout=240, prefix=_accelerate_launch(launch_config, nproc))
    else:
        proc = run_cli([*args, f"nproc={nproc}"], timeout=240)
    assert proc.returncode == 0, (
        f"accelerate-{mode} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return (*read_run(out_dir), proc.stdout)


def mode_lines(stdout: str) -> list[str]:
    """The line(s) the plugin prints to say which mode Accelerate is in."""
    return [line for line in stdout.splitlines() if line.startswith("accelerate: mode")]


# mode -> (launch_config, extra): ddp and zero3 under `accelerate launch`, the others configured in code.
RUNS = {
    "ddp": ("ddp", []),
    "fsdp": (None, ["micro_batch=2"]),
    "zero1": (None, []),
    "zero2": (None, ["micro_batch=2"]),
    "zero3": ("zero3", []),
}
# On every change ddp and zero3 (each under `accelerate launch`) and fsdp (accumulating); zero1's and
# zero2's runs under --all (zero2 still trains on every change: test_a_users_deepspeed_json_reaches_the_zero_modes
# and the accumulation probe).
EXTENDED_MODES = ("zero1", "zero2")


def selected(mode: str, *values):
    """`mode`'s parameters (`mode` alone without others), marked `extended` for the modes run under --all only."""
    marks = [pytest.mark.extended] if mode in EXTENDED_MODES else []
    return pytest.param(mode, *values, marks=marks, id="-".join([mode, *values]) if values else mode)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, reference_run) -> OnFirstUse[str, tuple[dict, list[dict], str]]:
    """mode -> (summary, rows, stdout), each trained when a test first reads it; "single" is the reference."""

    def trained(mode: str) -> tuple[dict, list[dict], str]:
        if mode == "single":
            return (*reference_run, "")
        launch_config, extra = RUNS[mode]
        return train_accelerate(tmp_path_factory.mktemp(f"acc-{mode}"), mode, launch_config=launch_config, extra=extra)

    return OnFirstUse(["single", *RUNS], trained)


@needs_backends
@pytest.mark.parametrize("mode", [selected(mode) for mode in MODES])
def test_loss_matches_single(runs, mode, record_property):
    summary, rows, _ = runs[mode]
    _, reference, _ = runs["single"]
    deviation = max_rel_diff(rows, reference)
    record_property("max_rel_loss_diff", deviation)
    print(f"accelerate-{mode}: largest relative loss deviation from single = {deviation:.2e}")
    assert deviation < TOLERANCE
    assert len(rows) == 10 and summary["world_size"] == 2 and summary["strategy"] == f"accelerate-{mode}"


@needs_backends
@pytest.mark.parametrize(
    "mode, expected_type, source",
    [
        selected("ddp", "MULTI_CPU", "accelerate launch config"),
        selected("fsdp", "FSDP v2", "configured in code"),
        selected("zero1", "DEEPSPEED, ZeRO stage 1", "configured in code"),
        selected("zero2", "DEEPSPEED, ZeRO stage 2", "configured in code"),
        selected("zero3", "DEEPSPEED, ZeRO stage 3", "accelerate launch config"),
    ],
)
def test_rank0_says_which_mode_accelerate_runs(runs, mode, expected_type, source):
    summary, _, stdout = runs[mode]
    lines = mode_lines(stdout)
    assert len(lines) == 1, stdout[-2000:]  # rank 0 only
    assert lines[0].startswith(f"accelerate: mode {mode} ({source}): {expected_type}, 2 processes")
    assert f"gradient_accumulation_steps {summary['grad_accum']}" in lines[0]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory) -> list[dict]:
    """Per rank, what tests/strategies/accumulation_worker.py read after each micro-step of
    accelerate-fsdp and accelerate-zero2 (2 ranks x 2 rows x 2 micro-steps)."""
    path = tmp_path_factory.mktemp("accumulation") / "gradients.json"
    worker = ROOT / "tests" / "strategies" / "accumulation_worker.py"
    proc = run_bounded(
        forked_torchrun(2, worker, str(path), "accelerate-fsdp,accelerate-zero2", backends=True),
        timeout=240,
        env=env_for_tests(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return [json.loads(Path(f"{path}.rank{rank}").read_text()) for rank in range(2)]


@needs_backends
@pytest.mark.parametrize("mode", [selected("fsdp"), selected("zero2")])
def test_the_accumulating_runs_took_two_micro_steps_a_step(runs, mode):
    """The accumulating runs match single's curve (test_loss_matches_single) over 2 micro-steps a step."""
    summary, _, _ = runs[mode]
    assert (summary["micro_batch"], summary["grad_accum"]) == (2, 2), mode


@needs_backends
def test_accumulation_really_accumulates(accumulated):
    """The gradients show the accumulation: under FSDP nothing is reduced on the first micro-step,
    and after the last every rank holds the whole global batch's gradient, not its own
    micro-steps'; DeepSpeed's engine steps once, after the last."""
    for rank, probed in enumerate(accumulated):
        assert all("error" not in result for result in probed.values()), probed
        first, last = probed["accelerate-fsdp"]["after_micro_step"]
        assert first["unreduced"] > 0 and first["largest_difference_from"] == {"own": None, "global": None}
        assert last["unreduced"] == 0, f"rank {rank}"
        assert last["largest_difference_from"]["global"] < 1e-6, f"rank {rank}: {last}"
        assert last["largest_difference_from"]["own"] > 1e-3, f"rank {rank}: {last}"
        assert [after["global_steps"] for after in probed["accelerate-zero2"]["after_micro_step"]] == [0, 1]


@needs_backends
def test_accelerate_launch_writes_the_run_files(runs):
    summary, rows, _ = runs["ddp"]  # started by `accelerate launch --num_processes 2`
    out_dir = Path(summary["config"]["out_dir"])
    assert (out_dir / "metrics.jsonl").is_file() and (out_dir / "summary.json").is_file()
    assert summary["config"]["strategy"] == "accelerate-ddp" and summary["world_size"] == 2 and len(rows) == 10
    assert summary["versions"]["accelerate"]


@needs_backends
@pytest.mark.parametrize("mode", [selected(mode) for mode in MODES])
def test_sharding_measured_from_the_backends_tensors(runs, mode):
    single, _, _ = runs["single"]
    held = runs[mode][0]
    if mode == "ddp":
        for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
            assert held[key] == pytest.approx(single[key], rel=0.01), key
    if mode == "fsdp":
        for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
            assert held[key] == pytest.approx(single[key] / 2, rel=0.05), key
    if mode.startswith("zero"):
        # ZeRO keeps an fp32 master copy as optimizer state: (4 + 8) / 2 bytes per parameter
        # per rank, against AdamW's 8 unsharded.
        assert held["mem_optimizer_bytes"] == pytest.approx(single["mem_optimizer_bytes"] * 0.75, rel=0.05)
    if mode == "zero1":
        assert held["mem_params_bytes"] == pytest.approx(single["mem_params_bytes"], rel=0.01)
    if mode == "zero2":
        # Measured before DeepSpeed's step (which Accelerate runs inside backward): gradients present, sharded.
        assert 0 < held["mem_grads_bytes"] < single["mem_grads_bytes"] * 2 / 3
    if mode == "zero3":
        assert held["mem_params_bytes"] == pytest.approx(single["mem_params_bytes"] / 2, rel=0.05)
        # ZeRO-3 also holds its reduction bucket all run long, one rank's share of the model (fp32 here):
        # half the gradients in the partition, half in the bucket.
        assert held["mem_grads_bytes"] == pytest.approx(single["mem_grads_bytes"], rel=0.05)


@needs_backends
def test_contradicting_launch_settings_stop_the_run_in_one_line(tmp_path):
    # The environment `accelerate launch --config_file configs/accelerate/ddp.yaml` sets (see
    # test_shipped_config_file_sets_up_its_mode), in one plain process: cheaper than the launcher.
    env = env_for_tests(ACCELERATE_MIXED_PRECISION="no", ACCELERATE_DYNAMO_BACKEND="NO")
    proc = run_cli(["train", "strategy=accelerate-fsdp", f"out_dir={tmp_path}", *NANO], timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "parabench: error: accelerate launch is set up for ddp (its config file or flags) but the strategy is "
        "accelerate-fsdp: use strategy=accelerate-ddp, or launch with --config_file configs/accelerate/fsdp.yaml"
    )
    assert not (tmp_path / "metrics.jsonl").exists()


@needs_backends
def test_a_users_deepspeed_json_reaches_the_zero_modes(tmp_path):
    """deepspeed_config= is merged over Accelerate's DeepSpeed config as over zero1-3's, and the
    config Accelerate hands DeepSpeed is written where zero1-3 write theirs."""
    user_json = tmp_path / "ds.json"
    user_json.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "communication_data_type": "fp32",
                "zero_optimization": {"overlap_comm": True, "reduce_bucket_size": 2048},
            }
        )
    )
    out_dir = tmp_path / "run"
    proc = run_cli(
        ["train", "strategy=accelerate-zero2", f"out_dir={out_dir}", *NANO, "steps=2", f"deepspeed_config={user_json}"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    handed = json.loads((out_dir / "deepspeed_config.json").read_text())
    assert (
        handed["zero_optimization"]["overlap_comm"] is True
        and handed["zero_optimization"]["reduce_bucket_size"] == 2048
    )
    assert handed["communication_data_type"] == "fp32" and handed["train_micro_batch_size_per_gpu"] == 8


@needs_backends
@pytest.mark.extended  # in bf16: fsdp's fp32 curve runs on every change
def test_fsdp_mode_in_bf16_computes_what_the_native_fsdp_computes(tmp_path):
    """accelerate-fsdp takes the native fsdp's MixedPrecisionPolicy and no autocast: in bf16 its
    losses are the native ones (Accelerate's own bf16 setup, autocast over a bf16-reducing policy
    that casts the loss to bf16, differed by up to 2e-3)."""
    bf16 = ["precision=bf16", "steps=4"]
    _, native = train(tmp_path / "fsdp", "fsdp", nproc=2, extra=bf16)
    _, rows, _ = train_accelerate(tmp_path / "acc-fsdp", "fsdp", extra=bf16)
    assert max_rel_diff(rows, native) < 1e-6


def test_listed_as_unavailable_without_accelerate():
    # A fresh interpreter where `import accelerate` / `import deepspeed` fail: the module
    # must still import, and each name must say what to install.
    code = (
        "import sys; sys.modules.update(accelerate=None, deepspeed=None)\n"
        "from strategies.registry import builtin_registry\n"
        "for entry in builtin_registry().entries():\n"
        "    if entry.name.startswith('accelerate-'): print(entry.name, '|', entry.unavailable_reason)\n"
    )
    proc = run_bounded([sys.executable, "-c", code], timeout=120, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = dict(line.split(" | ") for line in proc.stdout.splitlines())
    assert set(listed) == {f"accelerate-{mode}" for mode in (*MODES, *MESH_MODES)}
    assert all(reason == "accelerate is not installed: pip install accelerate" for reason in listed.values())


@needs_backends
@pytest.mark.parametrize(
    "missing, reason",
    [
        ("deepspeed", "deepspeed is not installed: pip install deepspeed"),
        (
            "transformers",
            "transformers is not installed: Accelerate's DeepSpeed plugin needs it: pip install transformers",
        ),
    ],
)
def test_zero_modes_say_what_else_to_install(monkeypatch, missing, reason):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else real_find_spec(name, *a)
    )
    assert AccelerateDeepSpeedStrategy.unavailable_reason() == reason
    assert AccelerateDDPStrategy.unavailable_reason() is None  # ddp and fsdp need neither
    assert AccelerateFSDPStrategy.unavailable_reason() is None


# ---- in process: what the launcher's environment means -----------------------------------


def _ctx(precision: str = "fp32", grad_accum: int = 1) -> RunContext:
    return RunContext(
        rank=0,
        world_size=2,
        local_rank=0,
        device=torch.device("cpu"),
        precision=precision,
        micro_batch=2,
        grad_accum=grad_accum,
        grad_clip=1.0,
    )


LAUNCHED = {"ACCELERATE_MIXED_PRECISION": "no"}


@needs_backends
def test_each_name_fixes_its_mode():
    registry = default_registry()
    for mode in MODES:
        assert registry.create(f"accelerate-{mode}", _ctx()).mode == mode
    with pytest.raises(StrategyError, match="strategy .accelerate-zero1. means stage=1"):
        registry.create("accelerate-zero1", _ctx(), stage=3)
    with pytest.raises(StrategyError, match="strategy .accelerate-ddp. has no option stage"):
        registry.create("accelerate-ddp", _ctx(), stage=3)


@pytest.mark.parametrize(
    "env, mode",
    [
        ({}, None),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, None),  # a flag alone is not a launch
        (LAUNCHED, "ddp"),
        ({**LAUNCHED, "ACCELERATE_USE_FSDP": "true"}, "fsdp"),
        ({**LAUNCHED, "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "zero3"),
        ({**LAUNCHED, "ACCELERATE_USE_DEEPSPEED": "true"}, "zero2"),  # DeepSpeedPlugin's default stage
        ({**LAUNCHED, "ACCELERATE_USE_MEGATRON_LM": "true"}, "megatron-lm"),
    ],
)
def test_launcher_mode(env, mode):
    assert launcher_mode(env) == mode


def test_launcher_mode_reads_the_stage_from_a_deepspeed_file(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    env = {**LAUNCHED, "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config)}
    assert launcher_mode(env) == "zero1"


@pytest.mark.parametrize(
    "env, mode, ctx, fix",
    [
        (
            {**LAUNCHED, "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
            "zero2",
            _ctx(),
            "use strategy=accelerate-fsdp, or launch with --config_file configs/accelerate/zero2.yaml",
        ),
        (
            {
                **LAUNCHED,
                "ACCELERATE_USE_CPU": "True",
                "ACCELERATE_USE_DEEPSPEED": "true",
                "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
            },
            "zero2",
            _ctx(),
            "drop --cpu and launch with --config_file configs/accelerate/zero2.yaml",
        ),
        (
            {"ACCELERATE_MIXED_PRECISION": "bf16"},
            "ddp",
            _ctx("fp32"),
            "add precision=bf16, or launch with --mixed_precision no",
        ),
        (
            {"ACCELERATE_MIXED_PRECISION": "no"},
            "ddp",
            _ctx("bf16"),
            "add precision=fp32, or launch with --mixed_precision bf16",
        ),
        ({**LAUNCHED, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}, "ddp", _ctx(grad_accum=2), "add grad_accum=4"),
        ({**LAUNCHED, "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, "fsdp", _ctx(), "set fsdp_version: 2"),
    ],
)
def test_contradicting_settings_are_refused_in_one_line(env, mode, ctx, fix):
    with pytest.raises(StrategyError) as err:
        check_launcher_settings(env, mode, ctx)
    assert fix in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("precision", sorted(ACCELERATE_PRECISION))
def test_matching_settings_pass(precision):
    ctx = _ctx(precision, grad_accum=2)
    env = {
        "ACCELERATE_MIXED_PRECISION": ACCELERATE_PRECISION[precision],
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2",
    }
    assert check_launcher_settings(env, "fsdp", ctx) is None
    assert check_launcher_settings({}, "zero3", _ctx(precision)) is None  # not launched: nothing to contradict
    # Each of those settings is read: the same launch with any one of them changed is refused.
    other_precision = next(v for k, v in ACCELERATE_PRECISION.items() if k != precision)
    for key, changed, words in (
        ("ACCELERATE_MIXED_PRECISION", other_precision, f"mixed_precision={other_precision}"),
        ("ACCELERATE_USE_FSDP", "false", "set up for ddp"),
        ("FSDP_VERSION", "1", "asks for FSDP1"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", "gradient_accumulation_steps=4"),
    ):
        with pytest.raises(StrategyError, match=words):
            check_launcher_settings({**env, key: changed}, "fsdp", ctx)


@needs_backends
@pytest.mark.parametrize("mode", MODES)
def test_shipped_config_file_sets_up_its_mode(mode):
    """The environment `accelerate launch --config_file configs/accelerate/<mode>.yaml` gives
    its processes (built by Accelerate's own launch code) means <mode> and nothing contradicting."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / f"{mode}.yaml"), "--main_process_port", "0", "runner.py", "train"]
    )
    args, _, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    assert launcher_mode(env) == mode
    check_launcher_settings(env, mode, _ctx())
    if mode == "fsdp":
        assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Block" and env["FSDP_VERSION"] == "2"


@needs_backends
def test_a_launch_wrapping_a_class_the_model_lacks_is_refused_naming_the_setting(monkeypatch):
    """configs/accelerate/fsdp.yaml wraps parabench's GPT's Block: under it a Llama stops before
    prepare() in one line naming the setting and its decoder layer class, not in Accelerate's "Could
    not find the transformer layer class Block in the model."."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    from models.zoo import build_model

    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / "fsdp.yaml"), "--main_process_port", "0", "runner.py", "train"]
    )
    args, _, _ = _validate_launch_command(args)
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)
    strategy = AccelerateFSDPStrategy(_ctx())
    llama = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
    with torch.device("meta"):
        gpt, hf = build_model("gpt-nano", {}), build_model("hf:LlamaConfig", llama)
    strategy.check_model(gpt)
    with pytest.raises(StrategyError) as caught:
        strategy.check_model(hf)
    message = str(caught.value)
    assert message.startswith("accelerate launch (its config file or --fsdp_transformer_layer_cls_to_wrap) sets ")
    assert "fsdp_transformer_layer_cls_to_wrap: Block, which the model has no module of" in message
    assert "its classes (LlamaDecoderLayer, " in message and "\n" not in message


@needs_backends
def test_a_launch_with_a_parallelism_config_runs_hsdp_on_the_cpu_and_matches_single(tmp_path, reference_run):
    """`accelerate launch` with a config holding a parallelism_config (the shipped fsdp.yaml plus 2 x 2)
    sets ACCELERATE_USE_PARALLELISM_CONFIG, from which Accelerator() built and checked a
    ParallelismConfig before FSDP was on, and refused it on a CPU ("got DistributedType.NO"): the
    mode attaches its own once FSDP is on, as for a user's file, and trains single's curve."""
    config = tmp_path / "hsdp.yaml"
    shipped = (CONFIGS / "fsdp.yaml").read_text().replace("num_processes: 2", "num_processes: 4")
    config.write_text(
        shipped
        + "parallelism_config:\n  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n"
    )
    launch = [str(ACCELERATE_CLI), "launch", "--config_file", str(config), "--main_process_port", str(free_port())]
    out = tmp_path / "run"
    args = ["train", "strategy=accelerate-hsdp", "strategy_options.shard_size=2", f"out_dir={out}", *NANO]
    proc = run_cli(args, timeout=240, prefix=launch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accelerate: mode hsdp (accelerate launch config): FSDP v2, mesh 2 x 2: replicate x shard" in proc.stdout
    assert max_rel_diff(read_run(out)[1], reference_run[1]) < TOLERANCE
