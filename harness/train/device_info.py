"""The run's device, as the metrics and the summary read it: its name and capacity, its peak
FLOP/s (for MFU) and the peak memory in use."""

from __future__ import annotations

import torch

from harness.common.hardware import gpu_spec


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def device_memory(device: torch.device) -> int | None:
    """The device's capacity in bytes as torch reports it; None on a CPU."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one device at this precision, or None where unknown (CPUs, a precision the
    card has no tensor cores for: bf16 on a V100)."""
    spec = gpu_spec(device_name(device)) if device.type == "cuda" else None
    return spec.peak_flops.get(precision) if spec else None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, int] | None:
    """(max allocated, max reserved) bytes since the last reset; None on CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
