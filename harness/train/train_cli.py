"""`runner.py train key=value ...`: check the run up front, then train here or
start `nproc` local processes under torchrun when no launcher did.

    python runner.py train strategy=fsdp nproc=2 model=gpt-nano steps=20 out_dir=runs/x
    torchrun --nproc_per_node=8 runner.py train strategy=zero3 model=gpt2-350m precision=bf16

The keys, their defaults and meanings are the fields of RunConfig in configs/schema.py;
`config=<file.yaml>` loads a preset first, `strategy_options.<name>=` reach the plugin.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from configs.schema import RunConfig, load_config
from harness.common.writable import check_writable
from harness.train.checkpoint import CHECKPOINTS, check_resume, refuse_earlier_run
from harness.train.distributed import check_nproc_under_launcher, launched_by_launcher
from harness.train.file_settings import adopt_file_settings
from harness.train.launch import in_forked_worker, run_under_torchrun
from harness.train.library_output import library_output
from harness.train.run_checks import check_deepspeed_config, check_run_names, preflight
from harness.train.trackers import check_trackers


def main(args: list[str]) -> int:
    cfg = load_config(args)
    cfg, _ = adopt_file_settings(cfg, [cfg.strategy])  # a file's scheduler: the schedule, in every process alike
    check_resume(cfg.resume)
    if launched_by_launcher():
        # No preflight under another launcher: every rank checks these, and stops with one line.
        check_nproc_under_launcher(cfg.nproc)
        check_deepspeed_config(cfg)
        check_writable(cfg.out_dir)
        check_run_names(cfg.out_dir)
        check_trackers(cfg)
        _train(cfg)
        _leave_finished_worker()
        return 0
    nproc = cfg.nproc or 1
    strategy = preflight(cfg, nproc)
    if cfg.resume is None:
        # Here, not in preflight: a compare preflights each strategy with the default out_dir, not a
        # run's. The run's rank 0 asks it again under any launcher (CheckpointManager.find); here it
        # is one line before any process starts.
        refuse_earlier_run(Path(cfg.out_dir) / CHECKPOINTS, will_write=cfg.checkpoint_every > 0)
    if nproc > 1:
        # On the CPU (the device the preflight laid the run out for) no CUDA state is forked.
        on_cpu = strategy.ctx.device.type == "cpu"
        return run_under_torchrun(
            nproc, ["train", *args], fork_workers=on_cpu, backend_modules=strategy.backend_modules
        )
    _train(cfg)
    return 0


def _leave_finished_worker() -> None:
    """Exit a worker whose run finished, skipping the interpreter's teardown of its objects (a
    forked worker returns instead: its multiprocessing parent ends it the same way).

    Torn down with the interpreter, gloo's worker threads can still hold work that references
    tensors: destroying them then aborts the process (SIGABRT, "terminate called without an
    active exception"), and a complete run on a CPU would be reported failed. The exit handlers
    (trackers' libraries, logging) run first, as at any exit; everything the run writes is closed."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if not in_forked_worker():
        os._exit(0)


def _train(cfg: RunConfig) -> None:
    """This process's share of the run, the libraries' output in <out_dir>/log.txt unless verbose."""
    from harness.train.loop import run

    with library_output(cfg.out_dir, cfg.verbose, rank=int(os.environ.get("RANK", "0"))):
        run(cfg)
