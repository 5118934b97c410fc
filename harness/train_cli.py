"""`runner.py train key=value ...`: check the run up front, then train here or
start `nproc` local processes under torchrun when no launcher did.

    python runner.py train strategy=fsdp nproc=2 model=gpt-nano steps=20 out_dir=runs/x
    torchrun --nproc_per_node=8 runner.py train strategy=zero3 model=gpt2-350m precision=bf16

The keys, their defaults and meanings are the fields of RunConfig in configs/schema.py;
`config=<file.yaml>` loads a preset first, `strategy_options.<name>=` reach the plugin.
"""
from __future__ import annotations

from configs.schema import RunConfig, load_config
from harness.distributed import launched_by_launcher
from harness.launch import run_under_torchrun
from models.data import TokenFileData
from strategies.base import RunContext
from strategies.registry import default_registry


def preflight(cfg: RunConfig, world_size: int) -> None:
    """Catch bad input in the parent, once, before any worker starts: one line, not N tracebacks.

    The strategy is constructed (not set up) for the planned world size: plugins check
    their options and configuration files in __init__, so those errors surface here too.
    The model is built on the meta device and prepared as the run will (its blocks found,
    checkpointing turned on).
    """
    import torch

    from harness.train import prepare_model

    micro_batch, grad_accum = cfg.world_batch(world_size)
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    ctx = RunContext(
        rank=0, world_size=world_size, local_rank=0, device=torch.device("cuda" if use_cuda else "cpu"),
        precision=cfg.precision, micro_batch=micro_batch, grad_accum=grad_accum, grad_clip=cfg.grad_clip, config=cfg,
    )
    default_registry().create(cfg.strategy, ctx, **cfg.strategy_options)
    with torch.device("meta"):
        prepare_model(cfg)
    if cfg.data != "markov":
        TokenFileData(cfg.data, cfg.seq_len)


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
