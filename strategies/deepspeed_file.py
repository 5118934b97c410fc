"""`deepspeed:<file.json>`: a user's DeepSpeed JSON as a strategy, run through deepspeed.initialize
as the deepspeed launcher's users run it (strategies/deepspeed.py takes it as the top layer of
its config, strategies/deepspeed_config.py).

The file's ZeRO stage and offload choose the built-in it runs as (zero1-3, zero2-offload,
zero3-offload, zero3-hpz, zero3-zeropp), whose PlanModel plans it. Against the run:

- "auto" is filled as Hugging Face's Trainer fills it from its arguments (transformers'
  HfTrainerDeepSpeedConfig): the batch keys, clipping and precision from the run, the optimizer's
  and scheduler's values from the run's AdamW and schedule, the bucket sizes from the model's width
  (fill_model_sized, once the model is built); the values filled are said;
- train_batch_size must be the compare's global batch; the file's own micro-batch or accumulation
  is followed where it makes that batch (strategies/config_files.py);
- precision and clipping must be the run's; an AdamW `optimizer` section whose values are "auto"
  or the run's is followed (parabench's AdamW is that optimizer); any other optimizer is refused;
- a `scheduler` section runs as written, DeepSpeed's own scheduler stepping the learning rate,
  where it is the run's schedule: WarmupLR and WarmupDecayLR are lr_schedule=constant and linear
  (harness/train/optimizer.py computes them as DeepSpeed does), which a compare leaving the shape
  unset takes for every strategy (FileChoice.run_settings); any other scheduler, or a value other
  than the run's, is refused naming the key.

The same checks read the DeepSpeed JSON an Accelerate config names (deepspeed_config_file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from configs.schema import DEEPSPEED_MIN_WARMUP, DEEPSPEED_SCHEDULERS, WARMUP_TYPES
from strategies.base import RunContext
from strategies.config_files import FileChoice, follow_batch_split
from strategies.deepspeed_config import (
    AUTO,
    HF_BUCKET_SIZES,
    DeepSpeedConfigError,
    ModelSize,
    hf_bucket_sizes,
    read_user_config,
)

# DeepSpeed's own optimizer defaults that parabench's AdamW shares (torch's AdamW eps).
ADAMW_EPS = 1e-8
# "auto" values parabench fills, as Hugging Face's Trainer fills them, and from what.
FILLED_AUTO = {
    "train_batch_size": "the global batch",
    "train_micro_batch_size_per_gpu": "the run's micro-batch",
    "gradient_accumulation_steps": "the run's accumulation",
    "gradient_clipping": "grad_clip",
    "fp16.enabled": "precision",
    "bf16.enabled": "precision",
    "bfloat16.enabled": "precision",
    "optimizer.params.lr": "lr",
    "optimizer.params.betas": "beta1, beta2",
    "optimizer.params.eps": "AdamW's",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "min_lr",
    "scheduler.params.warmup_max_lr": "lr",
    "scheduler.params.warmup_num_steps": "warmup_steps",
    "scheduler.params.total_num_steps": "steps",
    **{f"zero_optimization.{key}": words for key, words in HF_BUCKET_SIZES.items()},
}
# The DeepSpeed Adam settings that make it AdamW whatever their value, as the run's AdamW is.
_ADAMW_FLAGS = ("torch_adam", "adam_w_mode")
_OFFLOAD_DEVICES = ("none", "cpu")
# The schedulers a comparison can train every strategy under, and the params each takes.
SCHEDULER_SHAPES = {scheduler: shape for shape, scheduler in DEEPSPEED_SCHEDULERS.items()}
_WARMUP_PARAMS = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration")
_SCHEDULER_PARAMS = {"WarmupLR": _WARMUP_PARAMS, "WarmupDecayLR": (*_WARMUP_PARAMS, "total_num_steps")}
# DeepSpeed's values for a param the file leaves out (deepspeed/runtime/lr_schedules.py); WarmupLR's
# warmup_max_lr is then the optimizer's lr, the run's, and WarmupDecayLR needs total_num_steps.
_SCHEDULER_DEFAULTS = {"warmup_min_lr": 0.0, "warmup_num_steps": 1000, "warmup_type": "log"}
_DECAY_MAX_LR_DEFAULT = 0.001
# The run's key that sets each scheduler param for the whole compare.
_RUN_KEYS = {
    "warmup_min_lr": "min_lr",
    "warmup_max_lr": "lr",
    "warmup_num_steps": "warmup_steps",
    "total_num_steps": "steps",
}


def read(path: Path) -> dict[str, Any]:
    return read_user_config(str(path))


def choose(path: Path, label: str) -> FileChoice:
    """The zero name a DeepSpeed JSON runs as, from its stage, offload and ZeRO++ settings."""
    config = read(path)
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise DeepSpeedConfigError(f'{label}: zero_optimization must be an object such as {{"stage": 2}}')
    stage = zero.get("stage")
    if stage is None or stage == 0:
        shown = "sets no zero_optimization.stage (DeepSpeed's default is 0" if stage is None else "sets stage 0 ("
        raise DeepSpeedConfigError(
            f"{label} {shown}, data parallel without ZeRO): set zero_optimization.stage to 1, 2 or 3, or compare ddp"
        )
    if stage not in (1, 2, 3):
        raise DeepSpeedConfigError(f"{label} sets zero_optimization.stage={json.dumps(stage)}: set 1, 2 or 3")
    offload = {key: _offload_device(zero, key, label) for key in ("offload_optimizer", "offload_param")}
    hpz = zero.get("zero_hpz_partition_size", 1)
    quantized = [key for key in ("zero_quantized_weights", "zero_quantized_gradients") if zero.get(key) is True]
    if hpz == AUTO or not isinstance(hpz, int) or isinstance(hpz, bool) or hpz < 1:
        raise DeepSpeedConfigError(
            f"{label} sets zero_optimization.zero_hpz_partition_size={hpz!r}: give a whole number of ranks"
        )
    name = f"zero{stage}"
    if offload["offload_param"] != "none" and stage != 3:
        raise DeepSpeedConfigError(
            f"{label} sets zero_optimization.offload_param.device={offload['offload_param']} at stage {stage}: "
            "DeepSpeed offloads parameters at stage 3 only; set the device to none, or stage 3"
        )
    if offload["offload_optimizer"] == "cpu":
        if stage == 1 or (stage == 3 and offload["offload_param"] != "cpu"):
            fix = "set stage 2" if stage == 1 else "set offload_param.device to cpu as well"
            raise DeepSpeedConfigError(
                f"{label} sets zero_optimization.offload_optimizer.device=cpu at stage {stage}: parabench offloads as "
                f"zero2-offload (the optimizer) and zero3-offload (optimizer and parameters): {fix}, or the device "
                "to none"
            )
        name = f"zero{stage}-offload"
    elif offload["offload_param"] == "cpu":
        raise DeepSpeedConfigError(
            f"{label} sets zero_optimization.offload_param.device=cpu without the optimizer: zero3-offload offloads "
            "both; set offload_optimizer.device to cpu as well, or offload_param.device to none"
        )
    options: dict[str, Any] = {}
    if hpz > 1 or quantized:
        if stage != 3 or name != "zero3" or hpz == 1:
            raise DeepSpeedConfigError(
                f"{label} sets ZeRO++ ({', '.join(quantized) or 'zero_hpz_partition_size'}) at stage {stage}"
                f"{' with offload' if name != f'zero{stage}' else ''}: parabench runs ZeRO++ as zero3-hpz and "
                "zero3-zeropp (stage 3, no offload, zero_hpz_partition_size above 1)"
            )
        if quantized and len(quantized) != 2:
            raise DeepSpeedConfigError(
                f"{label} sets {quantized[0]} alone: zero3-zeropp quantizes weights and gradients together; set "
                "zero_quantized_weights and zero_quantized_gradients both true or both false"
            )
        name = "zero3-zeropp" if quantized else "zero3-hpz"
        options["zero_hpz_partition_size"] = hpz
    where = {"none": "", "cpu": ", offloaded to the CPU"}[offload["offload_optimizer"]]
    extra = f", ZeRO++ over {hpz} ranks" if hpz > 1 else ""
    schedule = scheduler_settings(config, label)
    return FileChoice(
        name,
        f"DeepSpeed ZeRO-{stage}{where}{extra}",
        options,
        run_settings=schedule,
        run_settings_from=f"its scheduler {config['scheduler']['type']}" if schedule else "",
        option_keys={"zero_hpz_partition_size": "zero_optimization.zero_hpz_partition_size"},
    )


def scheduler_settings(config: dict[str, Any], label: str) -> dict[str, str]:
    """The run's lr_schedule and warmup_type the file's scheduler section is ({} without one), or a
    one-line error for a scheduler the comparison's other strategies cannot train under."""
    section = config.get("scheduler")
    if section is None:
        return {}
    kind = section.get("type") if isinstance(section, dict) else None
    if not isinstance(kind, str) or kind not in SCHEDULER_SHAPES:
        raise DeepSpeedConfigError(
            f"{label} sets scheduler.type={json.dumps(kind)}, a schedule the other strategies cannot train under: "
            "use WarmupLR or WarmupDecayLR (lr_schedule=constant, linear), or remove the scheduler section for "
            "parabench's warm-up and cosine"
        )
    params = section.get("params", {})
    if not isinstance(params, dict):
        raise DeepSpeedConfigError(f'{label}: scheduler.params must be an object such as {{"warmup_num_steps": 10}}')
    unknown = [key for key in params if key not in _SCHEDULER_PARAMS[kind]]
    if unknown:
        raise DeepSpeedConfigError(f"{label} sets scheduler.params.{unknown[0]}, which {kind} does not take: remove it")
    warmup_type = params.get("warmup_type", _SCHEDULER_DEFAULTS["warmup_type"])
    if warmup_type not in WARMUP_TYPES:
        raise DeepSpeedConfigError(
            f"{label} sets scheduler.params.warmup_type={json.dumps(warmup_type)}: set {' or '.join(WARMUP_TYPES)} "
            "(DeepSpeed would warm up log instead)"
        )
    start = params.get("last_batch_iteration", -1)
    if start != -1:
        raise DeepSpeedConfigError(
            f"{label} sets scheduler.params.last_batch_iteration={json.dumps(start)}: every strategy starts its "
            "schedule at the first step; remove it (DeepSpeed's -1)"
        )
    return {"lr_schedule": SCHEDULER_SHAPES[kind], "warmup_type": warmup_type}


def _offload_device(zero: dict[str, Any], key: str, label: str) -> str:
    section = zero.get(key)
    device = section.get("device", "none") if isinstance(section, dict) else "none"
    if device not in _OFFLOAD_DEVICES:
        raise DeepSpeedConfigError(
            f"{label} sets zero_optimization.{key}.device={json.dumps(device)}: parabench offloads to cpu or none "
            "(no nvme)"
        )
    return device


def for_run(config: dict[str, Any], ctx: RunContext, label: str) -> tuple[dict[str, Any], RunContext, list[str]]:
    """(the file's config as the built-in takes it: the followed optimizer section dropped, a scheduler
    section's "auto" values filled; the run's context with the file's batch split; what was followed,
    in words), or a one-line error naming the key that contradicts the run."""
    config = json.loads(json.dumps(config))  # a copy
    followed: list[str] = []
    autos = _autos(config)
    unfilled = [key for key in autos if key not in FILLED_AUTO]
    if unfilled:
        raise DeepSpeedConfigError(
            f'{label} sets {unfilled[0]} to "auto", which parabench cannot fill: give it a value, or remove it for '
            "DeepSpeed's default"
        )
    run = ctx.config
    if getattr(run, "deepspeed_config", None):
        raise DeepSpeedConfigError(
            f"{label} is the whole DeepSpeed config of its strategy, but the run also sets deepspeed_config="
            f"{run.deepspeed_config}, which would merge over it: drop one of the two"
        )
    lr = ctx.schedule.lr if ctx.schedule is not None else getattr(run, "lr", None)
    if "optimizer" in config:
        followed.append(_follow_optimizer(config.pop("optimizer"), run, lr, label))
    filled: dict[str, Any] = {}
    if "scheduler" in config:
        config["scheduler"], filled, said = _follow_scheduler(config["scheduler"], ctx, label)
        followed.append(said)
    batch = ctx.micro_batch * ctx.grad_accum * ctx.world_size
    total = config.get("train_batch_size", AUTO)
    if total != AUTO and total != batch:
        raise DeepSpeedConfigError(
            f"{label} sets train_batch_size={total} but the global batch of the comparison is {batch} sequences: set "
            f'it to {batch} or "auto", or batch_size={total} for the whole compare'
        )
    ctx, split = follow_batch_split(
        ctx,
        micro_batch=_set(config.get("train_micro_batch_size_per_gpu")),
        grad_accum=_set(config.get("gradient_accumulation_steps")),
        keys=("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"),
        where=label,
    )
    followed += [split] if split else []
    clipping = config.get("gradient_clipping", AUTO)
    if clipping != AUTO and float(clipping) != ctx.grad_clip:
        raise DeepSpeedConfigError(
            f"{label} sets gradient_clipping={clipping} but the run clips at grad_clip={ctx.grad_clip}: set it to "
            f'{ctx.grad_clip} or "auto", or grad_clip={clipping} for the whole compare'
        )
    for name in ("fp16", "bf16", "bfloat16"):
        enabled = config.get(name, {}).get("enabled", AUTO) if isinstance(config.get(name), dict) else AUTO
        runs = ctx.precision == ("fp16" if name == "fp16" else "bf16")
        if enabled != AUTO and bool(enabled) != runs:
            fix = f"precision={'fp16' if name == 'fp16' else 'bf16'}" if enabled else f"precision={ctx.precision}"
            raise DeepSpeedConfigError(
                f"{label} sets {name}.enabled={json.dumps(enabled)} but the run's precision is {ctx.precision}: set it "
                f'to {json.dumps(runs)} or "auto", or {fix} for the whole compare'
            )
    if autos:
        values = {**_run_values(ctx, run, lr), **filled}
        said = [f"{key}={_shown(values.get(key))} ({FILLED_AUTO[key]})" for key in autos if key in values]
        said += [_to_fill_with_model(key) for key in autos if key not in values]
        followed.append(f'filled its "auto" values as Hugging Face\'s Trainer does: {", ".join(said)}')
    return config, ctx, followed


def fill_model_sized(
    config: dict[str, Any], followed: list[str], size: ModelSize, label: str
) -> tuple[dict[str, Any], list[str]]:
    """`config` with its "auto" bucket sizes filled from the model's width as Hugging Face's Trainer
    fills them (at any stage: DeepSpeed reads the ZeRO-3 ones at stage 3 only), and `followed` (for_run's
    lines) with the values said where they were left to the model."""
    zero = config.get("zero_optimization")
    autos = [key for key in HF_BUCKET_SIZES if isinstance(zero, dict) and zero.get(key) == AUTO]
    if not autos:
        return config, followed
    if size.hidden is None:
        raise DeepSpeedConfigError(
            f'{label} sets zero_optimization.{autos[0]} to "auto", which is sized from the model\'s width, but the '
            "model has no weight matrices: give it a value"
        )
    sizes = hf_bucket_sizes(size.hidden)
    for key in autos:
        dotted = f"zero_optimization.{key}"
        said = f"{dotted}={sizes[key]} ({HF_BUCKET_SIZES[key]}, the width being {size.hidden})"
        followed = [line.replace(_to_fill_with_model(dotted), said) for line in followed]
    return {**config, "zero_optimization": {**zero, **{key: sizes[key] for key in autos}}}, followed


def _to_fill_with_model(key: str) -> str:
    return f"{key} ({FILLED_AUTO[key]}, once the model is built)"


def _run_values(ctx: RunContext, run: Any, lr: float | None) -> dict[str, Any]:
    """The run's value for each key of FILLED_AUTO known before the model is built."""
    fp16, bf16 = ctx.precision == "fp16", ctx.precision == "bf16"
    return {
        "train_batch_size": ctx.micro_batch * ctx.grad_accum * ctx.world_size,
        "train_micro_batch_size_per_gpu": ctx.micro_batch,
        "gradient_accumulation_steps": ctx.grad_accum,
        "gradient_clipping": ctx.grad_clip,
        "fp16.enabled": fp16,
        "bf16.enabled": bf16,
        "bfloat16.enabled": bf16,
        "optimizer.params.lr": lr if lr is not None else "by model size",
        "optimizer.params.betas": [getattr(run, "beta1", 0.9), getattr(run, "beta2", 0.95)],
        "optimizer.params.eps": ADAMW_EPS,
        "optimizer.params.weight_decay": getattr(run, "weight_decay", None),
    }


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _set(value: Any) -> Any:
    return None if value == AUTO else value


def _follow_optimizer(section: Any, run: Any, lr: float | None, label: str) -> str:
    """The file's optimizer, where it is the run's AdamW (its values "auto" or the run's), in words."""
    kind = str(section.get("type", "")) if isinstance(section, dict) else ""
    params = section.get("params", {}) if isinstance(section, dict) else {}
    adamw = kind.lower() == "adamw" or (kind.lower() == "adam" and params.get("adam_w_mode", True) is not False)
    if not adamw:
        raise DeepSpeedConfigError(
            f"{label} sets optimizer.type={kind or '(none)'}: every strategy of a comparison trains with the same "
            'AdamW; remove the optimizer section, or set type AdamW with "auto" values'
        )
    beta1, beta2 = (getattr(run, "beta1", 0.9), getattr(run, "beta2", 0.95))
    wanted = {"lr": lr, "betas": [beta1, beta2], "eps": ADAMW_EPS, "weight_decay": getattr(run, "weight_decay", None)}
    for key, value in params.items():
        if key in _ADAMW_FLAGS or value == AUTO:
            continue
        if key not in wanted:
            raise DeepSpeedConfigError(
                f"{label} sets optimizer.params.{key}, which parabench's AdamW does not have: remove it, or the "
                "optimizer section"
            )
        if wanted[key] is None or _differs(value, wanted[key]):
            fix = {"lr": "lr=", "betas": "beta1=, beta2=", "weight_decay": "weight_decay="}.get(key)
            whole = f", or {fix} for the whole compare" if fix else ""
            raise DeepSpeedConfigError(
                f"{label} sets optimizer.params.{key}={json.dumps(value)} but the run's AdamW has "
                f'{json.dumps(wanted[key]) if wanted[key] is not None else "its lr by model size"}: set it to "auto"'
                f"{whole}"
            )
    return f"its optimizer {kind} is the run's AdamW, the same for every strategy"


def _follow_scheduler(section: Any, ctx: RunContext, label: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(the file's scheduler with its "auto" values filled from the run's schedule, the values filled by
    dotted key, a line saying what runs), or a one-line error where it would train under another
    schedule than the run's."""
    settings = scheduler_settings({"scheduler": section}, label)
    kind, schedule = section["type"], ctx.schedule
    if schedule is None:
        raise DeepSpeedConfigError(
            f"{label} has a scheduler section ({kind}), but the run's learning-rate schedule was not given to check "
            "it against (RunContext.schedule)"
        )
    runs = {"lr_schedule": schedule.shape, "warmup_type": schedule.warmup_type}
    if settings != runs:
        theirs, ours = (", ".join(f"{k}={v}" for k, v in d.items()) for d in (settings, runs))
        raise DeepSpeedConfigError(
            f"{label}'s scheduler {kind} is {theirs} but the run trains under {ours}: set {theirs} for the whole "
            "compare (a compare that leaves them unset takes the file's), or remove the scheduler section"
        )
    steps = ctx.config.steps
    wanted = {
        "warmup_min_lr": schedule.min_lr,
        "warmup_max_lr": schedule.lr,
        "warmup_num_steps": max(1, schedule.warmup_steps),  # DeepSpeed refuses 0 (Hugging Face's fill)
        "total_num_steps": steps,
    }
    params = dict(section.get("params", {}))
    filled = {}
    for key in (k for k in wanted if k in _SCHEDULER_PARAMS[kind]):
        if params.get(key) == AUTO:
            params[key] = filled[f"scheduler.params.{key}"] = wanted[key]
        else:
            _check_scheduler_value(kind, key, params, wanted[key], label)
    said = (
        f"its scheduler {kind} runs as written, DeepSpeed's own, and every strategy trains under the same schedule "
        f"(lr_schedule={schedule.shape}, warmup_type={schedule.warmup_type}): {schedule.describe()}"
    )
    return {**section, "params": params}, filled, said


def _check_scheduler_value(kind: str, key: str, params: dict[str, Any], wanted: Any, label: str) -> None:
    """Refuse, in one line, a scheduler param (set, or DeepSpeed's default where left out) that would
    train under another schedule than the run's."""
    given = key in params
    if not given and kind == "WarmupDecayLR" and key == "total_num_steps":
        raise DeepSpeedConfigError(
            f'{label} sets no scheduler.params.total_num_steps, which WarmupDecayLR needs: set it to "auto" (the '
            f"run's {wanted} steps)"
        )
    if not given and kind == "WarmupLR" and key == "warmup_max_lr":
        return  # DeepSpeed takes the optimizer's lr, the run's
    default = _DECAY_MAX_LR_DEFAULT if key == "warmup_max_lr" else _SCHEDULER_DEFAULTS.get(key)
    value = params[key] if given else default
    if key in ("warmup_num_steps", "total_num_steps"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DeepSpeedConfigError(
                f'{label} sets scheduler.params.{key}={json.dumps(value)}: give a whole number of at least 1, or "auto"'
            )
        # DeepSpeed warms up over at least 2 steps: 1 and 2 are the same warm-up.
        differs = (
            max(DEEPSPEED_MIN_WARMUP, value) != max(DEEPSPEED_MIN_WARMUP, wanted)
            if key == "warmup_num_steps"
            else value != wanted
        )
    else:
        differs = _differs(value, wanted)
    if differs:
        shown = f"sets scheduler.params.{key}={json.dumps(value)}"
        if not given:
            shown = f"sets no scheduler.params.{key} (DeepSpeed's default {json.dumps(default)})"
        raise DeepSpeedConfigError(
            f'{label} {shown} but the run\'s schedule has {json.dumps(wanted)} ({_RUN_KEYS[key]}): set it to "auto", '
            f"or {_RUN_KEYS[key]}={json.dumps(value)} for the whole compare"
        )


def _differs(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, list):
        return not isinstance(value, list) or len(value) != len(wanted) or any(map(_differs, value, wanted))
    return isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != float(wanted)


def _autos(config: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose value is "auto"."""
    found = []
    for key, value in config.items():
        if isinstance(value, dict):
            found += _autos(value, f"{prefix}{key}.")
        elif value == AUTO:
            found.append(f"{prefix}{key}")
    return found
