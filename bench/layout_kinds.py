"""A published run's parallel degrees, its layout kinds, its scale and its step, read from its CSV row
(bench/data/README.md's columns), for bench/plan_vs_published.py's breakdowns.

The kinds and scales are the planner's (harness/plan/published_accuracy.py, which quotes the
report's figures for them beside a recommendation): they overlap, and a node is the NVLink domain
where the card's spans several hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.common.hardware import gpu_spec
from harness.plan.published_accuracy import layout_kinds, scale_of_nodes


@dataclass(frozen=True)
class Degrees:
    """How many GPUs a run splits each thing over (1 where its sharding names no such degree)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1


def degrees(sharding: str) -> Degrees:
    """The tp=, pp=, cp=, ep= of a sharding in either grammar of bench/data/README.md
    (`megatron tp=8 pp=4 dp=16 ...`, `FSDP2 dp_shard=32 tp=8 pp=8`)."""
    found = {key: int(value) for key, value in re.findall(r"\b(tp|pp|cp|ep)=(\d+)", sharding)}
    return Degrees(**found)


def layer_slots(n_layers: int, pp: int, grad_accum: int) -> int | None:
    """Layer forward-and-backward passes one GPU's step takes the time of under a plain (1F1B or
    all-forward-all-backward) pipeline: its stage's layers times (micro-batches + stages - 1), the
    fill and drain included; a stage's layers times its accumulation without one. None where the
    stages cannot split the layers evenly."""
    if n_layers % pp:
        return None
    return n_layers // pp * (grad_accum + pp - 1)


def step_seconds(row: dict[str, str], tokens_per_s_gpu: float) -> float:
    """Seconds one step of the run takes at `tokens_per_s_gpu`: its global batch's tokens over every GPU's rate."""
    return int(row["global_batch"]) * int(row["seq_len"]) / (tokens_per_s_gpu * int(row["gpus"]))


def gpus_per_node(row: dict[str, str]) -> int:
    return max(1, int(row["gpus"]) // max(1, int(row["nodes"] or 1)))


def nvlink_domain(row: dict[str, str]) -> int:
    """GPUs a tensor-parallel group can span on NVLink: the card's rack where it has one, else a node's."""
    spec, per_node = gpu_spec(row["gpu"]), gpus_per_node(row)
    if spec is None or spec.scale_up != "nvswitch" or spec.nvlink_domain <= max(per_node, spec.gpus_per_host):
        return per_node
    return min(spec.nvlink_domain, int(row["gpus"]))


def kinds_of(row: dict[str, str]) -> tuple[str, ...]:
    """The kinds a row's layout belongs to, in KINDS' order."""
    d = degrees(row["sharding"])
    return layout_kinds(d.tp, d.pp, d.cp, nvlink_domain(row))


def scale_of(row: dict[str, str]) -> str:
    return scale_of_nodes(int(row["nodes"] or 1))
