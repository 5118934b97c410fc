"""Whether a plan's layout fits this machine at its planned micro-batch, and the largest that does.

A `compare plan=` measures layouts planned for another cluster: their micro-batch may not fit here.
Each run's memory is estimated with the planner's own model (harness.plan.peak_for_run: model
states, activations and buffers at this micro-batch, on this many processes) and set against this
machine's: on a CPU the host memory available when the compare starts (every process of the run on
it, each with its interpreter, torch and DeepSpeed besides what the planner counts); on a GPU each
device's memory. Where the planned micro-batch does not fit, the run takes the largest micro-batch
that does and accumulates the rest, so the global batch is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from configs.schema import RunConfig
from harness.common.testing_hooks import fake_available_memory
from harness.common.units import GIB
from harness.compare.kernel_oom import available_bytes

# Resident memory of a process that has imported torch and DeepSpeed (`python -c "import torch,
# deepspeed"`, ru_maxrss: 316 MiB on a 2-core x86 CPU with torch 2.11): what each process of a CPU run
# holds besides the planner's count, and torchrun's agent, which starts the workers, holds too.
PROCESS_BYTES = 320 * 2**20
# Of the memory available, what the runs may plan to use: the rest is for the allocator's slack and
# for what the planner does not count (autograd's transient tensors, Python's own objects).
USABLE_SHARE = 0.8


@dataclass(frozen=True)
class Fit:
    micro_batch: int
    grad_accum: int
    needed_bytes: float  # the whole run at this micro-batch, on this machine (0: the planner cannot say)
    usable_bytes: float

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.usable_bytes


def usable_bytes(device_type: str, available: Callable[[], int | None] = available_bytes) -> float | None:
    """What a run may use here: on a CPU a share of the host memory available now (all its processes
    together); on a GPU a share of one device's (each process's own); None where unknown."""
    if device_type == "cuda":
        import torch

        return USABLE_SHARE * torch.cuda.mem_get_info()[1]
    free = fake_available_memory() or available()
    return None if free is None else USABLE_SHARE * free


def needed_bytes(peak: float, processes: int, device_type: str) -> float:
    """A run's memory against usable_bytes: on a CPU every process's peak and interpreter, and
    torchrun's agent beside several; on a GPU one process's peak."""
    if device_type == "cuda":
        return peak
    return processes * (peak + PROCESS_BYTES) + (PROCESS_BYTES if processes > 1 else 0)


def largest_fitting(settings: dict[str, Any], strategy: str, processes: int, device_type: str, usable: float) -> Fit:
    """The largest micro-batch, up to the one `settings` give, that divides the local batch (micro-batch x
    accumulation) and fits `usable` bytes here; where none does, the smallest tried (Fit.fits false).
    Where the planner has no model of the strategy, the micro-batch given (it cannot say)."""
    from harness.plan import peak_for_run

    micro, accum = settings["micro_batch"], settings["grad_accum"]
    local = micro * accum
    cfg = RunConfig(**{**settings, "strategy": strategy})
    tried = Fit(micro, accum, 0.0, usable)
    for size in [m for m in range(micro, 0, -1) if local % m == 0]:
        peak = peak_for_run(cfg, processes, (size, local // size))
        if peak is None:  # no model, or a split the layout cannot run (its pipeline's micro-batches)
            continue
        tried = Fit(size, local // size, needed_bytes(peak, processes, device_type), usable)
        if tried.fits:
            return tried
    return tried


def described(fit: Fit, planned: int, processes: int, device_type: str) -> str:
    """What fitting changed, in words, for the compare's output and its report."""
    where = "this machine's memory" if device_type == "cpu" else "this GPU's memory"
    return (
        f"micro-batch {planned} does not fit {where} ({fit.usable_bytes / GIB:.1f} GiB usable on {processes} "
        f"process{'es' if processes > 1 else ''}, by the planner's memory model): runs micro-batch "
        f"{fit.micro_batch} x accumulation {fit.grad_accum} ({fit.needed_bytes / GIB:.1f} GiB), the same global batch"
    )
