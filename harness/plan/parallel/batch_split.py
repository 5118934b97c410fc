"""A global batch (`batch_size=`, in sequences) split over a layout's data-parallel ranks into a
micro-batch and micro-steps of accumulation: a tensor-parallel group shares one micro-batch, so a
layout splits the batch over gpus / tp ranks, not over every GPU. A what-if on another GPU count
keeps the global batch and chooses a micro-batch that divides its ranks' share."""

from __future__ import annotations

from harness.plan.parallel.layout import LayoutError


def _ranks(ranks: int, tp: int) -> str:
    return f"{ranks} data-parallel rank{'s' if ranks > 1 else ''}" + (f" (gpus / tp_size {tp})" if tp > 1 else "")


class BatchSplitError(LayoutError):
    """A global batch that does not split over a layout's `ranks` data-parallel ranks: a batch of
    `ranks` sequences would, which an error where no layout takes the batch can say."""

    def __init__(self, message: str, ranks: int) -> None:
        super().__init__(message)
        self.ranks = ranks


def _per_rank(global_batch: int, ranks: int, tp: int = 1) -> int:
    per_rank, rem = divmod(global_batch, ranks)
    if rem or per_rank == 0:
        raise BatchSplitError(
            f"batch_size={global_batch} does not divide over {_ranks(ranks, tp)}: "
            f"choose a batch_size that is a multiple of {ranks}",
            ranks,
        )
    return per_rank


def split(global_batch: int, ranks: int, micro_batch: int | None, tp: int = 1) -> tuple[int, int]:
    """(micro-batch, accumulation) of `global_batch` over `ranks` data-parallel ranks (of a layout
    with tensor parallelism over `tp`): `micro_batch` sequences per micro-step where given, else
    each rank's whole share at once."""
    per_rank = _per_rank(global_batch, ranks, tp)
    if micro_batch is None:
        return per_rank, 1
    accumulation, rem = divmod(per_rank, micro_batch)
    if rem or accumulation == 0:
        raise LayoutError(
            f"micro_batch={micro_batch} does not divide the {per_rank} sequences per data-parallel rank "
            f"(batch_size={global_batch} over {_ranks(ranks, tp)}): choose a micro_batch that divides {per_rank}"
        )
    return micro_batch, accumulation


def nearest_split(global_batch: int, ranks: int, micro_batch: int, tp: int = 1) -> tuple[int, int]:
    """The split a what-if can make on `ranks` ranks: `micro_batch` where it divides each rank's
    share, else the largest micro-batch below it that does (never more memory than asked)."""
    per_rank = _per_rank(global_batch, ranks, tp)
    micro = max(m for m in range(1, min(micro_batch, per_rank) + 1) if per_rank % m == 0)
    return micro, per_rank // micro


def widest_split(global_batch: int, gpus: int, micro_batch: int | None) -> tuple[int, int]:
    """The split the question states before any layout: over every GPU as a data-parallel rank
    where the batch divides so, else over the most ranks it divides over (tensor parallelism
    takes the rest); only a batch no layout can split is an error."""
    ranks = [r for r in range(gpus, 0, -1) if gpus % r == 0]
    for r in ranks[:-1]:
        try:
            return split(global_batch, r, micro_batch)
        except LayoutError:
            continue
    return split(global_batch, 1, micro_batch)
