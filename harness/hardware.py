"""Device facts for the figures: peak matmul throughput (for MFU) and peak memory."""
from __future__ import annotations

import torch

# Dense peak FLOP/s by precision (no sparsity), from the vendors' data sheets.
# fp32 is the plain (non-TF32) rate: parabench runs fp32 as real fp32.
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12},
    "A10G": {"bf16": 70e12, "fp16": 70e12, "fp32": 31.2e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12},
}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one device at this precision, or None where unknown (CPUs)."""
    if device.type != "cuda":
        return None
    name = device_name(device)
    for key, table in PEAK_FLOPS.items():  # most specific names come first
        if key in name:
            return table[precision]
    return None


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
