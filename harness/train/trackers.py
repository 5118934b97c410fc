"""Where a run's curves go besides metrics.jsonl, each through its library's own writer:
TensorBoard event files in out_dir (wherever tensorboard is installed, as it is with
parabench; tensorboard=true requires it, tensorboard=false turns it off), and with
`trackers=[wandb]` / `trackers=[mlflow]` a W&B run and an MLflow run.

Rank 0 writes, at the logging interval, the rows the metrics flush has already reduced over
the ranks (harness/train/metrics.py): no host sync of its own. Every tracker gets the same
scalars under the same names (SCALARS), at the step numbers of metrics.jsonl.

Names: a run is named after its strategy (a compare's noise run: "<strategy> noise <seed>").
TensorBoard's run is the folder, so `tensorboard --logdir <compare out_dir>` overlays the
strategies. W&B puts the runs of one compare in one group (tracker_group, by default the name
of the compare's out_dir) of project tracker_project; MLflow in one experiment of that name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from omegaconf import OmegaConf

from configs.schema import RunConfig, to_dict

if TYPE_CHECKING:
    from harness.train.distributed import DistEnv

# metrics.jsonl key -> the scalar's name in every tracker (a "/" groups them in TensorBoard and W&B).
SCALARS = {
    "loss": "loss",
    "lr": "lr",
    "tokens_per_s": "throughput/tokens_per_s",
    "step_time_s": "throughput/step_time_s",
    "mfu": "throughput/mfu",
    "mem_params_bytes": "memory/params_bytes",
    "mem_grads_bytes": "memory/grads_bytes",
    "mem_optimizer_bytes": "memory/optimizer_bytes",
    "peak_mem_allocated_bytes": "memory/peak_allocated_bytes",
    "peak_mem_reserved_bytes": "memory/peak_reserved_bytes",
}
EVENT_FILE_GLOB = "events.out.tfevents.*"
MLFLOW_DB = "mlflow.db"
MLFLOW_BATCH = {"params": 100, "metrics": 1000}  # the most MLflow takes in one log_batch


class TrackerError(ValueError):
    """A tracker that cannot run as asked (one line, says what to do)."""


def enabled(cfg: RunConfig) -> list[str]:
    """The trackers this run writes to, TensorBoard first."""
    rest = [name for name in dict.fromkeys(cfg.trackers) if name != "tensorboard"]
    return (["tensorboard"] if _tensorboard(cfg) else []) + rest


def _tensorboard(cfg: RunConfig) -> bool:
    if cfg.tensorboard is None and "tensorboard" not in cfg.trackers:
        # Unasked for, it is written where it can be: an environment of one's own (a GPU image) may lack it.
        return importlib.util.find_spec("tensorboard") is not None
    return cfg.tensorboard is not False


def check_trackers(cfg: RunConfig) -> None:
    """Every tracker asked for has its library (looked for, not imported): one line naming the package if not."""
    for name in enabled(cfg):
        if importlib.util.find_spec(name) is None:
            extra = " (or tensorboard=false)" if name == "tensorboard" else f" (or drop {name} from trackers=)"
            raise TrackerError(
                f"tracker {name} needs the {name} package, which is not installed: pip install {name}{extra}"
            )
    if "mlflow" in cfg.trackers and mlflow_uri(cfg).startswith("sqlite:"):
        missing = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
        if missing:
            raise TrackerError(
                f"tracker mlflow keeps its runs in {mlflow_uri(cfg)}, which needs {' and '.join(missing)}: "
                f"pip install {' '.join(missing)} (or give tracker_uri= an MLflow server)"
            )


def run_name(cfg: RunConfig) -> str:
    return cfg.strategy if cfg.noise_seed is None else f"{cfg.strategy} noise {cfg.noise_seed}"


def group_name(cfg: RunConfig) -> str:
    return cfg.tracker_group or Path(cfg.out_dir).resolve().name


def mlflow_uri(cfg: RunConfig) -> str:
    if cfg.tracker_uri:
        return cfg.tracker_uri
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(cfg.out_dir).resolve() / MLFLOW_DB}"


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl row as the trackers' scalars (figures not measured, such as CPU peak memory, left out)."""
    return {tag: float(row[key]) for key, tag in SCALARS.items() if row.get(key) is not None}


class TensorBoard:
    """Event files in the run's out_dir, written by TensorBoard's own writer (through torch)."""

    def __init__(self, cfg: RunConfig):
        self.cfg, self.writer = cfg, None

    def start(self, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        out_dir = Path(self.cfg.out_dir)
        if first_step == 0:
            # A fresh run starts its curves anew, as metrics.jsonl does.
            for stale in out_dir.glob(EVENT_FILE_GLOB):
                stale.unlink()
        # Resumed: TensorBoard drops what an earlier file logged from this step on (the steps redone).
        self.writer = SummaryWriter(str(out_dir), purge_step=first_step + 1 if first_step else None)
        config = OmegaConf.to_yaml(OmegaConf.create(to_dict(self.cfg)))
        self.writer.add_text("config", "".join(f"    {line}\n" for line in config.splitlines()), first_step)

    def log(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            for tag, value in scalars(row).items():
                self.writer.add_scalar(tag, value, row["step"])
        self.writer.flush()  # readable while the run goes on

    def close(self, failed: bool) -> None:
        if self.writer is not None:
            self.writer.close()


class WandB:
    """A W&B run (online, or offline under WANDB_MODE=offline) with its files in out_dir/wandb."""

    def __init__(self, cfg: RunConfig):
        self.cfg, self.run = cfg, None

    def start(self, first_step: int) -> None:
        import wandb

        try:
            self.run = wandb.init(
                project=self.cfg.tracker_project or os.environ.get("WANDB_PROJECT") or "parabench",
                group=group_name(self.cfg),
                name=run_name(self.cfg),
                job_type="noise" if self.cfg.noise_seed is not None else "train",
                dir=self.cfg.out_dir,
                config=to_dict(self.cfg),
                # W&B would otherwise wrap stdout and stderr, which parabench routes itself.
                settings=wandb.Settings(console="off"),
            )
        except Exception as exc:  # no login, no network, a bad project name: W&B's own words, on one line
            raise TrackerError(
                f"W&B could not start a run ({_first_line(exc)}): log in with `wandb login`, "
                "or set WANDB_MODE=offline to keep the runs on disk"
            ) from None

    def log(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.run.log(scalars(row), step=row["step"])

    def close(self, failed: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)


class MLflow:
    """An MLflow run in the experiment named by tracker_group, through MLflow's client."""

    def __init__(self, cfg: RunConfig):
        self.cfg, self.client, self.run_id = cfg, None, None

    def start(self, first_step: int) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = mlflow_uri(self.cfg)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            experiment = self.client.get_experiment_by_name(group_name(self.cfg))
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(group_name(self.cfg))
            )
            run = self.client.create_run(
                experiment_id,
                run_name=run_name(self.cfg),
                tags={"parabench.strategy": self.cfg.strategy, "parabench.kind": _kind(self.cfg)},
            )
        except Exception as exc:  # a server that does not answer, a store it cannot open
            raise TrackerError(
                f"MLflow could not start a run at {uri} ({_first_line(exc)}): check tracker_uri="
            ) from None
        self.run_id = run.info.run_id
        params = [Param(key, value) for key, value in _flat(to_dict(self.cfg)).items()]
        for first in range(0, len(params), MLFLOW_BATCH["params"]):
            self.client.log_batch(self.run_id, params=params[first : first + MLFLOW_BATCH["params"]])

    def log(self, rows: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, row["step"]) for row in rows for tag, value in scalars(row).items()]
        for first in range(0, len(metrics), MLFLOW_BATCH["metrics"]):  # the interval's rows in few requests
            self.client.log_batch(self.run_id, metrics=metrics[first : first + MLFLOW_BATCH["metrics"]])

    def close(self, failed: bool) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


WRITERS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class Trackers:
    """The run's trackers, started with the metrics and fed each flushed interval's rows."""

    def __init__(self, cfg: RunConfig):
        self.writers = [WRITERS[name](cfg) for name in enabled(cfg)]
        self._started: list = []

    def start(self, first_step: int) -> None:
        for writer in self.writers:
            writer.start(first_step)
            self._started.append(writer)

    def log(self, rows: list[dict[str, Any]]) -> None:
        for writer in self._started:
            writer.log(rows)

    def close(self, failed: bool) -> None:
        for writer in self._started:
            writer.close(failed)
        self._started = []


@contextlib.contextmanager
def tracking(cfg: RunConfig, env: DistEnv) -> Iterator[Trackers | None]:
    """The run's trackers on rank 0 (None elsewhere), closed on the way out; a run that raised is
    marked failed where the tracker knows the difference (W&B, MLflow)."""
    if not env.is_main:
        yield None
        return
    trackers = Trackers(cfg)
    if "tensorboard" not in enabled(cfg) and cfg.tensorboard is None:
        print("note: tensorboard is not installed, so no event files: pip install tensorboard", flush=True)
    failed = True
    try:
        yield trackers
        failed = False
    finally:
        trackers.close(failed)


def _kind(cfg: RunConfig) -> str:
    return "noise" if cfg.noise_seed is not None else "train"


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1}}` -> `{"a.b": "1"}`: MLflow's parameters are flat strings; unset ones are left out."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        elif value is not None:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
