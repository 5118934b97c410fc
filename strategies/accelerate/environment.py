"""Accelerate's environment: what `accelerate launch` set (its ACCELERATE_* variables), the
refusal of launch settings that contradict the strategy or the run, and the process-wide
state Accelerate keeps, set where parabench must and put back at teardown.

On CPU, Accelerate 1.15 has no distributed type for FSDP or DeepSpeed (it only knows
MULTI_CPU = DDP over gloo), and without `cpu=True` it counts a world of one. Small, checked
nudges make every mode run over gloo: Accelerate is told the process group's backend (then
it counts the ranks right, and its DeepSpeed path works on CPU); for FSDP the distributed
type it gates on the device type is set to FSDP; and a ParallelismConfig (hsdp, fsdp-tp),
which Accelerate checks against that distributed type, is attached after it, as the
Accelerator's constructor attaches it. Accelerate has no public API for the last two, so
they are written into its shared state here, and nowhere else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from strategies.base import RunContext, StrategyError

if TYPE_CHECKING:
    from accelerate import Accelerator

ACCELERATE_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
# The names of the modes, as a launch config can choose them.
LAUNCHABLE_MODES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
# Modes launched with accelerate-fsdp's config plus a parallelism config (--use_parallelism_config).
PARALLELISM_MODES = ("hsdp", "fsdp-tp")
# Environment variables Accelerator() writes into os.environ; restored at teardown.
_ENV_WRITTEN_BY_ACCELERATE = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING")


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


def launched_by_accelerate(env: Mapping[str, str]) -> bool:
    """Every `accelerate launch` launcher (simple, multi-GPU, DeepSpeed) sets this one."""
    return "ACCELERATE_MIXED_PRECISION" in env


def _deepspeed_stage(env: Mapping[str, str]) -> str:
    if env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        return env["ACCELERATE_DEEPSPEED_ZERO_STAGE"]
    config_file = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if config_file != "none":
        try:
            stage = json.loads(Path(config_file).read_text()).get("zero_optimization", {}).get("stage")
        except (OSError, ValueError) as exc:
            raise StrategyError(
                f"cannot read the DeepSpeed config file {config_file!r} that accelerate launch names: {exc}"
            ) from None
        if stage is not None:
            return str(stage)
    return "2"  # DeepSpeedPlugin's default stage


def launcher_mode(env: Mapping[str, str]) -> str | None:
    """The mode an `accelerate launch` config or flags chose, or None when not launched by it."""
    if not launched_by_accelerate(env):
        return None
    if _flag(env, "ACCELERATE_USE_MEGATRON_LM"):
        return "megatron-lm"
    if _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        return f"zero{_deepspeed_stage(env)}"
    if _flag(env, "ACCELERATE_USE_FSDP"):
        parallelism = launched_parallelism(env) or {}
        if parallelism.get("tp_size", 1) > 1:
            return "fsdp-tp"
        return "hsdp" if parallelism.get("dp_replicate_size", 1) > 1 else "fsdp"
    return "ddp"


# accelerate launch's --parallelism_config_* flags, as the environment variables it sets.
PARALLELISM_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")


def launched_parallelism(env: Mapping[str, str] = os.environ) -> dict[str, int] | None:
    """The sizes of the ParallelismConfig `accelerate launch` asked for (its config's
    parallelism_config, or --use_parallelism_config), or None where it asked for none."""
    if not launched_by_accelerate(env) or not _flag(env, "ACCELERATE_USE_PARALLELISM_CONFIG"):
        return None
    sizes = {}
    for key in PARALLELISM_SIZES:
        value = env.get(f"PARALLELISM_CONFIG_{key.upper()}", "1").strip()
        if not value.isdigit():
            raise StrategyError(f"accelerate launch set parallelism_config_{key}={value!r}: give a whole number")
        sizes[key] = int(value)
    return sizes


def check_launcher_settings(env: Mapping[str, str], mode: str, ctx: RunContext) -> None:
    """Refuse, in one line, `accelerate launch` settings that contradict the strategy or the run."""
    launched = launcher_mode(env)
    if launched is None:
        return
    if launched != mode:
        known = launched in LAUNCHABLE_MODES or launched in PARALLELISM_MODES
        fix = f"strategy=accelerate-{launched}" if known else "a config from configs/accelerate/"
        config = (
            # Accelerate's CLI takes --use_parallelism_config only beside these flags, whatever the file says.
            "configs/accelerate/fsdp.yaml --use_fsdp --fsdp_version 2 --use_parallelism_config and its "
            "--parallelism_config_* sizes"
            if mode in PARALLELISM_MODES
            else f"configs/accelerate/{mode}.yaml"
        )
        raise StrategyError(
            f"accelerate launch is set up for {launched} (its config file or flags) but the strategy is "
            f"accelerate-{mode}: use {fix}, or launch with --config_file {config}"
        )
    if _flag(env, "ACCELERATE_USE_CPU") and (mode != "ddp" or ctx.device.type != "cpu"):
        raise StrategyError(
            "accelerate launch --cpu (use_cpu: true) makes Accelerate ignore FSDP, DeepSpeed and GPUs, and starts one "
            f"process: drop --cpu and launch with --config_file configs/accelerate/{mode}.yaml "
            "(parabench uses gloo on CPU)"
        )
    launched_precision = env["ACCELERATE_MIXED_PRECISION"].strip().lower()
    if launched_precision != ACCELERATE_PRECISION[ctx.precision]:
        wanted = {v: k for k, v in ACCELERATE_PRECISION.items()}.get(launched_precision, launched_precision)
        raise StrategyError(
            f"accelerate launch set mixed_precision={launched_precision} but the run has precision={ctx.precision}: "
            f"add precision={wanted}, or launch with --mixed_precision {ACCELERATE_PRECISION[ctx.precision]}"
        )
    launched_accum = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "").strip()
    if launched_accum.isdigit() and int(launched_accum) != ctx.grad_accum:
        raise StrategyError(
            f"accelerate launch set gradient_accumulation_steps={launched_accum} but this run accumulates "
            f"{ctx.grad_accum} micro-steps: add grad_accum={launched_accum}, or drop it from the accelerate config"
        )
    if mode in ("fsdp", *PARALLELISM_MODES) and env.get("FSDP_VERSION", "1").strip() != "2":
        raise StrategyError(
            "accelerate-fsdp runs FSDP2 but the accelerate config asks for FSDP1: set fsdp_version: 2 in its "
            "fsdp_config (as configs/accelerate/fsdp.yaml does)"
        )


class AccelerateEnvironment:
    """The process-wide state an Accelerator leaves behind (its singletons, the variables it
    writes into os.environ), saved before one is built and put back at teardown, so that a
    second run in the same process (the batch search's probes) starts clean. `launch` is set
    meanwhile: the settings `accelerate launch` would have set from a user's config file."""

    def __init__(self, launch: Mapping[str, str]) -> None:
        self._env_before = {k: os.environ.get(k) for k in {*_ENV_WRITTEN_BY_ACCELERATE, *launch}}
        os.environ.update(launch)

    @staticmethod
    def enable_fsdp_on_cpu(accelerator: Accelerator, fsdp_plugin: Any) -> None:
        """Accelerate picks FSDP only for accelerator devices; on CPU its FSDP2 path itself
        (fully_shard on a gloo mesh) works, so set the distributed type it gates on."""
        from accelerate.state import AcceleratorState, PartialState
        from accelerate.utils import DistributedType

        mixed_precision = accelerator.state.mixed_precision
        if mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(mixed_precision)
        AcceleratorState._shared_state["fsdp_plugin"] = fsdp_plugin
        AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    @staticmethod
    def attach_parallelism_config(accelerator: Accelerator, parallelism: Any) -> None:
        """What Accelerator(parallelism_config=...) does (build the device mesh, check the config
        against the world), done once FSDP is on: on a CPU Accelerate checks the config against
        its distributed type, which is FSDP only after enable_fsdp_on_cpu."""
        from accelerate.state import AcceleratorState

        AcceleratorState._shared_state["parallelism_config"] = parallelism
        AcceleratorState._shared_state["device_mesh"] = parallelism.get_device_mesh(accelerator.device.type)
        parallelism._validate_accelerator(accelerator)

    def restore(self) -> None:
        """Accelerate's singletons reset (the process group stays the runner's) and the
        environment as it was."""
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        for key, value in self._env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
