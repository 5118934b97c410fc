"""The layouts a search plans (`runner.py plan search=true`): for each strategy the sizes its
layout takes (tp_size for a tensor-parallel one, shard_size for hybrid sharding,
zero_hpz_partition_size for hpZ), and for each layout every micro-batch and accumulation that
makes the global batch over its data-parallel ranks, under each activation checkpointing mode.

A size the user fixed in strategy_options is kept; a size of 1 is left to the plain strategy
(fsdp-tp at tp 1 is fsdp, hsdp with one replica is fsdp), so no layout is planned twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from harness.plan.backends import Backend
from harness.plan.model_shape import PlanError

TOKEN_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}  # 4M tokens: 4,194,304, as runs state it


@dataclass(frozen=True)
class BatchSplit:
    micro_batch: int  # sequences per data-parallel rank per micro-step
    grad_accum: int  # micro-steps per optimizer step


def parse_tokens(value: Any) -> int:
    """A token count as given: 4194304, 4M, 512K (binary prefixes, as published batch sizes mean them)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
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
    if fixed.get(option) not in (None, 0, "auto"):
        return [fixed[option]]
    return [c for c in choices if c > 1]


def layout_options(backend: Backend, gpus: int, per_node: int, fixed: dict[str, Any]) -> Iterator[dict[str, int]]:
    """The layout sizes `backend` can take on `gpus` GPUs, as strategy options; layout.py decides
    which of them the model and the cluster allow."""
    tps = _sizes(fixed, "tp_size", divisors(gpus)) if backend.tensor_parallel else [1]
    for tp in tps:
        sizes: dict[str, int] = {"tp_size": tp} if backend.tensor_parallel else {}
        shards = _sizes(fixed, "shard_size", divisors(gpus // tp)[:-1]) if backend.hybrid_shard else [0]
        hpzs = (
            _sizes(fixed, "zero_hpz_partition_size", divisors(min(per_node, gpus)))
            if backend.secondary_partition
            else [0]
        )
        for shard in shards:
            for hpz in hpzs:
                yield (
                    sizes | ({"shard_size": shard} if shard else {}) | ({"zero_hpz_partition_size": hpz} if hpz else {})
                )


def batch_splits(global_batch: int, data_parallel: int) -> list[BatchSplit]:
    """Every micro-batch and accumulation that makes `global_batch` sequences over
    `data_parallel` ranks, largest micro-batch first; none where the batch does not divide."""
    per_rank, rem = divmod(global_batch, data_parallel)
    if rem or not per_rank:
        return []
    return [BatchSplit(m, per_rank // m) for m in reversed(divisors(per_rank))]
