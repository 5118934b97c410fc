"""The checks a run passes before any process starts: bad input is one line from the parent,
not a traceback from every worker."""

from __future__ import annotations

from configs.schema import RunConfig
from harness.common.writable import check_writable
from harness.train.trackers import check_trackers
from models.data import TokenFileData
from strategies.registry import default_registry
from strategies.single import started_more_than_one


def preflight(cfg: RunConfig, world_size: int) -> None:
    """Catch bad input in the parent, once, before any worker starts: one line, not N tracebacks.

    The strategy is constructed (not set up) for the planned world size: plugins check
    their options and configuration files in __init__, so those errors surface here too.
    The model is built on the meta device and prepared as the run will (its blocks found,
    checkpointing turned on). The out_dir is created and tried with a file, the trackers'
    libraries looked for.
    """
    import torch

    check_writable(cfg.out_dir)
    check_trackers(cfg)

    from harness.train.distributed import DistEnv
    from harness.train.loop import create_strategy, prepare_model

    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    create_strategy(cfg, DistEnv(rank=0, world_size=world_size, local_rank=0, device=device))
    if world_size > 1 and default_registry().get(cfg.strategy).one_process:
        raise started_more_than_one(cfg.strategy, world_size)
    with torch.device("meta"):
        prepare_model(cfg)
    if cfg.data != "markov":
        TokenFileData(cfg.data, cfg.seq_len)
