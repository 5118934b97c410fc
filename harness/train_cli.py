"""`runner.py train key=value ...`: check the run up front, then train here or
start `nproc` local processes under torchrun when no launcher did."""
from __future__ import annotations

from pathlib import Path

from configs.schema import RunConfig, load_config
from harness.distributed import launched_by_launcher
from harness.launch import run_under_torchrun
from models.data import TokenFileData
from models.zoo import build_model
from strategies.registry import default_registry


def preflight(cfg: RunConfig, world_size: int) -> None:
    """Catch bad input in the parent, once, before any worker starts: one line, not N tracebacks."""
    cfg.world_batch(world_size)
    entry = default_registry().get(cfg.strategy)
    if entry.unavailable_reason:
        raise ValueError(f"strategy {cfg.strategy!r} is unavailable here: {entry.unavailable_reason}")
    import torch

    with torch.device("meta"):
        build_model(cfg.model, cfg.model_kwargs)
    if cfg.data != "markov":
        TokenFileData(cfg.data, cfg.seq_len)
    if cfg.deepspeed_config and not Path(cfg.deepspeed_config).is_file():
        raise ValueError(f"deepspeed_config {cfg.deepspeed_config!r} not found: give the path of a DeepSpeed JSON file")


def main(args: list[str]) -> int:
    cfg = load_config(args)
    if launched_by_launcher():
        from harness.train import run

        run(cfg)
        return 0
    nproc = cfg.nproc or 1
    preflight(cfg, nproc)
    if nproc > 1:
        return run_under_torchrun(nproc, ["train", *args])
    from harness.train import run

    run(cfg)
    return 0
