"""Whether a plan's host memory fits its host: what offload (optimizer state, parameters, saved
activations) keeps there for each GPU, times the GPUs on one host, against the host's memory less
a reserve.

  host memory   per host, the card's reference system (harness/common/hardware.py _HOSTS: a DGX
                H100's 2 TB, a GB200 tray's two Graces), or host_mem_gb=
  reserve       what the plan may use is the host's over HOST_BUFFER_FACTOR, the 1.5 that
                DeepSpeed's own estimator of ZeRO's CPU memory multiplies its needs by "to be
                conservative" (deepspeed docs, memory.html: estimate_zero2/zero3_model_states_mem_needs,
                additional_buffer_factor=1.5): the OS, the page cache, the dataloader's workers,
                pinned staging buffers and each rank's own process (the CUDA runtime, Python) live
                beside the offloaded state
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.common.units import GB, GIB

HOST_BUFFER_FACTOR = 1.5


@dataclass(frozen=True)
class HostRoom:
    """One host's memory as a plan may use it, shared by the GPUs on it."""

    capacity: float  # bytes of one host
    gpus: int  # GPUs (ranks) on one host

    @property
    def usable(self) -> float:
        return self.capacity / HOST_BUFFER_FACTOR

    def needed(self, per_gpu: float) -> float:
        """What the host's ranks hold together, each `per_gpu` bytes."""
        return per_gpu * self.gpus

    def fits(self, per_gpu: float) -> bool:
        return self.needed(per_gpu) <= self.usable

    def shortfall(self, per_gpu: float) -> str:
        """Why `per_gpu` bytes a GPU do not fit, in words, with the host_mem_gb= that would hold them."""
        return (
            f"needs {_size(self.needed(per_gpu))} of host memory per {self.gpus}-GPU host, {_size(self.usable)} "
            f"usable: a host of host_mem_gb={self.host_gb_for(per_gpu)} or more holds it"
        )

    def host_gb_for(self, per_gpu: float) -> int:
        """The host memory, whole GB (hundreds past 1,000), whose usable share holds `per_gpu` bytes a GPU."""
        gb = self.needed(per_gpu) * HOST_BUFFER_FACTOR / GB
        return math.ceil(gb) if gb < 1000 else 100 * math.ceil(gb / 100)

    def describe(self) -> str:
        return (
            f"{_size(self.capacity)} per {self.gpus}-GPU host, over {HOST_BUFFER_FACTOR:g} (DeepSpeed's buffer "
            f"factor for the OS, page cache, workers and pinned buffers) = {_size(self.usable)} for offloaded state"
        )


def host_room(host_bytes: float | None, gpus_per_host: int) -> HostRoom | None:
    """The room of a host of `host_bytes` (None: unknown, no check) holding `gpus_per_host` GPUs."""
    return None if host_bytes is None else HostRoom(host_bytes, gpus_per_host)


def _size(nbytes: float) -> str:
    if nbytes >= 1024 * GIB:
        return f"{nbytes / (1024 * GIB):.1f} TiB"
    return f"{nbytes / GIB:.0f} GiB" if nbytes >= GIB else f"{nbytes / 2**20:.0f} MiB"
