"""The layouts a search plans (`runner.py plan search=true`): for each strategy the sizes its
layout takes (tp_size for a tensor-parallel one, shard_size for hybrid sharding,
zero_hpz_partition_size for hpZ, ep_size for an expert-parallel one on a mixture of experts), and for
each layout every micro-batch and accumulation that makes the global batch over its data-parallel
ranks, under each activation checkpointing mode.

A size the user fixed in strategy_options is kept; a size of 1 is left to the plain strategy
(fsdp-tp at tp 1 is fsdp, hsdp with one replica is fsdp), so no layout is planned twice; but a
strategy whose mesh names no tp (fsdp-ep, ddp-ep) is its own layout at tp 1, searched there too.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from harness.common.numbers import is_whole
from harness.plan.model.model_shape import PlanError
from harness.plan.parallel.backends import UNSET_SIZES, Backend
from harness.plan.parallel.layout import pipelines, sizes_tp_itself, splits_model
from models.sequence_split import sequence_split_error
from strategies.parallel_dims import DEFAULT_CP_ATTENTION

# Pipeline stages searched at most (deeper pipelines need more micro-batches than a batch gives), and
# the sequence length from which context parallelism is searched (below it, a sequence's activations
# fit a GPU at micro-batch 1 for the models the planner knows); the schedules searched unless one is asked.
MAX_PIPELINE_STAGES = 16
LONG_SEQUENCE = 16384
SEARCHED_SCHEDULES = ("1f1b", "interleaved-1f1b")
# Sequences in each pipeline micro-batch searched: more micro-batches shrink the bubble, larger ones
# run their matmuls faster; Megatron-LM's published layouts run 1 to 4 (its sc21 and NeMo tables).
PIPELINE_MICRO_BATCHES = (1, 2, 4, 8)
TOKEN_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}  # 4M tokens: 4,194,304, as runs state it


@dataclass(frozen=True)
class BatchSplit:
    micro_batch: int  # sequences per data-parallel rank per micro-step
    grad_accum: int  # micro-steps per optimizer step


def parse_tokens(value: Any) -> int:
    """A token count as given: 4194304, 4M, 512K (binary prefixes, as published batch sizes mean them)."""
    if is_whole(value):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)\s*", str(value), re.IGNORECASE)
    count = float(match.group(1)) * TOKEN_SUFFIXES[match.group(2).upper()] if match else 0
    if not count or count != int(count):
        raise PlanError(f"global_batch_tokens={value!r} is not a whole number of tokens: give e.g. 4194304, 4M or 512K")
    return int(count)


def sequences_in(tokens: int, seq_len: int) -> int:
    """The global batch in sequences of `seq_len` tokens; a count that is not whole is a one-line error."""
    sequences, rem = divmod(tokens, seq_len)
    if rem or not sequences:
        below, above = sequences * seq_len, (sequences + 1) * seq_len
        nearest = f"{below:,} or {above:,}" if sequences else f"{above:,}"
        raise PlanError(
            f"global_batch_tokens={tokens:,} is not a whole number of sequences of seq_len={seq_len}: use {nearest}"
        )
    return sequences


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _sizes(fixed: dict[str, Any], option: str, choices: list[int]) -> list[int]:
    """The sizes searched for one option: the user's where fixed, else `choices` above 1."""
    if fixed.get(option) not in UNSET_SIZES:
        return [fixed[option]]
    return [c for c in choices if c > 1]


def _split_sizes(
    backend: Backend,
    ranks: int,
    fixed: dict[str, Any],
    layers: int | None,
    seq_len: int | None,
    takes: Collection[str],
) -> list[dict[str, Any]]:
    """Pipeline and context-parallel sizes (with the schedules searched) over `ranks` GPUs, for a
    strategy that takes them (layout.pipelines, layout.splits_model): pp up to MAX_PIPELINE_STAGES and
    the model's blocks, each with SEARCHED_SCHEDULES (its micro-batches are pipeline_splits'), cp
    where the sequence is LONG_SEQUENCE tokens or more and splits evenly; [{}] for none."""
    if not pipelines(backend) or layers is None or seq_len is None:
        return [{}]
    stages = _sizes(fixed, "pp_size", divisors(ranks)) if "pp_size" in takes else []
    pps = [1] + [p for p in stages if p <= min(layers, MAX_PIPELINE_STAGES)]
    long = seq_len >= LONG_SEQUENCE and splits_model(backend) and "cp_size" in takes
    attention = str(fixed.get("cp_attention") or DEFAULT_CP_ATTENTION)
    cps = [1] + [
        c
        for c in _sizes(fixed, "cp_size", divisors(ranks) if long else [])
        if sequence_split_error(seq_len, c, attention) is None
    ]
    schedules = [fixed["schedule"]] if fixed.get("schedule") else list(SEARCHED_SCHEDULES)
    out: list[dict[str, Any]] = []
    for pp in pps:
        for cp in cps:
            if ranks % (pp * cp):
                continue
            split = ({"pp_size": pp} if pp > 1 else {}) | ({"cp_size": cp} if cp > 1 else {})
            if pp == 1:
                out.append(split)
                continue
            # A schedule only where the strategy takes one (zero1-pp's is fixed by its name: it would be refused).
            named = [{"schedule": s} for s in schedules] if "schedule" in takes else [{}]
            out += [split | schedule for schedule in named]
    return out


def pipeline_splits(
    global_batch: int, data_parallel: int, stages: int, schedule: str, fixed: int | None = None
) -> list[tuple[BatchSplit, int]]:
    """How a pipelined layout makes `global_batch` sequences over `data_parallel` ranks: each rank's
    whole share in one schedule a step (Megatron-LM's: the accumulation is the pipeline's
    micro-batches, one flush a step), in micro-batches of PIPELINE_MICRO_BATCHES sequences where
    that makes at least as many as the stages (a multiple of them for the looped schedules);
    `fixed` micro-batches where the user gave them."""
    per_rank, rem = divmod(global_batch, data_parallel)
    if rem or not per_rank:
        return []
    looped = schedule in ("interleaved-1f1b", "zero-bubble")
    sizes = [per_rank // fixed] if fixed else [b for b in PIPELINE_MICRO_BATCHES if per_rank % b == 0]
    counts = [per_rank // b for b in sizes if per_rank // b >= stages and not (looped and (per_rank // b) % stages)]
    return [(BatchSplit(per_rank, 1), m) for m in counts if per_rank % m == 0]


def layout_options(
    backend: Backend,
    gpus: int,
    per_node: int,
    fixed: dict[str, Any],
    layers: int | None = None,
    seq_len: int | None = None,
    takes: Collection[str] = (),
    experts: int | None = None,
    per_domain: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The layout sizes `backend` can take on `gpus` GPUs (`per_node` a host, `per_domain` on one NVLink domain),
    as strategy options; layout.py decides
    which of them the model and the cluster allow. Only the options the strategy takes (`takes`:
    planned_options.takes, what `train` takes) are varied, so that every layout runs under its name.
    Given the model's blocks and the sequence length, pipeline stages and context-parallel GPUs too;
    given a mixture of experts' routed experts, an expert-parallel strategy's ep_size."""
    tensor_parallel = backend.tensor_parallel and "tp_size" in takes
    tps = _sizes(fixed, "tp_size", divisors(gpus)) if tensor_parallel else [1]
    if tensor_parallel and not sizes_tp_itself(backend) and fixed.get("tp_size") in UNSET_SIZES:
        # Its tp 1 is its own layout, not a plain strategy's (fsdp-ep and ddp-ep name no tp in their
        # meshes): searched without tp_size, as it runs by default.
        tps = [1, *tps]
    for tp in tps:
        given = tp > 1 or fixed.get("tp_size") not in UNSET_SIZES
        tp_option = {"tp_size": tp} if tensor_parallel and given else {}
        for split in _split_sizes(backend, gpus // tp, fixed, layers, seq_len, takes):
            ranks = gpus // (split.get("pp_size", 1))
            for ep in _expert_sizes(backend, ranks, fixed, experts, takes):
                hosts = (per_node, per_domain or per_node)
                yield from _sharded(backend, gpus, hosts, fixed, takes, tp_option | split | ep)


def _expert_sizes(
    backend: Backend, ranks: int, fixed: dict[str, Any], experts: int | None, takes: Collection[str]
) -> list[dict[str, Any]]:
    """An expert-parallel strategy's ep_size: the divisors of its data-parallel GPUs that divide the
    model's experts (expert_layout.py refuses the others), above 1 (ep 1 is the strategy's data-parallel
    engine alone); [{}] for a strategy without expert parallel or a dense model."""
    if not backend.expert_parallel or "ep_size" not in takes or not experts:
        return [{}]
    return [{"ep_size": ep} for ep in _sizes(fixed, "ep_size", [d for d in divisors(ranks) if experts % d == 0])]


def _sharded(
    backend: Backend,
    gpus: int,
    hosts: tuple[int, int],
    fixed: dict[str, Any],
    takes: Collection[str],
    sizes: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """`sizes` with each hybrid shard group and hpZ group the strategy takes: hpZ's the divisors of a node's
    GPUs and, where an NVLink domain spans several nodes (a GB200 rack), the whole domain (`hosts`: the GPUs
    of a node and of a domain)."""
    hybrid = backend.hybrid_shard and "shard_size" in takes
    # Hybrid sharding's groups among the data-parallel ranks the split leaves (tp, pp and cp take theirs).
    ranks = gpus // (sizes.get("tp_size", 1) * sizes.get("pp_size", 1) * sizes.get("cp_size", 1))
    shards = _sizes(fixed, "shard_size", divisors(ranks)[:-1]) if hybrid else [0]
    hpzs = (
        _sizes(fixed, "zero_hpz_partition_size", _hpz_sizes(gpus, *hosts))
        if backend.secondary_partition and "zero_hpz_partition_size" in takes
        else [0]
    )
    for shard in shards:
        for hpz in hpzs:
            yield sizes | ({"shard_size": shard} if shard else {}) | ({"zero_hpz_partition_size": hpz} if hpz else {})


def _hpz_sizes(gpus: int, per_node: int, per_domain: int) -> list[int]:
    """hpZ groups searched: a node's divisors, and a whole NVLink domain wider than a node."""
    node = divisors(min(per_node, gpus))
    domain = min(per_domain, gpus)
    return node + [domain] if domain > node[-1] and gpus % domain == 0 else node


def batch_splits(global_batch: int, data_parallel: int) -> list[BatchSplit]:
    """Every micro-batch and accumulation that makes `global_batch` sequences over
    `data_parallel` ranks, largest micro-batch first; none where the batch does not divide."""
    per_rank, rem = divmod(global_batch, data_parallel)
    if rem or not per_rank:
        return []
    return [BatchSplit(m, per_rank // m) for m in reversed(divisors(per_rank))]
