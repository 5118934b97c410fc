"""The typed schema every run is checked against, and the loader that merges
YAML presets with `key=value` overrides through omegaconf.

Every error here is a `ConfigError` whose message is one line naming the key and
what is allowed, so the CLI can print it instead of a traceback.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, get_type_hints

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR = Path(__file__).resolve().parent
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
FP8_SCALINGS = ("tensorwise", "rowwise")  # strategies/float8.py
LR_SCHEDULES = ("cosine", "constant", "linear")  # harness/train/optimizer.py computes each
DEEPSPEED_SCHEDULERS = {"constant": "WarmupLR", "linear": "WarmupDecayLR"}  # the DeepSpeed scheduler each shape is
DEEPSPEED_MIN_WARMUP = 2  # DeepSpeed's schedulers warm up over max(2, warmup_num_steps) steps
WARMUP_TYPES = ("linear", "log")
DEVICES = ("auto", "cpu", "cuda")
TRACKERS = ("tensorboard", "wandb", "mlflow")


class ConfigError(ValueError):
    """A bad key or value in the run configuration (one line, says what to do)."""


@dataclass
class RunConfig:
    # What to train.
    strategy: str = "single"
    model: str = "gpt-nano"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    # Class names of the model's blocks (FSDP units, per-block compile, checkpointing), as in
    # `model_blocks=DecoderLayer`; None: found by models/blocks.py.
    model_blocks: Optional[list[str]] = None
    # `markov` (synthetic, known loss floor) or a path to a nanoGPT-style uint16 token file.
    data: str = "markov"
    data_samples: int = 4096  # sequences in the synthetic data set (one epoch)
    seq_len: int = 64
    # Batch: `batch_size` is the global batch in sequences, the same for every world size;
    # the per-rank micro-batch and the accumulation steps are derived from it.
    batch_size: int = 16
    micro_batch: Optional[int] = None  # per rank and micro-step; default batch_size / world size
    grad_accum: Optional[int] = None  # alternative to micro_batch
    steps: int = 20
    # Optimisation (AdamW, linear warmup then cosine to min_lr). Unset, they follow the model and
    # the run (harness/train/optimizer.py): lr by model size (GPT-3's table), min_lr a tenth of it, warm-up
    # over a tenth of the steps.
    lr: Optional[float] = None
    min_lr: Optional[float] = None
    warmup_steps: Optional[int] = None
    # The schedule's shape: `cosine` (unset: the above), or DeepSpeed's `constant` (WarmupLR) and `linear`
    # (WarmupDecayLR), step by step as DeepSpeed computes them: a warm-up from min_lr (unset: 0) to lr, then
    # lr held, or back to min_lr at the last step. A DeepSpeed JSON's scheduler section sets them where the
    # run leaves them unset. warmup_type: `linear` (unset) or `log` (DeepSpeed's default), for those two.
    lr_schedule: Optional[str] = None
    warmup_type: Optional[str] = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    precision: str = "fp32"
    # precision=fp8 (strategies/float8.py): the blocks' linear layers in float8, scaled per tensor or per
    # row; with tensorwise scaling FSDP2 strategies all-gather their weights in float8.
    fp8_scaling: str = "tensorwise"
    fp8_all_gather: bool = True
    seed: int = 1337
    # Set: a noise run. Every gradient is nudged by one rounding step of the precision before each
    # optimizer step, from this seed (harness/train/noise.py): how the compare measures the spread a
    # correct backend may show.
    noise_seed: Optional[int] = None
    # torch.use_deterministic_algorithms(True) and what CUDA needs for it: the same run twice
    # gives the same bits on a GPU too, at the cost of slower deterministic kernels.
    deterministic: bool = False
    # Where and how it runs.
    device: str = "auto"
    nproc: Optional[int] = None  # start this many local processes when no launcher did
    pg_timeout_s: float = 300.0  # process-group timeout: a lost rank fails the job after this
    out_dir: str = "runs/train"
    log_every: int = 10  # host sync and metrics flush interval, in steps
    timing_warmup: int = 2  # steps left out of throughput figures
    # Consecutive steps (numbered from 1, as in metrics.jsonl) to run under torch.profiler: a trace
    # and a summary per rank in <out_dir>/profile/ (harness/train/profiling.py). They run slower.
    profile_steps: list[int] = field(default_factory=list)
    # Where the curves go besides metrics.jsonl (docs/trackers.md): TensorBoard event files in out_dir
    # (unset: wherever tensorboard is installed, as it is with parabench; true: required; false: none);
    # `trackers=[wandb,mlflow]` logs the same through those libraries too.
    tensorboard: Optional[bool] = None
    trackers: list[str] = field(default_factory=list)
    tracker_project: Optional[str] = None  # the W&B project; None: WANDB_PROJECT, else parabench
    tracker_group: Optional[str] = None  # W&B group and MLflow experiment; None: a compare's out_dir name
    # The MLflow tracking URI; None: MLFLOW_TRACKING_URI, else sqlite:///<out_dir>/mlflow.db (a compare's out_dir).
    tracker_uri: Optional[str] = None
    # Library warnings and logs (Python warnings, DeepSpeed's and others' loggers) go to <out_dir>/log.txt;
    # true: to the terminal, as the libraries print them.
    verbose: bool = False
    # Backend options: passed to the strategy plugin as keyword arguments.
    strategy_options: dict[str, Any] = field(default_factory=dict)
    deepspeed_config: Optional[str] = None  # a user's DeepSpeed JSON, merged over the built one
    compile: bool = False
    activation_checkpointing: bool = False
    # With activation_checkpointing, torchtitan's op-level policy in each block instead of the block recomputed
    # whole (models/selective_checkpointing.py): what activation_checkpointing=selective sets.
    selective_checkpointing: bool = False
    # Checkpoints.
    checkpoint_every: int = 0  # 0: never
    keep_last: int = 2
    resume: Optional[str] = None  # `auto` or a checkpoint path

    def world_batch(self, world_size: int, data_parallel: bool = False) -> tuple[int, int]:
        """(micro_batch, grad_accum) for this world size; the product with world_size is batch_size.
        data_parallel: `world_size` counts the data-parallel ranks of a mesh, not every process."""
        ranks = "data-parallel ranks" if data_parallel else "processes"
        per_rank, rem = divmod(self.batch_size, world_size)
        if rem:
            raise ConfigError(
                f"batch_size={self.batch_size} does not divide over {world_size} {ranks}: "
                f"choose a batch_size that is a multiple of {world_size}"
            )
        if self.micro_batch is not None and self.grad_accum is not None:
            if self.micro_batch * self.grad_accum != per_rank:
                raise ConfigError(
                    f"micro_batch={self.micro_batch} x grad_accum={self.grad_accum} x {world_size} {ranks} "
                    f"!= batch_size={self.batch_size}: set only one of micro_batch and grad_accum"
                )
            return self.micro_batch, self.grad_accum
        if self.grad_accum is not None:
            micro, rem = divmod(per_rank, self.grad_accum)
            if rem or micro == 0:
                raise ConfigError(
                    f"grad_accum={self.grad_accum} does not divide the per-process batch {per_rank} "
                    f"(batch_size={self.batch_size} / {world_size} {ranks})"
                )
            return micro, self.grad_accum
        micro = self.micro_batch or per_rank
        accum, rem = divmod(per_rank, micro)
        if rem or accum == 0:
            raise ConfigError(
                f"micro_batch={micro} does not divide the per-process batch {per_rank} "
                f"(batch_size={self.batch_size} / {world_size} {ranks})"
            )
        return micro, accum


_POSITIVE_INTS = ("data_samples", "seq_len", "batch_size", "steps", "log_every", "keep_last")
_NON_NEGATIVE = ("warmup_steps", "timing_warmup", "checkpoint_every", "grad_clip", "weight_decay", "min_lr")  # or unset


def _validate(cfg: RunConfig) -> None:
    for name in _POSITIVE_INTS:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be a positive number")
    for name in _NON_NEGATIVE:
        value = getattr(cfg, name)
        if value is not None and value < 0:
            raise ConfigError(f"{name}={value} must not be negative")
    for name in ("micro_batch", "grad_accum", "nproc"):
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name}={value} must be a positive number (or leave it unset)")
    if cfg.lr is not None and cfg.lr <= 0:
        raise ConfigError(f"lr={cfg.lr} must be positive (or leave it unset: by model size)")
    if cfg.lr_schedule is not None and cfg.lr_schedule not in LR_SCHEDULES:
        raise ConfigError(f"lr_schedule={cfg.lr_schedule!r} is not one of {', '.join(LR_SCHEDULES)}")
    if cfg.warmup_type is not None and cfg.warmup_type not in WARMUP_TYPES:
        raise ConfigError(f"warmup_type={cfg.warmup_type!r} is not one of {', '.join(WARMUP_TYPES)}")
    if cfg.warmup_type == "log" and cfg.lr_schedule in (None, "cosine"):
        raise ConfigError(
            "warmup_type=log is the warm-up of DeepSpeed's shapes: set lr_schedule=constant or linear with it "
            "(the cosine warms up linearly)"
        )
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"precision={cfg.precision!r} is not one of {', '.join(PRECISIONS)}")
    if cfg.fp8_scaling not in FP8_SCALINGS:
        raise ConfigError(f"fp8_scaling={cfg.fp8_scaling!r} is not one of {', '.join(FP8_SCALINGS)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device={cfg.device!r} is not one of {', '.join(DEVICES)}")
    if not 0 <= cfg.beta1 < 1 or not 0 <= cfg.beta2 < 1:
        raise ConfigError(f"beta1={cfg.beta1}, beta2={cfg.beta2}: each must be in [0, 1)")
    if cfg.pg_timeout_s < MIN_PG_TIMEOUT_S:
        raise ConfigError(
            f"pg_timeout_s={cfg.pg_timeout_s} must be at least {MIN_PG_TIMEOUT_S:g} (seconds): "
            "the ranks need that long to connect (default 300)"
        )
    for name in cfg.trackers:
        if name not in TRACKERS:
            close = difflib.get_close_matches(name, TRACKERS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"trackers=[{name}]: unknown tracker: {hint}trackers are {', '.join(TRACKERS)}")
    if cfg.tensorboard is False and "tensorboard" in cfg.trackers:
        raise ConfigError("tensorboard=false but trackers= lists tensorboard: drop one of the two")
    if cfg.selective_checkpointing and not cfg.activation_checkpointing:
        raise ConfigError(
            "selective_checkpointing=true is a way of activation checkpointing, which is off: "
            "give activation_checkpointing=selective"
        )
    steps = list(cfg.profile_steps)
    if steps and (steps != list(range(steps[0], steps[0] + len(steps))) or steps[0] < 1 or steps[-1] > cfg.steps):
        raise ConfigError(
            f"profile_steps={steps} must be consecutive step numbers between 1 and steps={cfg.steps}, "
            "for example profile_steps=[6,7,8]"
        )


def _key_help(bad_key: str, schema: type) -> str:
    known = [f.name for f in fields(schema)]
    close = difflib.get_close_matches(bad_key, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown config key {bad_key!r}: {hint}known keys: {', '.join(known)}"


def _read_yaml(path: str) -> DictConfig:
    candidate = Path(path)
    if not candidate.exists() and (CONFIG_DIR / path).exists():
        candidate = CONFIG_DIR / path
    if not candidate.exists() and (CONFIG_DIR / f"{path}.yaml").exists():
        candidate = CONFIG_DIR / f"{path}.yaml"
    if candidate.is_dir():
        raise ConfigError(f"config={path} is a folder: give a YAML file in it, or a preset name from {CONFIG_DIR}")
    if not candidate.is_file():
        presets = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        close = difflib.get_close_matches(Path(path).stem, presets, n=1)
        hint = f" (did you mean config={close[0]}?)" if close else ""
        raise ConfigError(
            f"config file {path!r} not found{hint}: give a YAML path or a preset name from {CONFIG_DIR} "
            f"({', '.join(presets)})"
        )
    try:
        loaded = OmegaConf.load(candidate)
    except Exception as exc:  # yaml.YAMLError and friends: one line, not a parser traceback
        raise ConfigError(f"config file {candidate} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {candidate} must hold a mapping of key: value")
    return loaded


# Keys holding a list of names, which also take `key=a,b` and `key=a` for `key=[a,b]`.
LIST_KEYS = ("model_blocks", "trackers", "profile_steps")


# Keys whose values are strategy names, which may be `<kind>:<path>`: quoted before YAML reads them,
# so that a colon is part of the name (`deepspeed:` alone, `accelerate: x.yaml`) and never a mapping.
NAME_KEYS = ("strategy", "strategies")
QUOTES = "\"'"


# The flags DeepSpeed's own scripts take (deepspeed.add_config_arguments), which users of the deepspeed
# launcher put on its command line out of habit: read as arguments, they were "not key=value" alone.
DEEPSPEED_FLAGS = ("--deepspeed", "--deepspeed_config", "--deepscale", "--deepscale_config")


def parse_overrides(args: list[str]) -> list[str]:
    """Check that each argument is `key=value` and return them as an omegaconf dotlist."""
    for arg in args:
        if arg.partition("=")[0] in DEEPSPEED_FLAGS:
            raise ConfigError(
                f"argument {arg!r} is a flag of DeepSpeed's own scripts, which parabench does not read: give the "
                "JSON as strategy=deepspeed:<file.json> (its ZeRO stage picks the strategy), or as "
                "deepspeed_config=<file.json> beside strategy=zero1, zero2 or zero3 (merged over their config)"
            )
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"argument {arg!r} is not key=value (for example steps=20)")
        key, _, value = arg.partition("=")
        if key in FILE_KEYS and not value.strip():
            raise ConfigError(f"{key}= is empty: give a value, or leave {key}= out")
    return [_quoted_names(_bracketed(arg)) for arg in args]


# Keys naming a file or folder: empty (an unset shell variable) they would read as not given and run
# something else than asked, a whole default compare for `plan=`.
FILE_KEYS = ("config", "plan", "calibrate", "deepspeed_config", "resume", "data")


# Keys whose values are read as written: YAML would take `inter_node=0x400` for hexadecimal 1024.
VERBATIM_KEYS = ("inter_node", "interconnect")


def _quoted_names(arg: str) -> str:
    key, _, value = arg.partition("=")
    if key in VERBATIM_KEYS and value and value != "null" and not value.startswith("["):
        return f"{key}={json.dumps(value.strip().strip(QUOTES))}"
    if key not in NAME_KEYS or not value or value == "null":
        return arg
    if value.startswith("[") != value.endswith("]"):
        raise ConfigError(f"cannot read {arg!r}: write lists as {key}=[a,b]")
    if key == "strategies" and not value.startswith("["):  # `strategies=a,b` as well as `strategies=[a,b]`
        value = f"[{value}]"
    if value.startswith("[") and value.endswith("]"):
        names = [name.strip().strip(QUOTES) for name in value[1:-1].split(",")]
        return f"{key}=[{', '.join(json.dumps(name) for name in names if name)}]"
    return f"{key}={json.dumps(value.strip().strip(QUOTES))}"


def _bracketed(arg: str) -> str:
    key, _, value = arg.partition("=")
    if key in LIST_KEYS and value and not value.startswith("[") and value != "null":
        return f"{key}=[{value}]"
    return arg


MIN_PG_TIMEOUT_S = 1.0  # below it gloo's ranks cannot form their group even on one host


def load_config(args: list[str], schema: type = RunConfig) -> Any:
    """Merge the schema defaults, an optional `config=<yaml>` preset and `key=value` overrides.

    Returns an instance of `schema` (a plain dataclass), checked key by key.
    """
    overrides = _checkpointing_words(parse_overrides(args), schema)
    _check_booleans(overrides, schema)
    preset = [a.split("=", 1)[1] for a in overrides if a.startswith("config=")]
    overrides = [a for a in overrides if not a.startswith("config=")]
    base = OmegaConf.structured(schema)
    try:
        layers = [base] + [_preset_checkpointing_words(_read_yaml(p), schema) for p in preset]
        layers.append(_read_overrides(overrides))
        merged = OmegaConf.merge(*layers)
        cfg = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc, schema)) from None
    except TypeError:  # omegaconf's "Cannot merge incompatible container types": a list for a mapping
        raise ConfigError(_container_message(overrides, schema)) from None
    _check_finite(cfg)
    if isinstance(cfg, RunConfig):
        _validate(cfg)
    return cfg


# How YAML spells a boolean; omegaconf also takes any integer for one (2 as true), which is a typo.
BOOLEAN_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0", "null")


# The planner's words for the checkpointing modes (`plan search=true` prints them in the arguments of its
# pick), as train's two booleans: activation_checkpointing and selective_checkpointing, so a plan's line
# runs as printed.
CHECKPOINTING_WORDS = {"none": ("false", "false"), "full": ("true", "false"), "selective": ("true", "true")}


def checkpointing_mode(activation_checkpointing: Any, selective: Any = False) -> str:
    """The planner's word (none, full or selective) for a run's activation_checkpointing and
    selective_checkpointing; a word (the planner's own setting) is returned as it is."""
    if isinstance(activation_checkpointing, str):
        return activation_checkpointing
    if not activation_checkpointing:
        return "none"
    return "selective" if selective else "full"


def _checkpointing_word(value: str) -> tuple[str, str] | None:
    """train's (activation_checkpointing, selective_checkpointing), as YAML writes them, for the planner's
    checkpointing word `value`; None for any other value."""
    return CHECKPOINTING_WORDS.get(value.strip().strip(QUOTES).lower())


def _takes_checkpointing_words(schema: type) -> bool:
    return get_type_hints(schema).get("activation_checkpointing") is bool


def _checkpointing_words(overrides: list[str], schema: type) -> list[str]:
    """activation_checkpointing=none|full as false|true where the schema's is a boolean (train's, compare's)."""
    if not _takes_checkpointing_words(schema):
        return overrides
    read = []
    for override in overrides:
        key, _, value = override.partition("=")
        words = _checkpointing_word(value) if key == "activation_checkpointing" else None
        if key == "activation_checkpointing" and value.strip().lower() in ("false", "no", "off", "0"):
            words = CHECKPOINTING_WORDS["none"]  # no checkpointing, whatever a preset's selective said
        if words:
            read += [f"activation_checkpointing={words[0]}", f"selective_checkpointing={words[1]}"]
        else:
            read.append(override)
    return read


def _preset_checkpointing_words(preset: DictConfig, schema: type) -> DictConfig:
    """A preset's `activation_checkpointing: none|full` as false|true, as on the command line."""
    value = preset.get("activation_checkpointing") if _takes_checkpointing_words(schema) else None
    words = _checkpointing_word(value) if isinstance(value, str) else None
    if words:
        preset.activation_checkpointing, preset.selective_checkpointing = (word == "true" for word in words)
    return preset


def _check_booleans(overrides: list[str], schema: type) -> None:
    hints = get_type_hints(schema)
    for override in overrides:
        key, _, value = override.partition("=")
        if hints.get(key) in (bool, Optional[bool]) and value.strip().strip(QUOTES).lower() not in BOOLEAN_WORDS:
            words = f" (or {', '.join(CHECKPOINTING_WORDS)})" if key == "activation_checkpointing" else ""
            raise ConfigError(f"{key}={value}: give true or false{words}")


def _check_finite(cfg: Any) -> None:
    """NaN passes every `<= 0` check and infinity every range, so a number must first be finite."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name}={value} must be a finite number")


def _read_overrides(overrides: list[str]) -> DictConfig:
    """The `key=value` arguments as one config; a value YAML cannot read is one line naming it."""
    for override in overrides:
        try:
            OmegaConf.from_dotlist([override])
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise ConfigError(
                f"cannot read {override!r} ({problem}): quote the value, e.g. key='a: b', or write lists as [a,b]"
            ) from None
    return OmegaConf.from_dotlist(overrides)


# What to give instead, by the words of omegaconf's conversion errors.
VALUE_HINTS = (
    ("to Integer", "give a whole number"),
    ("to Float", "give a number"),
    ("to Boolean", "give true or false"),
    ("to Dict", "set its entries as {key}.<name>=value"),
    ("'ListConfig' to string", "give one value, not a list"),
    ("'DictConfig' to", "it takes one value, not named entries: give {key}=<value>"),
)


def _container_message(overrides: list[str], schema: type) -> str:
    """The one line for a list given where the config holds a mapping (`model_kwargs=[1]`)."""
    hints = get_type_hints(schema)
    for override in overrides:
        key, _, value = override.partition("=")
        if "dict" in str(hints.get(key, "")).lower() and value.strip().startswith("["):
            return f"bad value for {key!r}: give its entries as {key}.<name>=value, not a list"
    return "a list was given where the config holds named entries: give them as <key>.<name>=value"


def _omegaconf_message(exc: OmegaConfBaseException, schema: type) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    text = str(exc).splitlines()[0]
    if "not in struct" in text or "Key '" in text and "not in" in text:
        return _key_help(str(key).split(".")[0], schema)
    if not key:
        return text
    if "Incompatible value 'None'" in text:
        return f"{key}= is empty: give a value"
    if key == "strategy" and "ListConfig" in text:
        return "strategy= takes one name: to run several, use runner.py compare strategies=[a,b]"
    hint = next((": " + advice.format(key=key) for words, advice in VALUE_HINTS if words in text), "")
    return f"bad value for {key!r}: {text}{hint}"


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-friendly copy of a config dataclass."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
