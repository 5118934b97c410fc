"""Whether a plan fits, as the card decides: the capacity torch reports for it, less what is gone
before the model allocates anything, against the predicted peak with the caching allocator's
allowance.

  capacity      GiB as torch reports the card (harness/common/hardware.py; an H100 80GB is 79.2
                GiB, not 80 GB)
  CUDA context  0.5 GiB: the context and its kernels with lazy module loading, torch 2.1 on an
                A100 (stas00/ml-engineering training/performance/README.md @ 744d01e1, "Preloaded
                CUDA kernels memory usage": 0.47 GiB, up to 0.92 once every kernel is loaded)
  NCCL          1.45 GiB for the first communicator (the same file's torch.distributed example:
                0.55 -> 2.00 GiB after the first barrier on 2 GPUs); 0.5 GiB for each further one
                (tensor parallel, hybrid replicas, hpZ: 32 channels x 2 peers x 9.2 MiB of
                SIMPLE+LL+LL128 buffers, NVIDIA/nccl src/init.cc @ 5067397c)
  allocator     the caching allocator reserves more than it allocates: ALLOCATOR_ALLOWANCE of the
                peak allocated, the smallest reserved-over-allocated gap of the reference H100
                compare (harness/plan/speed/reference_h100.json: 4.0%, ddp and single), where no
                sharding's buffers of changing sizes are cached beside the model; under pressure
                the allocator frees its cache before it gives up, so the larger gaps sharded
                strategies show at rest (up to 27%) are not lost to a run that needs them
  logits' block torch's max reserved also holds the freed block of an unfused loss's logits beside
                the loss's larger fp32 tensors (activations.py `logits_cached`): StrategyPlan's
                reserved figure adds it, the fit does not, as the allocator frees it before it
                gives up
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.common.units import GIB

CUDA_CONTEXT_BYTES = 0.5 * GIB
NCCL_FIRST_BYTES = 1.45 * GIB
NCCL_FURTHER_BYTES = 0.5 * GIB


def _smallest_reserve() -> float:
    """The reference compare's smallest max reserved over max allocated, less one."""
    doc = json.loads((Path(__file__).parent.parent / "speed" / "reference_h100.json").read_text())
    return min(e["peak_mem_reserved_bytes"] / e["peak_mem_allocated_bytes"] for e in doc["strategies"]) - 1


ALLOCATOR_ALLOWANCE = _smallest_reserve()


@dataclass(frozen=True)
class Headroom:
    """The card's memory as a plan may use it."""

    capacity: float  # bytes, as torch reports the card
    context: float
    nccl: float
    library: str = "nccl"  # "rccl" on AMD's cards: the same figures, CUDA's and NCCL's, assumed for HIP and RCCL

    @property
    def usable(self) -> float:
        """What the caching allocator may reserve."""
        return self.capacity - self.context - self.nccl

    def reserved(self, peak_allocated: float) -> float:
        return peak_allocated * (1 + ALLOCATOR_ALLOWANCE)

    def fits(self, peak_allocated: float) -> bool:
        return self.reserved(peak_allocated) <= self.usable

    def describe(self) -> str:
        amd = self.library == "rccl"
        return (
            f"{self.capacity / GIB:.1f} GiB as torch reports the card, less {self.context / GIB:.1f} GiB "
            f"{'HIP' if amd else 'CUDA'} context"
            + (f" and {self.nccl / GIB:.2f} GiB {'RCCL' if amd else 'NCCL'}" if self.nccl else "")
            + (" (CUDA's and NCCL's figures, assumed)" if amd else "")
            + f" = {self.usable / GIB:.1f} GiB for the allocator, which reserves "
            f"{ALLOCATOR_ALLOWANCE:.1%} over its peak"
        )


def headroom(capacity: float, communicators: int, library: str = "nccl") -> Headroom:
    nccl = 0.0 if communicators <= 0 else NCCL_FIRST_BYTES + (communicators - 1) * NCCL_FURTHER_BYTES
    return Headroom(capacity, CUDA_CONTEXT_BYTES, nccl, library)
