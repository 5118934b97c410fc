"""The checks a run passes before any process starts: bad input is one line from the parent,
not a traceback from every worker."""

from __future__ import annotations

from pathlib import Path

from configs.schema import ConfigError, RunConfig
from harness.common.writable import FolderError, check_writable
from harness.train.checkpoint import CHECKPOINTS, MANIFEST, SUMMARY, list_checkpoints
from harness.train.library_output import LOG_FILE
from harness.train.trackers import check_trackers
from models.data import TokenFileData
from models.gpt_config import beyond_positions
from models.on_meta import on_meta
from strategies.base import ModelUnsupported, Strategy, StrategyError
from strategies.float8 import check_fp8
from strategies.mesh_layout import MeshError, MeshSizeError
from strategies.registry import default_registry
from strategies.single import started_more_than_one


def preflight(
    cfg: RunConfig, world_size: int, ranks_per_node: int | None = None, device_type: str | None = None
) -> Strategy:
    """_preflight(), and where it refuses the run, the out_dir folders it made for the run (empty) taken
    away again: a run stopped by its checks leaves nothing behind (runs/train under the working directory).

    `device_type`: the device of the machines the run will have, where they are not this one (a SLURM
    compare's compute nodes, checked from a login node that may have no GPU); unset, this machine's."""
    made = [folder for folder in (Path(cfg.out_dir), *Path(cfg.out_dir).parents) if not folder.exists()]
    try:
        return _preflight(cfg, world_size, ranks_per_node, device_type)
    except BaseException:
        for folder in made:  # deepest first; only what this check made and nothing has written into
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _preflight(cfg: RunConfig, world_size: int, ranks_per_node: int | None, device_type: str | None) -> Strategy:
    """Catch bad input in the parent, once, before any worker starts: one line, not N tracebacks.

    A strategy that cannot run on the run's device says why. Its mesh is laid out for the
    planned world size (`ranks_per_node` on each node, by default all on one) and the strategy
    constructed (not set up): plugins check their options and configuration files in __init__,
    so those errors surface here too. The model is built first, on the meta device, and prepared as
    the run will (its blocks found, checkpointing turned on): the strategy is given the run's
    learning-rate schedule, which depends on its size, and checks it can lay the model out.
    The out_dir is created and tried with a file, the trackers' libraries looked for. Returns the
    strategy as constructed for rank 0 (what it followed of a config file: its `followed`).

    A strategy that refuses this mesh (a MeshError) or this model (its check_model) raises
    ModelUnsupported: a lone run stops with that line, a compare skips the strategy with it.
    """
    import torch

    check_writable(cfg.out_dir)
    check_run_names(cfg.out_dir)
    check_trackers(cfg)

    from harness.train.distributed import NO_CUDA, DistEnv
    from harness.train.loop import create_strategy, prepare_model, run_schedule

    check_deepspeed_config(cfg)
    registry = default_registry()
    elsewhere = device_type is not None
    if not elsewhere:
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(NO_CUDA)
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        device_type = "cuda" if use_cuda else "cpu"
    unsupported = registry.get(cfg.strategy).unsupported_reason(device_type, cfg.strategy_options)
    if unsupported:
        raise StrategyError(f"strategy {cfg.strategy!r} cannot run on {device_type} here: {unsupported}")
    if cfg.precision == "fp8" and not elsewhere:  # the GPU's generation is known where it runs
        check_fp8(registry.get(cfg.strategy), torch.device(device_type))
    env = DistEnv(
        rank=0, world_size=world_size, local_rank=0, device=torch.device(device_type), local_world_size=ranks_per_node
    )
    with on_meta():
        model, blocks, _ = prepare_model(cfg)
    positions = getattr(getattr(model, "config", None), "block_size", None)
    if isinstance(positions, int) and cfg.seq_len > positions:
        raise ConfigError(beyond_positions(cfg.model, cfg.seq_len, "block_size", positions))
    try:
        strategy = create_strategy(cfg, env, run_schedule(cfg, model), model, blocks)
    except MeshSizeError as exc:  # tp_size=0: no count of ranks runs it, so the compare stops, not skips
        raise StrategyError(str(exc)) from None
    except MeshError as exc:  # this many ranks: the same strategy may run on another count
        raise ModelUnsupported(str(exc)) from None
    if world_size > 1 and registry.get(cfg.strategy).one_process:
        raise started_more_than_one(cfg.strategy, world_size)
    try:
        strategy.check_model(model)
    except ModelUnsupported:
        raise
    except ValueError as exc:  # this model (its heads, its blocks, its sequence): the others may lay it out
        raise ModelUnsupported(str(exc)) from None
    if cfg.data != "markov":
        TokenFileData(cfg.data, cfg.seq_len)
    return strategy


def check_deepspeed_config(cfg: RunConfig) -> None:
    """deepspeed_config= beside a strategy it does not reach is one line, not a run that ignores it."""
    if not cfg.deepspeed_config:
        return
    registry = default_registry()
    entry = registry.get(cfg.strategy)
    if entry.takes_deepspeed_config():
        return
    given = f"deepspeed_config={cfg.deepspeed_config}"
    if entry.config_file is not None and entry.cls is not None and entry.cls.takes_deepspeed_config(None):
        raise ConfigError(
            f"strategy {cfg.strategy} has a DeepSpeed config file of its own, which {given} would merge over: "
            "drop one of the two"
        )
    takers = [name for name in registry.names() if registry.get(name).takes_deepspeed_config()]
    raise ConfigError(
        f"{given} configures DeepSpeed, and strategy {cfg.strategy} runs no DeepSpeed: drop deepspeed_config=, "
        f"or run a strategy that takes it ({', '.join(takers)})"
    )


# What a run writes in its out_dir, files then folders (metrics.py, loop.py, library_output.py, checkpoint.py).
RUN_FILES = ("metrics.jsonl", SUMMARY, LOG_FILE)
RUN_FOLDERS = (CHECKPOINTS, "profile")
REMOVE_IT = "remove it or give another out_dir"


def check_run_names(out_dir: str | Path) -> None:
    """An out_dir holding a folder where the run writes a file, or a file where it writes a folder,
    is one line before the run starts, not a failure at its first write or after its last step.

    So is a checkpoint, or a run's checkpoints folder, given as out_dir (the folder `resume=` named,
    say): the run's log.txt written into a checkpoint no longer matches its manifest, which damaged
    the checkpoint for every later resume, and step_N folders would sit beside the run's files."""
    folder = Path(out_dir)
    if (folder / MANIFEST).is_file():
        raise FolderError(
            f"out_dir={out_dir} is a checkpoint ({MANIFEST}), which the run's files would damage: give the run a "
            "folder of its own (resume= names the checkpoint to start from)"
        )
    steps = list_checkpoints(folder)
    if steps:
        raise FolderError(
            f"out_dir={out_dir} is a run's checkpoints folder ({steps[-1][1].name}): give the run's own folder "
            f"({folder.parent}, with resume=auto to continue it) or a new one"
        )
    for name in RUN_FILES:
        if (folder / name).exists() and not (folder / name).is_file():
            raise FolderError(f"out_dir={out_dir} holds a folder {name} where the run writes a file: {REMOVE_IT}")
    for name in RUN_FOLDERS:
        if (folder / name).exists() and not (folder / name).is_dir():
            raise FolderError(f"out_dir={out_dir} holds a file {name} where the run writes a folder: {REMOVE_IT}")


def refuse_a_train_run(out_dir: str | Path, fix: str) -> None:
    """For a job that writes folders of its own into `out_dir` (a compare's run folders): an out_dir
    that holds a train run (a name it writes there) or is a run's checkpoints folder (step_N in it) is
    one line saying `fix`, before the job mixes its folders into the run's."""
    folder = Path(out_dir)
    held = next((name for name in (*RUN_FILES, *RUN_FOLDERS) if (folder / name).exists()), None)
    if held is not None:
        raise FolderError(f"out_dir={out_dir} holds a train run ({held}): {fix}")
    steps = list_checkpoints(folder)
    if steps:
        raise FolderError(f"out_dir={out_dir} holds a train run's checkpoints ({steps[-1][1].name}): {fix}")
