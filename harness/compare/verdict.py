"""Does a strategy learn what the reference learns? Its loss curve judged against the noise
the compare measured on this machine, in this precision, for this model.

The reference (`single`) runs again `noise_runs` times with rounding noise (harness/train/noise.py):
the same training, its gradients nudged by a rounding step before every update, plus
whatever the device's nondeterministic kernels add. Their largest relative distance from the
reference at each step is the measured spread; the noise band at a step is the largest spread
within NOISE_WINDOW steps of it (a noise run crosses the reference now and then, and its
spread drops to nothing for a step). What a strategy may differ by at step k is the largest of

  - NOISE_FACTOR x the band at k: what this training does to rounding-sized differences;
  - the precision's own resolution, its unit roundoff (bf16 3.9e-3, fp16 4.9e-4 relative): a
    loss computed in low precision is only good to that, and backends that keep the residual
    stream in bf16 (FSDP's policy, DeepSpeed) evaluate it differently from autocast's fp32
    stream (on gpt-nano: up to 6e-4, where noise runs stray 1e-4);
  - the rounding of the loss the backend returns (Accelerate's own FSDP2 policy, as `accelerate
    launch` configures it, casts it to bf16);
  - MATCH_FLOOR.

  matches       within MATCH_FLOOR at every step (in fp32 only reduction order differs);
  within noise  within the bound at every step (said: by how much, and what set the bound);
  differs       past it from some step on (said: from which step, by how much).

Without noise runs (noise_runs=0) the rule is the fixed tolerance of loss_tolerance=.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any

from harness.train import UNIT_ROUNDOFF
from strategies.base import compute_precision

MATCH_FLOOR = 1e-5  # relative; fp32 backends differ by about 2e-7 (reduction order) in the tests
NOISE_FACTOR = 4.0
NOISE_WINDOW = 2  # steps each side


@dataclass(frozen=True)
class NoiseBand:
    """The reference's own spread, step by step, and the rule built on it."""

    runs: int
    steps: list[int]
    spread: list[float]  # largest relative distance of a noise run from the reference, per step
    band: list[float]  # spread smoothed over +-window steps
    factor: float = NOISE_FACTOR
    window: int = NOISE_WINDOW
    floor: float = MATCH_FLOOR

    @cached_property
    def _by_step(self) -> dict[int, float]:
        return dict(zip(self.steps, self.band, strict=True))

    def at(self, step: int) -> float | None:
        return self._by_step.get(step)

    def rule(self) -> str:
        return (
            f"matches: within {self.floor:.0e} at every step; within noise: at every step within the largest of "
            f"{self.factor:g}x the largest spread of {self.runs} noise run{'s' if self.runs != 1 else ''} within "
            f"{self.window} steps, the precision's rounding (bf16 3.9e-03, fp16 4.9e-04) and the rounding of the "
            f"loss the backend returns; differs: past that"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rule": self.rule()}


def relative_distance(rows: list[dict], reference: dict[int, float]) -> dict[int, float]:
    """|loss - reference| / |reference| at every step both logged."""
    return {
        r["step"]: abs(r["loss"] - reference[r["step"]]) / max(abs(reference[r["step"]]), 1e-12)
        for r in rows
        if r["step"] in reference
    }


def measure_noise(
    reference: list[dict], noise_runs: list[list[dict]], window: int = NOISE_WINDOW, factor: float = NOISE_FACTOR
) -> NoiseBand:
    """The band from noise runs that logged every step the reference did."""
    ref = {r["step"]: r["loss"] for r in reference}
    steps = sorted(ref)
    distances = [relative_distance(rows, ref) for rows in noise_runs]
    spread = [max(d.get(step, 0.0) for d in distances) for step in steps]
    band = [max(spread[max(0, i - window) : i + window + 1]) for i in range(len(steps))]
    return NoiseBand(runs=len(noise_runs), steps=steps, spread=spread, band=band, factor=factor, window=window)


@dataclass(frozen=True)
class Verdict:
    kind: str  # matches | within noise | differs | not comparable
    text: str
    max_rel_diff: float | None = None
    first_step_over: int | None = None  # the first step past what is allowed; None: never
    noise_ratio: float | None = None  # the largest distance over the bound of its step (<= 1: within)

    @property
    def agrees(self) -> bool:
        return self.kind in ("matches", "within noise")


def resolution(dtype: str | None) -> float:
    """Relative rounding of a number held in `dtype` ("bf16", "fp16", "fp32"; fp8 runs hold what they
    do not compute in float8 as bf16; None: fp32)."""
    return UNIT_ROUNDOFF.get(compute_precision(dtype or "fp32"), UNIT_ROUNDOFF["fp32"])


def floor_of(
    band: NoiseBand, precision: str, loss_dtype: str | None = None, reference_loss_dtype: str | None = None
) -> tuple[float, str]:
    """The bound below which no difference counts, and what sets it."""
    floors = {
        "the fp32 floor": band.floor,
        f"{compute_precision(precision)} rounding": resolution(precision) if precision != "fp32" else 0.0,
        f"the {loss_dtype} loss it returns": resolution(loss_dtype) + resolution(reference_loss_dtype),
    }
    return max(floors.items(), key=lambda kv: kv[1])[::-1]


def bound_at(band: NoiseBand, step: int, floor: tuple[float, str]) -> tuple[float, str]:
    """What a strategy may differ by at `step`, and what sets it."""
    noise = band.factor * (band.at(step) or 0.0)
    return (noise, "the measured noise") if noise > floor[0] else floor


def judge(
    rows: list[dict],
    reference: list[dict],
    band: NoiseBand | None,
    *,
    precision: str,
    tolerance: float,
    loss_dtype: str | None = None,
    reference_loss_dtype: str | None = None,
) -> Verdict:
    """The verdict on one strategy's curve against the reference's."""
    if len(rows) != len(reference) or not rows:
        return Verdict(
            "not comparable", f"not comparable: {len(rows)} steps logged, the reference logged {len(reference)}"
        )
    ref = {r["step"]: r["loss"] for r in reference}
    distance = relative_distance(rows, ref)
    worst_step = max(distance, key=distance.get)
    worst = distance[worst_step]
    if band is None:
        first = next((step for step, d in distance.items() if d > tolerance), None)
        if first is None:
            return Verdict("matches", f"matches (max rel. diff {worst:.1e})", worst)
        return Verdict(
            "differs", f"differs: up to {worst:.1e} relative, over {tolerance:.0e} from step {first}", worst, first
        )
    if worst <= band.floor:
        return Verdict("matches", f"matches (max rel. diff {worst:.1e})", worst)
    floor = floor_of(band, precision, loss_dtype, reference_loss_dtype)
    bounds = {step: bound_at(band, step, floor) for step in distance}
    first = next((step for step, d in distance.items() if d > bounds[step][0]), None)
    ratio = max(d / bounds[step][0] for step, d in distance.items())  # the tightest step's share of its bound
    if first is None:
        limit, what = bounds[worst_step]
        return Verdict(
            "within noise",
            f"within noise (max rel. diff {worst:.1e} at step {worst_step}, "
            f"{worst / limit:.0%} of the bound {limit:.1e} set by {what})",
            worst,
            None,
            ratio,
        )
    over, what = bounds[first]
    return Verdict(
        "differs",
        f"differs from step {first}: up to {worst:.1e} relative, {ratio:.1f}x the bound "
        f"({over:.1e} at step {first}, set by {what})",
        worst,
        first,
        ratio,
    )


def at_capacity(verdict: Verdict, capacity: Any, reference_capacity: Any) -> Verdict:
    """A run whose experts drop tokens over a capacity is judged against a reference dropping at the same
    capacity (the capacity_factor its summary gives; None: dropless): the verdict says so, or, where the
    two differ, that the curves cannot be compared. Capacity is per sequence (models/routing.py), so at
    the same factor every layout drops the same tokens the reference does."""
    if capacity is None and reference_capacity is None:
        return verdict
    if capacity != reference_capacity:
        return Verdict(
            "not comparable",
            f"not comparable: capacity factor {_capacity(capacity)}, the reference's {_capacity(reference_capacity)}",
        )
    return replace(verdict, text=f"{verdict.text}, at the reference's capacity factor {_capacity(capacity)}")


def _capacity(factor: Any) -> str:
    return "none (dropless)" if factor is None else str(factor)
