"""How context parallel splits a sequence, without torch, so that the runtime
(models/context_parallel.py) and the planner (harness/plan/parallel/context_parallel_cost.py) refuse
the same lengths with the same words: all-to-all gives each rank one contiguous slice, the ring a
head and a tail chunk (its causal load balance), so 2 x cp_size chunks."""

from __future__ import annotations

CP_ATTENTIONS = ("all-to-all", "ring")


def sequence_chunks(cp_size: int, attention: str) -> int:
    """The equal chunks a sequence is cut into over cp_size ranks under `attention`."""
    return 2 * cp_size if attention == "ring" else cp_size


def sequence_split_error(seq_len: int, cp_size: int, attention: str) -> str | None:
    """Why `seq_len` does not split over cp_size ranks under `attention`, in one line; None where it does."""
    chunks = sequence_chunks(cp_size, attention)
    if seq_len % chunks == 0:
        return None
    what = f"2 x {cp_size} head-and-tail chunks" if attention == "ring" else f"cp_size={cp_size} slices"
    return f"seq_len={seq_len} does not split into {what}: use a seq_len that {chunks} divides"
