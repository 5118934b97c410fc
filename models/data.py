"""Data sets and the global-batch schedule that makes runs comparable.

Two data sets, both indexable by sample number into (T+1)-token sequences:
- `MarkovData`: a seeded sparse random Markov chain. Its entropy rate is the lowest
  loss any model can reach, so every loss curve has a known floor.
- `TokenFileData`: a nanoGPT-style file of uint16 tokens, memory-mapped.

`GlobalBatchSchedule` decides which samples step k uses: the same global batch
whatever the world size, micro-batch or accumulation, reshuffled every epoch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


class DataError(ValueError):
    """A data set that cannot be used (one line, says what to do)."""


class MarkovData:
    """Sequences from a random Markov chain in which each token has `fanout` successors.

    Sparse, so a 50k-token vocabulary costs megabytes, not a dense V x V matrix.
    Chains start in the stationary distribution, so every position's next token
    has exactly the chain's entropy rate: `loss_floor`, in nats.
    """

    def __init__(
        self, vocab_size: int, seq_len: int, num_samples: int, seed: int, fanout: int = 4, concentration: float = 0.5
    ):
        rng = np.random.default_rng([seed, vocab_size, 0x4D41524B])
        fanout = min(fanout, vocab_size)
        self.successors = np.stack([rng.choice(vocab_size, size=fanout, replace=False) for _ in range(vocab_size)])
        self.probs = rng.dirichlet(np.full(fanout, concentration), size=vocab_size)
        self.stationary = self._stationary(vocab_size)
        row_entropy = -(self.probs * np.log(np.clip(self.probs, 1e-300, None))).sum(axis=1)
        self.loss_floor = float((self.stationary * row_entropy).sum())
        self.tokens = self._sample(rng, num_samples, seq_len + 1)
        self.seq_len = seq_len

    def _stationary(self, vocab_size: int) -> np.ndarray:
        # Power iteration on the sparse transition matrix, lazily mixed (x+Px)/2 so it
        # converges even where the chain is periodic.
        pi = np.full(vocab_size, 1.0 / vocab_size)
        for _ in range(10_000):
            nxt = np.bincount(self.successors.ravel(), weights=(pi[:, None] * self.probs).ravel(), minlength=vocab_size)
            nxt = 0.5 * (pi + nxt)
            if np.abs(nxt - pi).sum() < 1e-12:
                return nxt / nxt.sum()
            pi = nxt
        return pi / pi.sum()

    def _sample(self, rng: np.random.Generator, n: int, length: int) -> np.ndarray:
        out = np.empty((n, length), dtype=np.int64)
        out[:, 0] = rng.choice(len(self.stationary), size=n, p=self.stationary)
        cdf = np.cumsum(self.probs, axis=1)
        cdf[:, -1] = 1.0
        for t in range(1, length):
            u = rng.random(n)
            choice = (u[:, None] > cdf[out[:, t - 1]]).sum(axis=1)
            out[:, t] = self.successors[out[:, t - 1], choice]
        return out

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, indices: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.tokens[indices])


class TokenFileData:
    """Non-overlapping (T+1)-token windows of a uint16 token file (nanoGPT's train.bin)."""

    def __init__(self, path: str, seq_len: int, vocab_size: int | None = None):
        file = Path(path)
        if file.is_dir():  # nanoGPT's prepare.py writes train.bin and val.bin into the data set's folder
            raise DataError(f"data file {path!r} is a folder: give the .bin file inside it")
        if not file.is_file():
            raise DataError(f"data file {path!r} not found: give a nanoGPT-style uint16 .bin file or data=markov")
        if file.stat().st_size == 0:  # numpy cannot map an empty file, and says so without naming it
            raise DataError(f"data file {path!r} is empty: give a nanoGPT-style uint16 .bin file or data=markov")
        if file.stat().st_size % 2:
            raise DataError(f"data file {path!r} has an odd number of bytes: it is not a uint16 token file")
        self.tokens = np.memmap(file, dtype=np.uint16, mode="r")
        self.seq_len = seq_len
        self.num_windows = (len(self.tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise DataError(f"data file {path!r} holds {len(self.tokens)} tokens, fewer than seq_len+1={seq_len + 1}")
        if vocab_size is not None:
            top = int(self.tokens.max())
            if top >= vocab_size:
                raise DataError(
                    f"data file {path!r} has token id {top}, outside the model's vocabulary of {vocab_size}: give "
                    f"model_kwargs.vocab_size={top + 1} or more (a zoo model; a model of your own its own setting), "
                    "or the data tokenized for this model"
                )
        self.loss_floor = None

    def __len__(self) -> int:
        return self.num_windows

    def batch(self, indices: np.ndarray) -> torch.Tensor:
        starts = np.asarray(indices) * self.seq_len
        rows = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        return torch.from_numpy(rows)


def load_data(spec: str, *, vocab_size: int | None, seq_len: int, num_samples: int, seed: int):
    if spec == "markov":
        if vocab_size is None:
            raise DataError("data=markov needs the model's vocabulary: give the model a `vocab_size` attribute")
        return MarkovData(vocab_size, seq_len, num_samples, seed)
    return TokenFileData(spec, seq_len, vocab_size)


@dataclass(frozen=True)
class GlobalBatchSchedule:
    """Which samples each rank reads at each step and micro-step.

    Step k's global batch is `batch_size` samples of the epoch's permutation; it is
    laid out as [grad_accum, world_size, micro_batch] so any world size / accumulation
    covers exactly the same samples. Epoch e uses the permutation seeded by (seed, e).
    """

    num_samples: int
    batch_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.num_samples < self.batch_size:
            raise DataError(
                f"the data set holds {self.num_samples} sequences, fewer than batch_size={self.batch_size}: "
                "use more data (data_samples=) or a smaller batch"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def global_indices(self, step: int) -> np.ndarray:
        perm = _epoch_permutation(self.num_samples, self.seed, self.epoch_of(step))
        start = (step % self.steps_per_epoch) * self.batch_size
        return perm[start : start + self.batch_size]

    def micro_indices(self, step: int, micro_step: int, rank: int, world_size: int, micro_batch: int) -> np.ndarray:
        grad_accum = self.batch_size // (world_size * micro_batch)
        if grad_accum * world_size * micro_batch != self.batch_size or not 0 <= micro_step < grad_accum:
            raise ValueError(f"micro layout {world_size}x{micro_batch} does not tile batch_size={self.batch_size}")
        layout = self.global_indices(step).reshape(grad_accum, world_size, micro_batch)
        return layout[micro_step, rank]


@functools.lru_cache(maxsize=2)
def _epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    # Cached: a token file of millions of windows would otherwise be reshuffled every micro-step.
    perm = np.random.default_rng([seed, epoch]).permutation(num_samples)
    perm.flags.writeable = False
    return perm


def split_inputs_targets(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rows[:, :-1], rows[:, 1:]


def uniform_loss(vocab_size: int) -> float:
    """The loss of a model that has learnt nothing: ln(V)."""
    return math.log(vocab_size)
