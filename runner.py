#!/usr/bin/env python3
"""parabench: train the same model on the same data under DDP, FSDP, DeepSpeed ZeRO
and Accelerate, and compare memory, throughput and loss curves.

    python runner.py train   strategy=fsdp nproc=2 model=gpt-nano steps=20 out_dir=runs/x
    python runner.py compare [strategies=[ddp,fsdp]] [key=value ...]
    python runner.py plan    model=gpt2-1.5b gpus=8 gpu_mem_gb=80
    python runner.py report  <compare out_dir>
    python runner.py export  <checkpoint> <file.safetensors>
    python runner.py list

Works unchanged under torchrun, `deepspeed` and `accelerate launch`.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import os
import re
import signal
import sys

from harness.common.versions import check_versions

# Each subcommand lives in its own module with `main(args) -> int`.
COMMANDS = {
    "train": "harness.train.train_cli",
    "compare": "harness.compare.compare_cli",
    "report": "harness.report.report_cli",
    "plan": "harness.plan.plan_cli",
    "list": "harness.train.list_cli",
    "export": "harness.train.export_cli",
    "probe": "harness.compare.probe",  # internal: one job of compare's batch search
}

_LOCAL_RANK_FLAG = re.compile(r"^--local[_-]rank(=(\d+))?$")


def _strip_launcher_flags(args: list[str]) -> list[str]:
    """The `deepspeed` launcher passes --local_rank=N ahead of our own arguments."""
    out: list[str] = []
    skip_next = False
    for i, arg in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        match = _LOCAL_RANK_FLAG.match(arg)
        if not match:
            out.append(arg)
            continue
        value = match.group(2)
        if value is None and i + 1 < len(args):
            value, skip_next = args[i + 1], True
        if value is not None:
            os.environ.setdefault("LOCAL_RANK", value)
    return out


def one_line(message: str) -> str:
    """A library's several-line message (pydantic's validation errors) as one line, without its
    pointers to a web page."""
    lines = [line.strip() for line in message.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith("For further information visit"))


def main(argv: list[str] | None = None) -> int:
    args = _strip_launcher_flags(list(sys.argv[1:] if argv is None else argv))
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"parabench: error: unknown command {command!r}: use one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # Imported late: `list` and `plan` need not pay for torch.distributed start-up.
    module = importlib.import_module(COMMANDS[command])
    if rest[:1] in (["-h"], ["--help"]):
        print((module.__doc__ or "").strip())
        return 0
    try:
        check_versions()
        return int(module.main(rest) or 0)
    except ValueError as exc:  # every user-facing error class derives from ValueError
        from harness.train.launch import report_error

        report_error(f"parabench: error: {one_line(str(exc))}")
        return 2
    except Exception as exc:
        from harness.train.launch import reported_elsewhere

        if reported_elsewhere(exc):  # a peer stopped with its one line, which the launcher prints
            return 1
        raise


if __name__ == "__main__":
    # `kill -USR1 <pid>` prints every thread's stack: how to see where a stuck run is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        sys.exit(main())
    finally:
        # The interpreter's last garbage collections walk every object torch (and torch._dynamo,
        # matplotlib) made: 1-2 s before a run or a compare can exit, every time. Frozen, they are
        # left to the end of the process; what must be written is closed or flushed before this,
        # and atexit handlers still run.
        gc.freeze()
