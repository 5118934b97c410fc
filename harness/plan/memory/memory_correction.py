"""What a calibration found the memory model to miss, carried as what it is.

A measured peak allocated less the predicted one is split into the kinds of memory that grow
differently, so that a miss found at gpt2-124m on one GPU does not turn into gigabytes at 70B:

  fixed        bytes that are the same at every size: a workspace or a buffer the model does not
               count (cuBLAS's, a backend's staging), or one it counts that is not alive at the peak
  activations  a share of the activations alive at the peak: it follows the tokens of a micro-step,
               the width and the layers, as the activations do
  per param    bytes per parameter the GPU keeps at rest: it follows the model's size over the shards

A calibration can only tell apart the kinds its measurements vary in: measured at one size and one
micro-batch, a miss is carried as fixed bytes (parabench's own H100 measured its misses the same
at micro-batch 4, 8 and 16 of gpt2-124m, and `single`'s the same at gpt2-124m and gpt2-350m:
bench/data/h100_gpt2_350m.json and the plan_vs_measured log of the same machine); measured at
several micro-batches or sequence lengths (tokens per micro-step), the part that grows with them
is split off as activations; at several model sizes or GPU counts, the part that grows with the
parameters held. Each kind is fitted in that order, by least squares, only where the points can
tell it from the ones before.

Bounds: a correction never takes away more than LIMIT of what is transient at the peak
(activations and buffers), so a plan's peak is never below the model states a GPU must hold; the
activations' share is within LIMIT.
"""

from __future__ import annotations

from dataclasses import dataclass

LIMIT = 0.25  # of the transient memory at the peak, and of the activations: larger misses are a model to fix
DISTINCT = 0.05  # points whose activations (or parameters) differ by less than this share cannot tell it apart


@dataclass(frozen=True)
class MissPoint:
    """One measured peak's miss, beside what the plan had at that point."""

    missed: float  # measured peak allocated less the predicted, bytes
    activations: float  # the predicted activations alive at the peak, bytes
    params_held: float  # parameters the GPU keeps at rest
    tokens: int  # of a micro-step on the GPU


@dataclass(frozen=True)
class MemoryCorrection:
    """A calibration's memory miss by kind (module docstring)."""

    fixed_bytes: float = 0.0
    activation_share: float = 0.0  # of the activations alive at the peak
    bytes_per_param: float = 0.0  # per parameter the GPU keeps at rest

    def missed(self, activations: float, params_held: float) -> float:
        """What this correction adds to a peak with these activations and parameters held."""
        return self.fixed_bytes + self.activation_share * activations + self.bytes_per_param * params_held

    def describe(self) -> str:
        parts = []
        if self.fixed_bytes:
            parts.append(f"{self.fixed_bytes / 2**30:+.2f} GiB fixed")
        if self.activation_share:
            parts.append(f"{self.activation_share:+.1%} of the activations")
        if self.bytes_per_param:
            parts.append(f"{self.bytes_per_param:+.2f} bytes per parameter held")
        return ", ".join(parts) or "nothing"


def corrected_peak(peak: int, resident: int, correction: MemoryCorrection, activations: float, params: float) -> int:
    """`peak` with `correction`, never taking more than LIMIT of what is transient at the peak
    (`resident`: the model states the GPU holds through the step)."""
    transient = max(peak - resident, 0)
    return int(peak + max(correction.missed(activations, params), -LIMIT * transient))


def _varies(values: list[float]) -> bool:
    low, high = min(values), max(values)
    return high > 0 and (high - low) > DISTINCT * high


def _solve(rows: list[list[float]], targets: list[float]) -> list[float] | None:
    """Least squares by the normal equations (at most three unknowns, each column scaled to 1);
    None where singular."""
    n = len(rows[0])
    norms = [max(abs(r[i]) for r in rows) or 1.0 for i in range(n)]
    rows = [[x / norm for x, norm in zip(r, norms, strict=True)] for r in rows]
    a = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * t for r, t in zip(rows, targets, strict=True))]
        for i in range(n)
    ]
    scale = max(abs(x) for row in a for x in row[:n])
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-6 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] / norms[i] for i in range(n)]


def fit_correction(points: list[MissPoint]) -> MemoryCorrection:
    """The correction that reproduces `points`, by the kinds they can tell apart (module docstring)."""
    if not points:
        return MemoryCorrection()
    kinds = ["fixed"]
    if len(points) > 1 and _varies([p.tokens for p in points]):
        kinds.append("activations")
    if len(points) > len(kinds) and _varies([p.params_held for p in points]):
        kinds.append("params")
    column = {"fixed": lambda p: 1.0, "activations": lambda p: p.activations, "params": lambda p: p.params_held}
    solved = _solve([[column[k](p) for k in kinds] for p in points], [p.missed for p in points])
    while solved is None:  # the points do not tell the last kind from the others (fixed alone always solves)
        kinds.pop()
        solved = _solve([[column[k](p) for k in kinds] for p in points], [p.missed for p in points])
    values = dict(zip(kinds, solved, strict=True))
    share = min(max(values.get("activations", 0.0), -LIMIT), LIMIT)
    return MemoryCorrection(values["fixed"], share, values.get("params", 0.0))
