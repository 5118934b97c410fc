"""Test hooks: faults and a fake memory limit that the tests switch on through environment
variables. Each is read once, when a process starts its job, and is nothing at all otherwise:
the training loop and the batch search's probes carry no check of their own.

    PARABENCH_TEST_FAULT=kill@<rank>:<step>   that rank SIGKILLs itself once <step> steps (and
                        hang@<rank>:<step>    that step's checkpoint) are done, or stops
                                              answering instead; in an elastic job's first
                                              attempt only, so that the job torchrun restarts
                                              runs clean
    PARABENCH_TEST_MEMORY_LIMIT=<micro_batch> a probe above that micro-batch raises
                                              torch.OutOfMemoryError in its second step's
                                              forward (a CPU has no memory limit to find)
    PARABENCH_TEST_AVAILABLE_MEMORY=<bytes>   `compare plan=` fits its layouts' micro-batches to
                                              this much available host memory instead of the
                                              machine's (harness/compare/fit_here.py)
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    import torch

FAULT_ENV = "PARABENCH_TEST_FAULT"
MEMORY_LIMIT_ENV = "PARABENCH_TEST_MEMORY_LIMIT"
AVAILABLE_MEMORY_ENV = "PARABENCH_TEST_AVAILABLE_MEMORY"


def fault_after_step(rank: int, env: Mapping[str, str] = os.environ) -> Callable[[int], None] | None:
    """What this rank must call after each step to play the fault the environment asks for,
    or None where it asks for none here."""
    spec = env.get(FAULT_ENV)
    if not spec or env.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    kind, _, where = spec.partition("@")
    fault_rank, _, fault_step = where.partition(":")
    if kind not in ("kill", "hang") or not fault_rank.isdigit() or not fault_step.isdigit():
        raise ValueError(f"{FAULT_ENV}={spec!r}: write kill@<rank>:<step> or hang@<rank>:<step>")
    if int(fault_rank) != rank:
        return None
    step = int(fault_step)

    def play(steps_done: int) -> None:
        if steps_done != step:
            return
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: alive, holding its sockets, answering nothing
            time.sleep(3600)

    return play


def fake_memory_limit(env: Mapping[str, str] = os.environ) -> int | None:
    """The largest micro-batch the fake limit lets fit, or None where none is set."""
    value = env.get(MEMORY_LIMIT_ENV)
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{MEMORY_LIMIT_ENV}={value!r}: write the largest micro-batch that fits, e.g. 4")
    return int(value)


def install_fake_memory_limit(model: torch.nn.Module, micro_batch: int, limit: int) -> None:
    """Make `model` raise torch.OutOfMemoryError in its second forward when `micro_batch` is
    over `limit`: once the first step has built the optimizer state, so that what is freed
    afterwards is everything a real one leaves."""
    import torch

    if micro_batch <= limit:
        return
    forwards = itertools.count(1)

    def run_out(module: torch.nn.Module, args: Any) -> None:
        if next(forwards) == 2:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (faked: {MEMORY_LIMIT_ENV}={limit}, micro-batch {micro_batch})"
            )

    model.register_forward_pre_hook(run_out)


def fake_available_memory(env: Mapping[str, str] = os.environ) -> int | None:
    """The host memory available that a test fakes, in bytes, or None where none is set."""
    value = env.get(AVAILABLE_MEMORY_ENV)
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{AVAILABLE_MEMORY_ENV}={value!r}: write a number of bytes, e.g. 2000000000")
    return int(value)
