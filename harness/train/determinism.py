"""deterministic=true: the same run twice gives the same bits, on a GPU too.

torch.use_deterministic_algorithms(True) makes every op pick its deterministic kernel or
raise (strict mode: SDPA's flash and memory-efficient backward become deterministic, cuDNN
attention is left out); cuBLAS needs a fixed workspace for deterministic reductions
(CUBLAS_WORKSPACE_CONFIG, read when its first handle is made, so this runs before the first
CUDA kernel); cuDNN must not benchmark its way to another algorithm on each run. What it
costs is speed: deterministic kernels (embedding backward, attention backward) are slower.
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE_CONFIG = ":4096:8"  # the setting CUDA's documentation gives for deterministic cuBLAS


def make_deterministic() -> dict[str, str | bool]:
    """Switch this process to deterministic kernels; returns what was set, for summary.json."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return {"use_deterministic_algorithms": True, "CUBLAS_WORKSPACE_CONFIG": os.environ["CUBLAS_WORKSPACE_CONFIG"]}
