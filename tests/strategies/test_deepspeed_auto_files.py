"""Hugging Face's DeepSpeed JSONs as `deepspeed:<file.json>`: "auto" everywhere its Trainer fills
it, an AdamW optimizer and a WarmupLR or WarmupDecayLR scheduler, as its DeepSpeed documentation
gives them. Each "auto" is filled from the run and said; the file's scheduler runs as DeepSpeed's own
and the compare trains every strategy under its schedule (lr_schedule=constant or linear, computed
as DeepSpeed computes them: checked here step by step against DeepSpeed's own scheduler classes);
whatever would make the comparison unfair is one line naming the key. The same JSON named by an
Accelerate config (deepspeed_config_file) runs the same way through Accelerate, its scheduler handed
to prepare() as Accelerate's DummyScheduler. CPU compares, world size 2, gpt-nano, fp32: the
documented ZeRO-2 and ZeRO-3 files (WarmupLR) beside single, and (`extended`) an Accelerate config
naming the ZeRO-2 one beside single; WarmupDecayLR's steps are held to DeepSpeed's class, as each
shape's are.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from configs.schema import ConfigError, RunConfig, load_config
from harness.train.file_settings import adopt_file_settings
from harness.train.loop import run_schedule
from harness.train.optimizer import lr_at
from models.zoo import build_model
from strategies.base import RunContext, StrategyError
from strategies.registry import default_registry
from tests.helpers import NANO, run_cli
from tests.strategies.test_config_files import accelerate_naming

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
HAS_ACCELERATE = all(importlib.util.find_spec(m) is not None for m in ("accelerate", "transformers"))
needs_accelerate = pytest.mark.skipif(not HAS_ACCELERATE, reason="needs accelerate and transformers")

AUTO_OPTIMIZER = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
AUTO_WARMUP = {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}
# Hugging Face's ds_config_zero2.json (its DeepSpeed tests and documentation).
HF_ZERO2 = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": AUTO_OPTIMIZER,
    "scheduler": {"type": "WarmupLR", "params": AUTO_WARMUP},
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
# Hugging Face's ZeRO-3 example, its bucket sizes "auto" (sized from the model's width).
HF_ZERO3 = {
    "fp16": HF_ZERO2["fp16"],
    "optimizer": AUTO_OPTIMIZER,
    "scheduler": {"type": "WarmupLR", "params": AUTO_WARMUP},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
# The documentation's WarmupDecayLR section (the Trainer's default schedule), with a linear warm-up.
DECAY = {"type": "WarmupDecayLR", "params": {**AUTO_WARMUP, "total_num_steps": "auto", "warmup_type": "linear"}}
HF_ZERO2_DECAY = {**HF_ZERO2, "scheduler": DECAY}
# The ZeRO-2 file with its optimizer kept on the device, as parabench's Accelerate runs ZeRO.
HF_ZERO2_ON_DEVICE = {
    **HF_ZERO2,
    "zero_optimization": {k: v for k, v in HF_ZERO2["zero_optimization"].items() if k != "offload_optimizer"},
}
GPT_NANO_WIDTH = 64


def write(folder: Path, name: str, content: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(content, indent=4))
    return path


def run_context(**config) -> RunContext:
    """Rank 0 of 2 of a gpt-nano run of batch_size 8 over 10 steps, its schedule resolved as the loop does."""
    cfg = RunConfig(**{"batch_size": 8, "steps": 10, **config})
    with torch.device("meta"):
        model = build_model("gpt-nano", {})
    micro, accum = cfg.world_batch(2)
    schedule = run_schedule(cfg, model)
    return RunContext(0, 2, 0, torch.device("cpu"), "fp32", micro, accum, cfg.grad_clip, cfg, schedule=schedule)


def created(path: Path, ctx: RunContext):
    return default_registry().create(f"deepspeed:{path}", ctx)


def accelerate_file(folder: Path, json_file: Path) -> Path:
    """An Accelerate config naming `json_file`, as `accelerate config` writes one."""
    path = folder / "accelerate_zero2.yaml"
    path.write_text(yaml.safe_dump(accelerate_naming(json_file)))
    return path


# ---- the schedule shapes, step by step against DeepSpeed's own schedulers -------------------------


@pytest.mark.parametrize("warmup_type", ["log", "linear"])
@pytest.mark.parametrize("warmup_steps", [0, 1, 2, 5])
@pytest.mark.parametrize("min_lr", [0.0, 1e-4])
@pytest.mark.parametrize("shape", ["constant", "linear"])
def test_each_shape_is_deepspeeds_scheduler_step_by_step(shape, min_lr, warmup_steps, warmup_type):
    """As DeepSpeed's engine runs it: built before the first step (its lr then the warm-up's start),
    stepped after each optimizer step; warmup_num_steps as Hugging Face fills it (at least 1)."""
    from deepspeed.runtime.lr_schedules import WarmupDecayLR, WarmupLR

    lr, steps = 3e-3, 12
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    params = dict(
        warmup_min_lr=min_lr, warmup_max_lr=lr, warmup_num_steps=max(1, warmup_steps), warmup_type=warmup_type
    )
    scheduler = WarmupLR(optimizer, **params) if shape == "constant" else WarmupDecayLR(optimizer, steps, **params)
    ours = []
    for step in range(steps):
        ours.append(
            lr_at(
                step,
                lr=lr,
                min_lr=min_lr,
                warmup_steps=warmup_steps,
                total_steps=steps,
                shape=shape,
                warmup_type=warmup_type,
            )
        )
        assert ours[-1] == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12, abs=0), step
        scheduler.step()
    assert ours[0] == ours[1] == min_lr  # the first two steps both run at the warm-up's start
    assert max(ours) == pytest.approx(lr)
    assert (ours[-1] < lr) == (shape == "linear")


def test_log_warm_up_belongs_to_deepspeeds_shapes():
    assert load_config(["lr_schedule=constant", "warmup_type=log"]).warmup_type == "log"
    with pytest.raises(ConfigError, match="warmup_type=log is the warm-up of DeepSpeed's shapes"):
        load_config(["warmup_type=log"])
    with pytest.raises(ConfigError, match="lr_schedule='cosh' is not one of cosine, constant, linear"):
        load_config(["lr_schedule=cosh"])


# ---- what a file's "auto" values are filled with, and what is refused -----------------------------


def test_every_auto_is_filled_from_the_run_and_said(tmp_path):
    ctx = run_context(lr_schedule="constant", warmup_type="log", warmup_steps=4)
    strategy = created(write(tmp_path, "zero3.json", HF_ZERO3), ctx)
    assert strategy.scheduler == {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4},
    }
    with torch.device("meta"):
        strategy.check_model(build_model("gpt-nano", {}))
    zero = strategy.user_config["zero_optimization"]
    width = GPT_NANO_WIDTH
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (width * width, int(0.9 * width**2))
    assert zero["stage3_param_persistence_threshold"] == 10 * width
    said = "\n".join(strategy.followed)
    for filled in (
        "train_batch_size=8",
        "train_micro_batch_size_per_gpu=4",
        "gradient_accumulation_steps=1",
        "gradient_clipping=1.0",
        "fp16.enabled=false",
        "optimizer.params.lr=0.003",
        "optimizer.params.betas=[0.9, 0.95]",
        "optimizer.params.eps=1e-08",
        "optimizer.params.weight_decay=0.1",
        "scheduler.params.warmup_min_lr=0.0",
        "scheduler.params.warmup_max_lr=0.003",
        "scheduler.params.warmup_num_steps=4",
        f"zero_optimization.reduce_bucket_size={width * width}",
        f"zero_optimization.stage3_prefetch_bucket_size={int(0.9 * width**2)}",
        f"zero_optimization.stage3_param_persistence_threshold={10 * width}",
    ):
        assert filled in said, filled
    assert "once the model is built" not in said
    assert "its scheduler WarmupLR runs as written" in said


def test_a_decaying_schedulers_steps_are_the_runs(tmp_path):
    ctx = run_context(lr_schedule="linear", warmup_type="linear", min_lr=1e-5)
    strategy = created(write(tmp_path, "decay.json", HF_ZERO2_DECAY), ctx)
    assert strategy.scheduler["params"] == {
        "warmup_min_lr": 1e-5,
        "warmup_max_lr": 3e-3,
        "warmup_num_steps": 1,  # a tenth of the 10 steps
        "total_num_steps": 10,
        "warmup_type": "linear",
    }


@pytest.mark.parametrize(
    "scheduler, run, words",
    [
        ({"type": "WarmupCosineLR", "params": {}}, {}, r"scheduler\.type=\"WarmupCosineLR\", a schedule"),
        ({"type": "OneCycle", "params": {}}, {}, r"use WarmupLR or WarmupDecayLR"),
        (
            {"type": "WarmupLR", "params": {**AUTO_WARMUP, "warmup_type": "cubic"}},
            {},
            r"scheduler\.params\.warmup_type=\"cubic\": set linear or log",
        ),
        (
            {"type": "WarmupLR", "params": {**AUTO_WARMUP, "cos_min_ratio": 0.1}},
            {},
            r"scheduler\.params\.cos_min_ratio, which WarmupLR does not take",
        ),
        (
            {"type": "WarmupLR", "params": {**AUTO_WARMUP, "warmup_max_lr": 1e-3}},
            {"lr_schedule": "constant", "warmup_type": "log"},
            r"warmup_max_lr=0\.001 but the run's schedule has 0\.003 \(lr\): set it to \"auto\", or lr=0\.001 for",
        ),
        (
            {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}},
            {"lr_schedule": "constant", "warmup_type": "log"},
            r"sets no scheduler\.params\.warmup_num_steps \(DeepSpeed's default 1000\) but the run's schedule has 1",
        ),
        (
            {"type": "WarmupDecayLR", "params": AUTO_WARMUP},
            {"lr_schedule": "linear", "warmup_type": "log"},
            r"sets no scheduler\.params\.total_num_steps, which WarmupDecayLR needs",
        ),
        (
            {"type": "WarmupDecayLR", "params": {**AUTO_WARMUP, "total_num_steps": 500}},
            {"lr_schedule": "linear", "warmup_type": "log"},
            r"total_num_steps=500 but the run's schedule has 10 \(steps\)",
        ),
        (
            {"type": "WarmupLR", "params": AUTO_WARMUP},
            {},
            r"scheduler WarmupLR is lr_schedule=constant, warmup_type=log but the run trains under "
            r"lr_schedule=cosine, warmup_type=linear",
        ),
    ],
)
def test_a_scheduler_that_would_train_another_schedule_is_one_line_naming_the_key(tmp_path, scheduler, run, words):
    path = write(tmp_path, "ds.json", {**HF_ZERO2, "scheduler": scheduler})
    with pytest.raises(StrategyError, match=words) as caught:
        created(path, run_context(**run))
    assert "\n" not in str(caught.value)


def test_a_compare_takes_the_files_schedule_unless_it_sets_another(tmp_path):
    zero2, decay = write(tmp_path, "zero2.json", HF_ZERO2), write(tmp_path, "decay.json", HF_ZERO2_DECAY)
    names = ["single", f"deepspeed:{zero2}"]
    cfg, said = adopt_file_settings(RunConfig(), names)
    assert (cfg.lr_schedule, cfg.warmup_type) == ("constant", "log")
    assert said == [
        f"lr_schedule=constant, warmup_type=log for every strategy, from {names[1]} (its scheduler WarmupLR)"
    ]
    assert adopt_file_settings(RunConfig(lr_schedule="constant", warmup_type="log"), names)[1] == []
    with pytest.raises(
        ConfigError, match=r"the run sets lr_schedule=cosine but deepspeed:.* sets lr_schedule=constant"
    ):
        adopt_file_settings(RunConfig(lr_schedule="cosine"), names)
    with pytest.raises(
        ConfigError, match=r"sets lr_schedule=constant but deepspeed:.*decay\.json .* make the two files"
    ):
        adopt_file_settings(RunConfig(), [*names, f"deepspeed:{decay}"])


@needs_accelerate
def test_an_accelerate_config_naming_the_json_carries_its_schedule_and_fills_it(tmp_path):
    json_file = write(tmp_path, "ds_config_zero2.json", HF_ZERO2_ON_DEVICE)
    name = f"accelerate:{accelerate_file(tmp_path, json_file)}"
    cfg, said = adopt_file_settings(RunConfig(), ["single", name])
    assert (cfg.lr_schedule, cfg.warmup_type) == ("constant", "log")
    assert said == [
        f"lr_schedule=constant, warmup_type=log for every strategy, from {name} (its scheduler WarmupLR in {json_file})"
    ]
    strategy = default_registry().create(name, run_context(lr_schedule="constant", warmup_type="log", warmup_steps=4))
    assert strategy.scheduler == {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4},
    }
    assert "scheduler.params.warmup_num_steps=4 (warmup_steps)" in "\n".join(strategy.followed)
    with pytest.raises(StrategyError, match=r"deepspeed_config_file .*'s scheduler WarmupLR is lr_schedule=constant"):
        default_registry().create(name, run_context())


@needs_accelerate
def test_an_accelerate_config_naming_an_offloading_json_is_refused_naming_the_fix(tmp_path):
    name = f"accelerate:{accelerate_file(tmp_path, write(tmp_path, 'ds_config_zero2.json', HF_ZERO2))}"
    with pytest.raises(StrategyError, match=r"runs as zero2-offload: .* set the offload devices to none") as caught:
        default_registry().get(name)
    assert "\n" not in str(caught.value)


def test_an_lr_other_than_the_runs_is_one_line_naming_the_scheduler():
    from strategies.deepspeed import check_scheduled_lr

    engine = SimpleNamespace(basic_optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3))
    check_scheduled_lr(engine, 1e-3, "x.json's scheduler WarmupLR")
    with pytest.raises(StrategyError, match=r"x\.json's scheduler WarmupLR set lr 1\.000000e-03 for this step but the"):
        check_scheduled_lr(engine, 3e-3, "x.json's scheduler WarmupLR")


# ---- the compares: each file beside single, fp32, matching it ---------------------------------------


def compared(folder: Path, names: list[str], *extra: str) -> tuple[Path, str]:
    out = folder / "compare"
    strategies = ",".join(["single", *names])
    args = ["compare", f"strategies=[{strategies}]", "noise_runs=0", f"out_dir={out}", *NANO, "nproc=2", *extra]
    proc = run_cli(args, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    return out, proc.stdout


@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    """single beside the documented ZeRO-2 and ZeRO-3 files."""
    folder = tmp_path_factory.mktemp("hf")
    files = [write(folder, "ds_config_zero2.json", HF_ZERO2), write(folder, "ds_config_zero3.json", HF_ZERO3)]
    return compared(folder, [f"deepspeed:{path}" for path in files], "warmup_steps=4")


@pytest.fixture(scope="module")
def documented_through_accelerate(tmp_path_factory):
    """single beside Accelerate + DeepSpeed as Hugging Face's users run it: an Accelerate config naming
    the ZeRO-2 JSON (its compare `extended`: the files' own compare above runs on every change)."""
    folder = tmp_path_factory.mktemp("hf-accelerate")
    on_device = write(folder / "accelerate", "ds_config_zero2.json", HF_ZERO2_ON_DEVICE)
    return compared(folder, [f"accelerate:{accelerate_file(folder, on_device)}"], "warmup_steps=4")


def results(out: Path) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads((out / "results.json").read_text())["strategies"]}


ACCELERATE_RUN = "accelerate-accelerate_zero2.yaml"  # the folder of the Accelerate config's run


def matches_single_under_the_files_schedule(compare: tuple[Path, str], runs_as: dict, folders: list[str], kind: str):
    """Each file's run matched single, every run trained under the file's schedule, said before it ran."""
    out, stdout = compare
    found = results(out)
    assert {name: r["runs_as"] for name, r in found.items()} == runs_as
    for name, result in found.items():
        assert result["status"] == "ok", (name, result["error"])
        assert result["verdict_kind"] == ("reference" if name == "single" else "matches"), (name, result["verdict"])
    assert f"lr_schedule=constant, warmup_type=log for every strategy, from {kind}:" in stdout
    lrs = {}
    for folder in folders:
        summary = json.loads((out / folder / "summary.json").read_text())
        assert (summary["lr_schedule"]["shape"], summary["lr_schedule"]["warmup_type"]) == ("constant", "log")
        lrs[folder] = [json.loads(line)["lr"] for line in (out / folder / "metrics.jsonl").read_text().splitlines()]
    assert lrs["single"][:2] == [0.0, 0.0] and lrs["single"][-1] == 3e-3
    assert len({tuple(v) for v in lrs.values()}) == 1


def test_the_documented_zero2_and_zero3_files_match_single(documented):
    matches_single_under_the_files_schedule(
        documented,
        {"single": None, "ds_config_zero2.json": "zero2-offload", "ds_config_zero3.json": "zero3-offload"},
        ["single", "deepspeed-ds_config_zero2.json", "deepspeed-ds_config_zero3.json"],
        "deepspeed",
    )


@needs_accelerate
@pytest.mark.extended
def test_an_accelerate_config_naming_the_zero2_file_matches_single(documented_through_accelerate):
    matches_single_under_the_files_schedule(
        documented_through_accelerate,
        {"single": None, "accelerate_zero2.yaml": "accelerate-zero2"},
        ["single", ACCELERATE_RUN],
        "accelerate",
    )


def test_what_was_filled_is_said_in_the_output_the_log_and_the_report(documented):
    out, stdout = documented
    width = GPT_NANO_WIDTH
    log = (out / "deepspeed-ds_config_zero3.json" / "log.txt").read_text()
    report = (out / "report.md").read_text()
    for said in (
        "scheduler.params.warmup_max_lr=0.003 (lr)",
        "scheduler.params.warmup_num_steps=4 (warmup_steps)",
        f"zero_optimization.reduce_bucket_size={width * width}",
        "its scheduler WarmupLR runs as written",
    ):
        assert said in stdout and said in log and said in report, said
    written = json.loads((out / "deepspeed-ds_config_zero3.json" / "deepspeed_config.json").read_text())
    assert written["scheduler"]["params"] == {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4}
    assert "optimizer" not in written  # parabench's AdamW is the file's


@needs_accelerate
@pytest.mark.extended
def test_accelerate_runs_the_jsons_scheduler_as_deepspeeds_and_says_what_it_filled(documented_through_accelerate):
    out, stdout = documented_through_accelerate
    log = (out / ACCELERATE_RUN / "log.txt").read_text()  # its own run's
    for said in (
        "its scheduler WarmupLR runs as written, DeepSpeed's own",
        "scheduler.params.warmup_max_lr=0.003 (lr)",
        "scheduler.params.warmup_num_steps=4 (warmup_steps)",
        "optimizer.params.lr=0.003 (lr)",
    ):
        assert said in stdout and said in log, said
    written = json.loads((out / ACCELERATE_RUN / "deepspeed_config.json").read_text())
    assert written["scheduler"] == {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4},
    }
    assert "optimizer" not in written
