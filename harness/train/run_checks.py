"""The checks a run passes before any process starts: bad input is one line from the parent,
not a traceback from every worker."""

from __future__ import annotations

from configs.schema import RunConfig
from models.data import TokenFileData
from strategies.base import RunContext, StrategyError
from strategies.registry import default_registry


def preflight(cfg: RunConfig, world_size: int, ranks_per_node: int | None = None) -> None:
    """Catch bad input in the parent, once, before any worker starts: one line, not N tracebacks.

    A strategy that cannot run on the run's device says why. Its mesh is laid out for the
    planned world size (`ranks_per_node` on each node, by default all on one) and the strategy
    constructed (not set up): plugins check their options and configuration files in __init__,
    so those errors surface here too. The model is built on the meta device and prepared as the
    run will (its blocks found, checkpointing turned on), and the strategy checks it can lay it out.
    """
    import torch

    from harness.train.loop import prepare_model

    registry = default_registry()
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device_type = "cuda" if use_cuda else "cpu"
    unsupported = registry.get(cfg.strategy).unsupported_reason(device_type)
    if unsupported:
        raise StrategyError(f"strategy {cfg.strategy!r} cannot run on {device_type} here: {unsupported}")
    mesh = registry.mesh_layout(cfg.strategy, world_size, ranks_per_node or world_size, **cfg.strategy_options)
    micro_batch, grad_accum = cfg.world_batch(mesh.data_parallel(0)[1], data_parallel=mesh.declared)
    ctx = RunContext(
        rank=0,
        world_size=world_size,
        local_rank=0,
        device=torch.device(device_type),
        precision=cfg.precision,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        grad_clip=cfg.grad_clip,
        config=cfg,
        mesh=mesh,
    )
    strategy = registry.create(cfg.strategy, ctx, **cfg.strategy_options)
    with torch.device("meta"):
        model, _, _ = prepare_model(cfg)
    strategy.check_model(model)
    if cfg.data != "markov":
        TokenFileData(cfg.data, cfg.seq_len)
