"""The DeepSpeed config of a run, built in code, with a user's own JSON merged over it.

Three layers, lowest first:
  1. DeepSpeed's own defaults, cut to the model only where they exceed it (sizing_config):
     the reduction bucket, and ZeRO-3's persistence threshold for very small models;
  2. what the run fixes (batch split, precision, clipping, ZeRO stage, offload):
     the same numbers every other strategy trains with;
  3. the user's `deepspeed_config=<file.json>`: free to tune anything in layer 1 or
     that parabench leaves at DeepSpeed's default (overlap_comm, contiguous_gradients...),
     but a value that contradicts layer 2 is a one-line error naming the fix.
A value "auto" in the user's JSON (as in Hugging Face's templates) means "what parabench builds".
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from strategies.base import RunContext, StrategyError

if TYPE_CHECKING:
    import torch.nn as nn

ZERO_STAGES = (1, 2, 3)
AUTO = "auto"
# parabench builds the optimizer (the same AdamW for every strategy) and sets its
# learning rate every step; a DeepSpeed optimizer or scheduler would break that.
OWNED_SECTIONS = ("optimizer", "scheduler")


class DeepSpeedConfigError(StrategyError):
    """A DeepSpeed setting that cannot run as asked (one line, says what to do)."""


def check_zero_options(stage: Any, offload_optimizer: Any, offload_params: Any) -> tuple[int, bool, bool]:
    """Validate the plugin's options; returns them typed."""
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in ZERO_STAGES:
        raise DeepSpeedConfigError(
            f"strategy_options.stage={stage} is not a ZeRO stage: use 1, 2 or 3 (or the strategies zero1, zero2, zero3)"
        )
    for name, value in (("offload_optimizer", offload_optimizer), ("offload_params", offload_params)):
        if not isinstance(value, bool):
            raise DeepSpeedConfigError(f"strategy_options.{name}={value} must be true or false")
    if offload_params and stage != 3:
        raise DeepSpeedConfigError(
            f"offloading parameters needs ZeRO stage 3 (got stage {stage}): use strategy=zero3-offload"
        )
    return stage, offload_optimizer, offload_params


def run_config(
    ctx: RunContext, *, stage: int, offload_optimizer: bool, offload_params: bool, torch_optimizer_offloaded: bool
) -> dict[str, Any]:
    """Layer 2: what the run fixes, identical in meaning to the other strategies' settings."""
    pin = ctx.device.type == "cuda"  # page-locked host memory only helps copies to an accelerator
    zero: dict[str, Any] = {
        "stage": stage,
        "offload_optimizer": {"device": "cpu", "pin_memory": pin} if offload_optimizer else {"device": "none"},
    }
    if stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin} if offload_params else {"device": "none"}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": ctx.micro_batch,
        "gradient_accumulation_steps": ctx.grad_accum,
        "train_batch_size": ctx.micro_batch * ctx.grad_accum * ctx.world_size,
        # Written even when 0: DeepSpeed's own default is to clip at 1.0.
        "gradient_clipping": float(ctx.grad_clip),
        "fp16": {"enabled": ctx.precision == "fp16"},
        "bf16": {"enabled": ctx.precision == "bf16"},
        "zero_optimization": zero,
    }
    if ctx.precision == "fp16":
        # Dynamic loss scaling as torch.amp.GradScaler does it (2**16 to start, back off
        # at once on overflow, grow after 2000 clean steps): the same as `single` and `ddp`.
        config["fp16"].update(
            loss_scale=0, initial_scale_power=16, hysteresis=1, loss_scale_window=2000, min_loss_scale=1
        )
    # parabench measures throughput itself, syncing only at the logging interval (harness/train/metrics.py);
    # DeepSpeed's own throughput timer would synchronize the device at the start and end of every step.
    config["timers"] = {"throughput": {"enabled": False}}
    if torch_optimizer_offloaded:
        # Our torch AdamW steps the CPU partitions; DeepSpeed refuses a non-DeepSpeed
        # optimizer under offload unless told that this is intended.
        config["zero_force_ds_cpu_optimizer"] = False
    return config


# DeepSpeed 0.19's ZeRO defaults that sizing_config may lower (deepspeed/runtime/zero/config.py).
DEEPSPEED_REDUCE_BUCKET = 500_000_000  # elements
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000  # ZeRO-3: parameters up to this many elements stay whole
NCCL_ALIGNMENT = 2  # DeepSpeed asserts bucket sizes are multiples of it


@dataclass(frozen=True)
class ModelSize:
    """What DeepSpeed's sizing depends on: the parameter count and the width most matrices share."""

    params: int  # elements of the trainable parameters, tied ones once
    hidden: int | None  # None: no weight matrices


def model_size(model: nn.Module) -> ModelSize:
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    dims = Counter(d for p in params if p.dim() == 2 for d in p.shape)
    return ModelSize(sum(p.numel() for p in params), dims.most_common(1)[0][0] if dims else None)


def sizing_config(size: ModelSize, stage: int, world_size: int) -> dict[str, Any]:
    """Layer 1: DeepSpeed's defaults, lowered only where they exceed what the model needs.

    reduce_bucket_size: DeepSpeed allocates the whole bucket (its default 5e8 elements are
    1 GB in bf16, twice with overlap_comm) and reduces whenever it fills. ZeRO-1/2 allocate it
    for the backward and free it after: a bucket of the model's size (at most the default)
    makes the same single reduction per step as the default for any model under 5e8
    parameters, in less memory; a smaller one would add synchronous reductions (on 2 CPU ranks
    one rank's share doubled some steps). ZeRO-3 keeps its bucket for the whole run, counted
    as gradient memory: there it holds one rank's share of the model (at most the default),
    so the bucket costs no more than the gradient partition, and its N reductions per step
    overlap the backward (DeepSpeed's stage-3 overlap_comm); on one rank, one reduction again.
    Every other bucket (all-gather, ZeRO-3 prefetch) stays at DeepSpeed's default: smaller
    ones only add collectives (with Hugging Face's h*h buckets, an H100 run had zero2 at 0.78
    of the speed of a hand-written loop that keeps DeepSpeed's defaults).
    ZeRO-3's persistence threshold: parameters up to 1e5 elements stay whole on every rank.
    Where the model's matrices (width x width) are no larger, that is every matrix and ZeRO-3
    would shard nothing; there it is 10 x the width (Hugging Face's rule), else DeepSpeed's.
    """
    held = -(-max(size.params, 1) // world_size) if stage == 3 else max(size.params, 1)
    bucket = min(DEEPSPEED_REDUCE_BUCKET, held)
    zero: dict[str, Any] = {"reduce_bucket_size": bucket + bucket % NCCL_ALIGNMENT}
    if stage == 3 and size.hidden is not None and size.hidden**2 <= DEEPSPEED_PERSISTENCE_THRESHOLD:
        zero["stage3_param_persistence_threshold"] = 10 * size.hidden
    return {"zero_optimization": zero}


# The bucket sizes Hugging Face's Trainer gives "auto" from the model's hidden width h
# (transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize), in words; hf_bucket_sizes has them.
HF_BUCKET_SIZES = {
    "reduce_bucket_size": "the model's width squared",
    "stage3_prefetch_bucket_size": "0.9 x the model's width squared",
    "stage3_param_persistence_threshold": "10 x the model's width",
}


def hf_bucket_sizes(hidden: int) -> dict[str, int]:
    """HF_BUCKET_SIZES for a model of width `hidden`, in elements."""
    return {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }


def read_user_config(path: str) -> dict[str, Any]:
    """A user's DeepSpeed JSON file as a dict (one-line errors for a missing or broken file)."""
    file = Path(path)
    if not file.is_file():
        raise DeepSpeedConfigError(f"deepspeed_config {path!r} not found: give the path of a DeepSpeed JSON file")
    try:
        loaded = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DeepSpeedConfigError(f"deepspeed_config {path} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise DeepSpeedConfigError(f"deepspeed_config {path} must hold a JSON object of DeepSpeed settings")
    return loaded


def _precision_of(config: dict[str, Any]) -> str:
    enabled = [name for name in ("fp16", "bf16") if _get(config, (name, "enabled")) is True]
    return enabled[0] if enabled else "fp32"


def _get(config: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def check_user_config(
    user: dict[str, Any], run: dict[str, Any], source: str, batch_fixes: dict[str, Callable[[Any], str]] | None = None
) -> None:
    """Refuse, in one line, anything in the user's JSON that contradicts the run. `batch_fixes`: for a
    strategy whose DeepSpeed batch keys are not the run's settings themselves (zero1-pp's micro-batch is
    one pipeline micro-batch), what to set instead of a key's value, given that value."""
    user = normalized(user)
    for section in OWNED_SECTIONS:
        if section in user:
            raise DeepSpeedConfigError(
                f"deepspeed_config {source} has a section {section!r}, but parabench builds the optimizer "
                "(AdamW) and sets its learning rate every step so that all strategies match: remove it and "
                "set lr=, min_lr=, warmup_steps=, lr_schedule=, weight_decay=, beta1=, beta2= on the command line, "
                f"or run the file as strategy deepspeed:{source}, which runs an AdamW and a scheduler of the run's"
            )
    asked = _get(user, ("activation_checkpointing",))
    asked = [key for key, value in asked.items() if value] if isinstance(asked, dict) else []
    if asked:
        raise DeepSpeedConfigError(
            f"deepspeed_config {source} sets activation_checkpointing.{asked[0]}, which configures "
            "deepspeed.checkpointing, and no parabench model calls it (every strategy recomputes the blocks with "
            "torch's checkpoint): remove the section, and give activation_checkpointing=true or selective instead"
        )
    if "zero_optimization" in user and not isinstance(user["zero_optimization"], dict):
        raise DeepSpeedConfigError(
            f'deepspeed_config {source}: zero_optimization must be an object such as {{"stage": 2}}'
        )
    fixes = {
        ("train_micro_batch_size_per_gpu",): "set micro_batch= on the command line instead",
        ("gradient_accumulation_steps",): "set grad_accum= on the command line instead",
        ("train_batch_size",): "set batch_size= on the command line instead",
        ("gradient_clipping",): "set grad_clip= on the command line instead",
    }
    for path, fix in fixes.items():
        instead = (batch_fixes or {}).get(path[0])
        value = _get(user, path)
        _refuse_if_different(user, run, path, source, instead(value) if instead and value is not None else fix)
    for name in ("fp16", "bf16"):
        enabled = _get(user, (name, "enabled"))
        if enabled is not None and enabled != run[name]["enabled"]:
            raise DeepSpeedConfigError(
                f"deepspeed_config {source} sets {name}.enabled={json.dumps(enabled)} but the run's precision is "
                f"{_precision_of(run)}: set precision={name if enabled else 'fp32'} on the command line instead"
            )
    zero_run = run["zero_optimization"]
    stage = _get(user, ("zero_optimization", "stage"))
    if stage is not None and stage != zero_run["stage"]:
        hint = f"use strategy=zero{stage}" if stage in ZERO_STAGES else "ZeRO stages are 1, 2 and 3 (ddp for none)"
        raise DeepSpeedConfigError(
            f"deepspeed_config {source} sets zero_optimization.stage={stage} but the strategy runs "
            f"stage {zero_run['stage']}: {hint}"
        )
    for key in ("offload_optimizer", "offload_param"):
        device = _get(user, ("zero_optimization", key, "device"))
        built = _get(run, ("zero_optimization", key, "device")) or "none"
        if device is not None and device != built:
            raise DeepSpeedConfigError(
                f"deepspeed_config {source} sets zero_optimization.{key}.device={device} but the strategy "
                f"uses {built}: offload comes from the strategy name (zero2-offload, zero3-offload put it on cpu)"
            )


def _refuse_if_different(user: dict, run: dict, path: tuple[str, ...], source: str, fix: str) -> None:
    value, built = _get(user, path), _get(run, path)
    if value is not None and value != built:
        key = ".".join(path)
        raise DeepSpeedConfigError(f"deepspeed_config {source} sets {key}={value} but this run has {built}: {fix}")


def _without_auto(config: dict[str, Any]) -> dict[str, Any]:
    return {k: _without_auto(v) if isinstance(v, dict) else v for k, v in config.items() if v != AUTO}


def normalized(user: dict[str, Any]) -> dict[str, Any]:
    """The user's config less its "auto" values (parabench fills those), with DeepSpeed's
    old section name "bfloat16" read as "bf16"."""
    user = _without_auto(user)
    if "bfloat16" in user:
        user = {**{k: v for k, v in user.items() if k != "bfloat16"}, "bf16": user["bfloat16"]}
    return user


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base`, objects key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def final_config(sizing: dict[str, Any], run: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The three layers merged (the user's already checked against the run)."""
    return merge(merge(sizing, run), normalized(user))
