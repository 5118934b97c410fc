"""What a mixture-of-experts model's routers did, collected at the logging interval: the
assignments each expert of each MoE layer received (summed over the interval and the ranks), the
imbalance (the busiest expert's load over the mean load), the share dropped over capacity, and,
where expert parallel runs, the wall time of its all-to-alls per step.

Each MoE layer counts on the device as it routes (models/routing.py RouterTally): nothing here
syncs the host but the flush. The all-to-all clock (models/expert_parallel.py) runs on the step
that ends each logging interval only, with the device synchronised on either side of each
all-to-all, so that one step's time includes those syncs and every other step runs untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from models.expert_parallel import ALL_TO_ALL_CLOCK
from models.routing import RouterTally, named_router_tallies
from models.stages import RankStages


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer of the whole model, as every rank knows it (a pipeline stage holds only some)."""

    name: str  # the module its tally sits on
    experts: int
    capacity_factor: float | None


@dataclass
class RouterMetrics:
    tallies: list[RouterTally]
    device: torch.device
    # Whether this rank's tokens count: one rank of a group that shares its data (tensor parallel).
    counts: bool = True
    # Every MoE layer of the model in module order, and the row of each of this rank's tallies
    # among them; None: this rank holds them all, in that order.
    layers: list[MoELayer] | None = None
    rows: list[int] | None = None
    totals: torch.Tensor | None = None  # (layers, experts + 1) over the run so far, on the host
    all_to_all_seconds: float = 0.0
    all_to_all_steps: int = 0

    def _local(self) -> torch.Tensor:
        """This rank's counts since the last flush, one row per MoE layer of the model (zero for a
        layer another pipeline stage holds)."""
        if self.layers is None or self.rows is None:
            return torch.stack([t.take(self.device) for t in self.tallies])
        local = torch.zeros(len(self.layers), self.layers[0].experts + 1, dtype=torch.long, device=self.device)
        for row, tally in zip(self.rows, self.tallies, strict=True):
            local[row] = tally.take(self.device)
        return local

    def describe(self) -> str:
        """'2 MoE layers x 4 experts, dropless' or '..., capacity factor 1.25 per sequence: tokens over it dropped'."""
        if self.layers is None:
            return describe_routing(self.tallies)
        return _described(len(self.layers), self.layers[0].experts, [layer.capacity_factor for layer in self.layers])

    def begin_step(self, timed: bool) -> None:
        """Before each step: whether this one times its all-to-alls."""
        ALL_TO_ALL_CLOCK.enabled = timed
        ALL_TO_ALL_CLOCK.steps += int(timed)

    def flush(self, world_size: int) -> dict[str, Any]:
        """The interval's figures (collective: every rank calls it at each flush)."""
        ALL_TO_ALL_CLOCK.enabled = False
        local = self._local()
        if not self.counts:
            local.zero_()
        seconds, steps, calls = ALL_TO_ALL_CLOCK.take()
        clock = torch.tensor([seconds / max(steps, 1), float(calls)], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and world_size > 1:
            dist.all_reduce(local)
            dist.all_reduce(clock, op=dist.ReduceOp.MAX)
        counts = local.cpu()
        self.totals = counts if self.totals is None else self.totals + counts
        if clock[1].item():
            self.all_to_all_seconds += clock[0].item() * steps
            self.all_to_all_steps += steps
        per_step = clock[0].item() if clock[1].item() else None
        return {**_figures(counts), "all_to_all_ms_per_step": None if per_step is None else per_step * 1e3}

    def summary(self) -> dict[str, Any]:
        """The whole run's figures, for summary.json."""
        if self.totals is None:
            return {}
        everyone = self.layers or [MoELayer("", t.n_experts, t.capacity_factor) for t in self.tallies]
        factors = {layer.capacity_factor for layer in everyone}
        timed = self.all_to_all_steps
        return {
            **_figures(self.totals),
            "capacity_factor": factors.pop() if len(factors) == 1 else sorted(factors, key=str),
            "all_to_all_ms_per_step": self.all_to_all_seconds / timed * 1e3 if timed else None,
            "all_to_all_timed_steps": timed,
            "all_to_all_timing": (
                "wall time of the dispatch and combine all-to-alls, forward and backward, on the last step of each "
                "logging interval, the device synchronised on either side of each; the maximum over ranks"
                if timed
                else "no all-to-all (no expert parallel)"
            ),
        }


def describe_routing(tallies: list[RouterTally]) -> str:
    """'2 MoE layers x 4 experts, dropless' or '..., capacity factor 1.25 per sequence: tokens over it dropped'."""
    return _described(len(tallies), tallies[0].n_experts, [t.capacity_factor for t in tallies])


def _described(layers: int, experts: int, capacity_factors: list[float | None]) -> str:
    factors = sorted(set(capacity_factors), key=str)
    text = f"{layers} MoE layer{'s' if layers != 1 else ''} x {experts} experts, "
    if factors == [None]:
        return text + "dropless"
    return text + f"capacity factor {', '.join(map(str, factors))} per sequence: tokens over it dropped"


def _figures(counts: torch.Tensor) -> dict[str, Any]:
    """(layers, experts + 1) counts -> tokens per expert, imbalance per layer, the share dropped."""
    routed, dropped = counts[:, :-1], counts[:, -1]
    total = routed.sum(dim=1).clamp_min(1)
    mean = total.double() / routed.size(1)
    imbalance = (routed.max(dim=1).values.double() / mean).tolist()
    return {
        "router_tokens_per_expert": routed.tolist(),
        "router_imbalance": imbalance,
        "router_max_imbalance": max(imbalance) if imbalance else None,
        "router_dropped_fraction": dropped.sum().item() / total.sum().item(),
    }


def router_metrics(model: torch.nn.Module, device: torch.device, counts: bool) -> RouterMetrics | None:
    """The collector of `model`'s routers, or None for a model without any. Collective where
    `model` is a rank's pipeline stages: every rank learns every stage's MoE layers."""
    named = named_router_tallies(model)
    tallies = [tally for _, tally in named]
    if not isinstance(model, RankStages):
        return RouterMetrics(tallies, device, counts) if tallies else None
    mine = [MoELayer(name, t.n_experts, t.capacity_factor) for name, t in named]
    gathered: list[list[MoELayer]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    layers = sorted({layer for held in gathered for layer in held}, key=lambda layer: _in_order(layer.name))
    if not layers:
        return None
    rows = [layers.index(layer) for layer in mine]
    return RouterMetrics(tallies, device, counts, layers, rows)


def _in_order(name: str) -> list[tuple[int, int | str]]:
    """A module name's sort key in module order: 'blocks.10' after 'blocks.9'."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part]
