"""The options of `runner.py compare`: every `train` option (inherited from
RunConfig, so the two never drift apart) plus the sweep's own."""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Collection, Optional

from configs.schema import ConfigError, RunConfig, load_config, to_dict
from harness.compare.resume import check_mode
from harness.train import MLFLOW_DB
from strategies.base import StrategyError, compute_precision
from strategies.option_routing import compare_wide, is_section, route_options, section
from strategies.registry import StrategyRegistry

DEFAULT_PRESET = "default"

# With noise_runs=0 only: the largest relative loss difference from the reference, at any
# step, that still "matches". fp32 differs only by the order of floating-point reductions;
# bf16/fp16 round every matmul input, and backends round in different places (autocast vs.
# cast parameters). With noise runs the verdict is judged against measured noise instead.
TOLERANCE_BY_PRECISION = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
DEFAULT_NOISE_RUNS = 2
LAUNCHERS = ("local", "slurm")


@dataclass
class CompareConfig(RunConfig):
    # None: every available strategy that can run on the devices present.
    strategies: Optional[list[str]] = None
    timeout_s: float = 600.0  # per strategy run: past it every process of the run is killed
    batch_search: bool = False  # also find each strategy's largest micro-batch (GPU only)
    # The reference runs again this many times with rounding noise (harness/train/noise.py): the spread
    # the loss verdicts are judged against (harness/compare/verdict.py). 0: the fixed loss_tolerance instead.
    noise_runs: int = DEFAULT_NOISE_RUNS
    loss_tolerance: Optional[float] = None  # noise_runs=0 only; None: TOLERANCE_BY_PRECISION[precision]
    out_dir: str = "runs/compare"
    # Where the jobs run: `local` (this machine) or `slurm` (one sbatch script per strategy).
    launcher: str = "local"
    nodes: int = 1  # slurm: nodes per job
    gpus_per_node: Optional[int] = None  # slurm: default, the GPUs visible here
    dry_run: bool = False  # slurm: write and print the scripts, submit nothing
    slurm_partition: Optional[str] = None
    slurm_time: str = "01:00:00"
    rdzv_port: int = 29500  # slurm: the c10d rendezvous port on each job's first node
    # What to do with an earlier compare's runs in out_dir (harness/compare/resume.py): `auto` keeps the
    # finished ones of the same configuration and continues the rest; `never` runs everything again.
    resume: Optional[str] = None
    # The JSON of `runner.py plan search=true ... format=json`: measure its `top` best layouts (default 3)
    # beside single, on its model, seq_len and global batch (harness/compare/from_plan.py).
    plan: Optional[str] = None
    top: Optional[int] = None

    def tolerance(self) -> float:
        if self.loss_tolerance is not None:
            return self.loss_tolerance
        return TOLERANCE_BY_PRECISION[compute_precision(self.precision)]


# Set per strategy by the sweep, never taken from the shared config (a compare's own resume=
# says what to do with an earlier compare's runs: harness/compare/resume.py).
PER_RUN = ("strategy", "nproc", "out_dir", "noise_seed", "resume")


def load_compare_config(args: list[str]) -> CompareConfig:
    """`key=value` arguments over configs/default.yaml (or the preset named by config=)."""
    args = [_check_key(arg) for arg in args]
    if not any(arg.startswith("config=") for arg in args):
        args = [f"config={DEFAULT_PRESET}", *args]
    cfg = load_config(args, schema=CompareConfig)
    if cfg.timeout_s <= 0:
        raise ConfigError(f"timeout_s={cfg.timeout_s} must be positive (seconds per strategy run)")
    if cfg.loss_tolerance is not None and cfg.loss_tolerance <= 0:
        raise ConfigError(f"loss_tolerance={cfg.loss_tolerance} must be positive (a relative loss difference)")
    if cfg.noise_runs < 0:
        raise ConfigError(f"noise_runs={cfg.noise_runs} must be 0 (a fixed loss_tolerance) or more")
    if cfg.loss_tolerance is not None and cfg.noise_runs:
        raise ConfigError(
            "loss_tolerance= is the rule without noise runs: add noise_runs=0 to use it, or drop it "
            "to judge the curves against the measured noise"
        )
    if cfg.noise_seed is not None:
        raise ConfigError("noise_seed= is set by compare for its noise runs: set noise_runs= instead")
    if cfg.strategies is not None and not cfg.strategies:
        raise ConfigError("strategies=[] names no strategy: list some, or leave it out to run every available one")
    check_mode(cfg.resume)
    _check_launcher(cfg)
    return cfg


# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]], or no limit.
SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)


def _check_launcher(cfg: CompareConfig) -> None:
    if cfg.launcher not in LAUNCHERS:
        raise ConfigError(f"launcher={cfg.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if cfg.nodes < 1:
        raise ConfigError(f"nodes={cfg.nodes} must be at least 1")
    if cfg.gpus_per_node is not None and cfg.gpus_per_node < 1:
        raise ConfigError(f"gpus_per_node={cfg.gpus_per_node} must be at least 1")
    if cfg.launcher == "local" and (cfg.nodes > 1 or cfg.dry_run):
        raise ConfigError("nodes= and dry_run= are for launcher=slurm; a local compare runs on this machine's devices")
    if cfg.launcher == "slurm" and cfg.nproc is not None:
        raise ConfigError("with launcher=slurm the world size is nodes x gpus_per_node: leave nproc= out")
    if not 1 <= cfg.rdzv_port <= 65535:
        raise ConfigError(f"rdzv_port={cfg.rdzv_port} is not a TCP port: give one from 1 to 65535")
    if not SLURM_TIME.fullmatch(str(cfg.slurm_time)):
        raise ConfigError(
            f"slurm_time={cfg.slurm_time!r} is not a time sbatch reads: give minutes, hours:minutes:seconds "
            "or days-hours:minutes:seconds (e.g. 01:00:00)"
        )


def _check_key(arg: str) -> str:
    """Name compare's own keys in the error (the shared loader only knows train's)."""
    key = arg.partition("=")[0]
    if key == "strategy":
        raise ConfigError("compare runs several strategies: use strategies=[a,b] instead of strategy=")
    known = [f.name for f in fields(CompareConfig) if f.name != "strategy"]
    if key.split(".")[0] not in (*known, "config") and "=" in arg:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown compare option {key!r}: {hint}options are {', '.join(known)}")
    return arg


def train_options(cfg: CompareConfig, strategy_names: Collection[str]) -> dict[str, Any]:
    """The RunConfig fields every strategy's run shares (what makes the comparison fair).

    `strategy_options.<key>=` reaches every strategy; a section named after one of
    `strategy_names` (`strategy_options.fsdp.prefetch_blocks=2`) only that strategy, so it
    is left out here: see own_options."""
    shared = {f.name for f in fields(RunConfig)} - set(PER_RUN)
    options = {k: v for k, v in to_dict(cfg).items() if k in shared}
    options.update(_tracker_options(cfg))
    # A run's whole output is its log.txt already (harness/compare/supervise.py), libraries' included.
    options["verbose"] = True
    # Every strategy option travels on its run's own command line (options_for): a compare-wide one
    # reaches only the strategies that have it. So does deepspeed_config (deepspeed_config_for), which
    # train refuses beside a strategy that runs no DeepSpeed.
    options["strategy_options"] = {}
    options["deepspeed_config"] = None
    return options


def _tracker_options(cfg: CompareConfig) -> dict[str, Any]:
    """The compare's runs log as one group (W&B) or experiment (MLflow) named after the
    compare's out_dir, into one MLflow store there unless a server is named."""
    out = Path(cfg.out_dir).resolve()
    options: dict[str, Any] = {"tracker_group": cfg.tracker_group or out.name}
    if "mlflow" in cfg.trackers and not cfg.tracker_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        options["tracker_uri"] = f"sqlite:///{out / MLFLOW_DB}"
    return options


def out_dir_named(cfg: CompareConfig) -> set[str]:
    """The options _tracker_options named after the out_dir, the user having left them unset: kept out
    of each run's identity (identity.OUT_DIR_NAMED)."""
    return {key for key in _tracker_options(cfg) if not getattr(cfg, key)}


def own_options(cfg: CompareConfig, name: str) -> dict[str, Any]:
    """The options of `strategy_options.<name>.<key>=`: for strategy `name` alone."""
    return section(cfg.strategy_options, name)


def compare_wide_options(cfg: CompareConfig, registered: Collection[str]) -> dict[str, Any]:
    """The options of `strategy_options.<key>=`: for every strategy of the compare that has `key`."""
    return compare_wide(cfg.strategy_options, registered)


def options_for(cfg: CompareConfig, name: str, registry: StrategyRegistry) -> dict[str, Any]:
    """Strategy `name`'s options in this compare: the compare-wide ones it has, then its own section."""
    has = registry.get(name).user_options()
    wide = compare_wide_options(cfg, registry.names())
    return {**{k: v for k, v in wide.items() if k in has}, **own_options(cfg, name)}


def deepspeed_config_for(cfg: CompareConfig, name: str, registry: StrategyRegistry) -> dict[str, Any]:
    """The compare's deepspeed_config= as strategy `name`'s run takes it: set where the strategy merges it
    over the DeepSpeed config it builds, absent elsewhere (the run, its identity included, is as without it)."""
    if cfg.deepspeed_config and registry.get(name).takes_deepspeed_config():
        return {"deepspeed_config": cfg.deepspeed_config}
    return {}


def takers_of_deepspeed_config(cfg: CompareConfig, runs: dict[str, str], registry: StrategyRegistry) -> list[str]:
    """The runs (by name, each with the strategy it runs as) deepspeed_config= reaches; none of them is a
    mistake worth one line."""
    if not cfg.deepspeed_config:
        return []
    takers = [name for name, strategy in runs.items() if deepspeed_config_for(cfg, strategy, registry)]
    if not takers:
        runs = [name for name in registry.names() if registry.get(name).takes_deepspeed_config()]
        raise ConfigError(
            f"deepspeed_config={cfg.deepspeed_config} configures DeepSpeed, and no strategy of this compare takes it: "
            f"add one that does to strategies= ({', '.join(runs)}), or drop deepspeed_config="
        )
    return takers


def option_args(cfg: CompareConfig, name: str, registry: StrategyRegistry) -> list[str]:
    """options_for as `train` arguments (JSON values read back as the same YAML scalars)."""
    options = options_for(cfg, name, registry)
    return [f"strategy_options.{key}={json.dumps(value)}" for key, value in options.items()]


def takers_of_compare_wide_options(
    cfg: CompareConfig, compared: Collection[str], registry: StrategyRegistry
) -> dict[str, list[str]]:
    """Each compare-wide option with the compared strategies that take it (strategies/option_routing.py,
    the plan's rule too). An option none of them has is a mistake worth one line (with the closest
    option they do have)."""
    try:
        routed = route_options(
            cfg.strategy_options, list(compared), registry.names(), lambda name: registry.get(name).user_options()
        )
    except StrategyError as exc:
        raise ConfigError(str(exc)) from None
    return routed.takers


def check_own_options(cfg: CompareConfig, compared: Collection[str], registered: Collection[str]) -> None:
    """A section for a strategy this compare does not run is a mistake worth one line."""
    for key, value in cfg.strategy_options.items():
        if is_section(key, value, registered) and key not in compared:
            raise ConfigError(
                f"strategy_options.{key} is for strategy {key!r}, which this compare does not run: "
                f"add it to strategies= or drop the section"
            )
