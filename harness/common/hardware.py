"""GPUs as their data sheets give them: peak matmul throughput (for MFU and the planner),
memory bandwidth and size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as the vendor's data sheet gives it."""

    peak_flops: dict[str, float]  # dense (no sparsity) FLOP/s by precision; fp32 is plain, not TF32
    memory_gb: float  # per card, 1e9 bytes (the common variant where there are two)
    hbm_bytes_per_s: float  # memory bandwidth


# Most specific names first: "H100 PCIe" must match before "H100".
GPUS = {
    "H200": GPUSpec({"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, 141, 4.8e12),
    "H100 PCIe": GPUSpec({"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}, 80, 2.0e12),
    "H100": GPUSpec({"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, 80, 3.35e12),
    "A100": GPUSpec({"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}, 80, 2.0e12),
    "L40S": GPUSpec({"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}, 48, 0.864e12),
    "A10G": GPUSpec({"bf16": 70e12, "fp16": 70e12, "fp32": 31.2e12}, 24, 0.6e12),
    "L4": GPUSpec({"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}, 24, 0.3e12),
}


def gpu_spec(name: str) -> GPUSpec | None:
    """The spec of a GPU by (part of) its name, as `torch.cuda.get_device_name` or a user writes it."""
    lowered = name.strip().lower()
    exact = next((spec for key, spec in GPUS.items() if key.lower() == lowered), None)
    return exact or next((spec for key, spec in GPUS.items() if key.lower() in lowered), None)
