"""A card's measured kernel table, where one is present: what `bench/kernel_table.py` timed on that
card replaces the model's constants for plans on it; without one the model stands as cited.

One JSON file a card, `kernel_tables/<card>.json` beside this module (the card's `gpu=` key), with:

  host_s_per_kernel   {"eager": s, "compiled": s}: an eager and a compiled training step's host time
                      per kernel launched, where the GPU waits on it (host_issue.py's rates)
  memory_efficiency   the share of the data sheet's bandwidth eager elementwise kernels reach
                      (compute.py's MEMORY_EFFICIENCY)
  matmuls             [[m, n, k, seconds], ...] bf16, the shapes tensor parallelism's splits give a
                      block's projections, forward and both gradients (gemm.py's model is scaled by
                      the measured over the modelled time of the nearest shape measured)
  attention           {kernel: [[seq, head_dim, tflops], ...]}: causal forward+backward rates as
                      attention.py counts them (its published rates, for that kernel)
  source              the device, the library versions, the date and the command that measured it

A table is read once a card; a file that is not such a table is one line saying which and why.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from harness.common.hardware import GPUS, GPUSpec
from harness.plan.model.model_shape import PlanError

TABLES = Path(__file__).with_name("kernel_tables")


@dataclass(frozen=True, eq=False)  # one object a card (read once): hashed by identity, for _nearest's cache
class KernelTable:
    card: str
    source: str
    host_s_per_kernel: dict[str, float] = field(default_factory=dict)
    memory_efficiency: float | None = None
    matmuls: tuple[tuple[float, float, float, float], ...] = ()  # (m, n, k, seconds), sorted by log2 flops
    attention: dict[str, tuple[tuple[float, float, float], ...]] = field(default_factory=dict)

    def nearest_matmul(self, m: float, n: float, k: float) -> tuple[float, float, float, float] | None:
        """The measured matmul nearest (m, n, k) in log2 space, (m, n, k, seconds); None without any."""
        if not self.matmuls:
            return None
        return _nearest(self, _log_key(m), _log_key(n), _log_key(k))

    def attention_tflops(self, kernel: str, seq: float, head_dim: int) -> float | None:
        """The measured rate of `kernel` at the nearest head dim, interpolated in log2(seq) and held
        flat past the ends; None where the table has no such kernel."""
        points = self.attention.get(kernel)
        if not points:
            return None
        dim = min({d for _, d, _ in points}, key=lambda d: abs(d - head_dim))
        row = sorted((math.log2(s), r) for s, d, r in points if d == dim)
        x = math.log2(max(seq, 1.0))
        i = bisect.bisect_left([s for s, _ in row], x)
        if i == 0 or i == len(row):
            return row[min(i, len(row) - 1)][1]
        (s0, r0), (s1, r1) = row[i - 1], row[i]
        return r0 + (x - s0) / (s1 - s0) * (r1 - r0)


def _log_key(x: float) -> int:
    return round(4 * math.log2(max(x, 1.0)))  # quarter octaves: the cache's key and the distance's unit


@lru_cache(maxsize=65536)
def _nearest(table: KernelTable, m: int, n: int, k: int) -> tuple[float, float, float, float]:
    return min(
        table.matmuls,
        key=lambda e: (_log_key(e[0]) - m) ** 2 + (_log_key(e[1]) - n) ** 2 + (_log_key(e[2]) - k) ** 2,
    )


def _read(path: Path, card: str) -> KernelTable:
    try:
        raw = json.loads(path.read_text())
        host = {key: float(raw["host_s_per_kernel"][key]) for key in ("eager", "compiled")}
        efficiency = raw.get("memory_efficiency")
        matmuls = tuple(sorted(tuple(float(v) for v in e) for e in raw.get("matmuls", [])))
        attention = {
            kernel: tuple(tuple(float(v) for v in p) for p in points)
            for kernel, points in raw.get("attention", {}).items()
        }
        if any(len(e) != 4 or min(e) <= 0 for e in matmuls) or any(
            len(p) != 3 for pts in attention.values() for p in pts
        ):
            raise ValueError("a matmul is [m, n, k, seconds] and an attention point [seq, head_dim, tflops]")
        if min(host.values()) <= 0 or (efficiency is not None and not 0 < float(efficiency) <= 1):
            raise ValueError("host times must be positive and memory_efficiency in (0, 1]")
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{path}: not a kernel table ({exc}): run bench/kernel_table.py on the card again") from None
    return KernelTable(
        card, str(raw.get("source", "")), host, None if efficiency is None else float(efficiency), matmuls, attention
    )


@lru_cache(maxsize=None)
def _table_of(card: str, directory: Path) -> KernelTable | None:
    path = directory / f"{card}.json"
    return _read(path, card) if path.is_file() else None


def kernel_table(gpu: GPUSpec) -> KernelTable | None:
    """The measured table of `gpu` (a card of harness/common/hardware.py, by its `gpu=` key), or None
    where none was measured."""
    card = _CARDS.get(gpu.name)
    return None if card is None else _table_of(card, TABLES)


_CARDS = {spec.name: key for key, spec in GPUS.items()}
