"""`deepspeed:<file.json>`: a user's DeepSpeed JSON as a strategy, run through deepspeed.initialize
as the deepspeed launcher's users run it (strategies/deepspeed.py takes it as the top layer of
its config, strategies/deepspeed_config.py).

The file's ZeRO stage and offload choose the built-in it runs as (zero1-3, zero2-offload,
zero3-offload, zero3-hpz, zero3-zeropp), whose PlanModel plans it. Against the run:

- "auto" is filled where parabench knows the value (the batch keys, clipping, precision, the
  bucket sizes it sizes to the model, the optimizer's hyper-parameters) and refused elsewhere;
- train_batch_size must be the compare's global batch; the file's own micro-batch or accumulation
  is followed where it makes that batch (strategies/config_files.py);
- precision and clipping must be the run's; an AdamW `optimizer` section whose values are "auto"
  or the run's is followed (parabench's AdamW is that optimizer); any other optimizer, or a
  `scheduler`, is refused: every strategy of a comparison shares one optimizer and schedule.

The same checks read the DeepSpeed JSON an Accelerate config names (deepspeed_config_file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from strategies.base import RunContext
from strategies.config_files import FileChoice, follow_batch_split
from strategies.deepspeed_config import AUTO, DeepSpeedConfigError, read_user_config

# DeepSpeed's own optimizer defaults that parabench's AdamW shares (torch's AdamW eps).
ADAMW_EPS = 1e-8
# "auto" values parabench fills: the batch and precision keys from the run, the bucket sizes as
# the built-in zero names size them (strategies/deepspeed_config.py sizing_config, DeepSpeed's default
# for the prefetch bucket), the optimizer's hyper-parameters from the run's AdamW.
FILLED_AUTO = {
    "train_batch_size": "the global batch",
    "train_micro_batch_size_per_gpu": "the run's micro-batch",
    "gradient_accumulation_steps": "the run's accumulation",
    "gradient_clipping": "grad_clip",
    "fp16.enabled": "precision",
    "bf16.enabled": "precision",
    "bfloat16.enabled": "precision",
    "zero_optimization.reduce_bucket_size": "sized to the model",
    "zero_optimization.stage3_param_persistence_threshold": "sized to the model",
    "zero_optimization.stage3_prefetch_bucket_size": "DeepSpeed's default",
    "optimizer.params.lr": "lr",
    "optimizer.params.betas": "beta1, beta2",
    "optimizer.params.eps": "AdamW's",
    "optimizer.params.weight_decay": "weight_decay",
}
# The DeepSpeed Adam settings that make it AdamW whatever their value, as the run's AdamW is.
_ADAMW_FLAGS = ("torch_adam", "adam_w_mode")
_OFFLOAD_DEVICES = ("none", "cpu")


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
    return FileChoice(name, f"DeepSpeed ZeRO-{stage}{where}{extra}", options)


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
    """(the file's config as the built-in takes it: the followed optimizer section dropped; the run's
    context with the file's batch split; what was followed, in words), or a one-line error naming
    the key that contradicts the run."""
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
    if "scheduler" in config:
        kind = config["scheduler"].get("type", "?") if isinstance(config["scheduler"], dict) else "?"
        raise DeepSpeedConfigError(
            f"{label} has a scheduler section ({kind}): every strategy of a comparison shares parabench's warm-up and "
            "cosine schedule, so remove it and set lr=, min_lr=, warmup_steps= for the whole compare"
        )
    if "optimizer" in config:
        followed.append(_follow_optimizer(config.pop("optimizer"), run, label))
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
        filled = ", ".join(f"{key} ({FILLED_AUTO[key]})" for key in autos if not key.startswith("optimizer."))
        followed += [f'filled its "auto" values: {filled}'] if filled else []
    return config, ctx, followed


def _set(value: Any) -> Any:
    return None if value == AUTO else value


def _follow_optimizer(section: Any, run: Any, label: str) -> str:
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
    wanted = {
        "lr": getattr(run, "lr", None),
        "betas": [beta1, beta2],
        "eps": ADAMW_EPS,
        "weight_decay": getattr(run, "weight_decay", None),
    }
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
