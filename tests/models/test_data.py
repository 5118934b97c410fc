"""Data invariants: the global batch of a step does not depend on how it is split."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.data import DataError, GlobalBatchSchedule, MarkovData, TokenFileData, load_data


@pytest.mark.parametrize("world, micro", [(1, 16), (2, 8), (2, 2), (4, 1), (4, 4)])
def test_every_split_covers_exactly_the_global_batch(world, micro):
    schedule = GlobalBatchSchedule(num_samples=200, batch_size=16, seed=3)
    accum = 16 // (world * micro)
    for step in (0, 5, 12, 13):
        parts = [schedule.micro_indices(step, m, r, world, micro) for m in range(accum) for r in range(world)]
        assert sorted(np.concatenate(parts).tolist()) == sorted(schedule.global_indices(step).tolist())


def test_epochs_reshuffle_and_cover_the_data_once():
    schedule = GlobalBatchSchedule(num_samples=64, batch_size=16, seed=0)
    epoch0 = np.concatenate([schedule.global_indices(s) for s in range(4)])
    epoch1 = np.concatenate([schedule.global_indices(s) for s in range(4, 8)])
    assert sorted(epoch0.tolist()) == list(range(64)) == sorted(epoch1.tolist())
    assert not np.array_equal(epoch0, epoch1)


def test_schedule_is_a_pure_function_of_seed_and_step():
    a, b = GlobalBatchSchedule(100, 10, seed=1), GlobalBatchSchedule(100, 10, seed=1)
    assert np.array_equal(a.global_indices(7), b.global_indices(7))
    assert not np.array_equal(a.global_indices(7), GlobalBatchSchedule(100, 10, seed=2).global_indices(7))


def test_markov_floor_is_the_entropy_rate():
    data = MarkovData(vocab_size=32, seq_len=16, num_samples=4000, seed=0)
    assert 0 < data.loss_floor < math.log(32)
    # The empirical conditional entropy of the sampled transitions approaches the floor.
    pairs = np.stack([data.tokens[:, :-1].ravel(), data.tokens[:, 1:].ravel()], axis=1)
    counts = np.zeros((32, 32))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    p = counts / counts.sum(axis=1, keepdims=True).clip(min=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        row_entropy = -np.nansum(np.where(p > 0, p * np.log(p), 0), axis=1)
    empirical = float((counts.sum(axis=1) / counts.sum() * row_entropy).sum())
    assert empirical == pytest.approx(data.loss_floor, rel=0.02)


def test_markov_is_deterministic_per_seed():
    a = MarkovData(64, 8, 10, seed=5)
    assert np.array_equal(a.tokens, MarkovData(64, 8, 10, seed=5).tokens)
    assert not np.array_equal(a.tokens, MarkovData(64, 8, 10, seed=6).tokens)


def test_token_file_windows(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    data = TokenFileData(str(path), seq_len=10)
    assert len(data) == 99
    rows = data.batch(np.array([0, 3]))
    assert rows.dtype == torch.int64 and rows.shape == (2, 11)
    assert rows[1, 0].item() == 30 and rows[1, -1].item() == 40


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "not found"),
        (b"", "is empty: give a nanoGPT-style uint16 .bin file or data=markov"),
        (b"\x01", "odd number of bytes"),
        (b"\x01\x00" * 3, "fewer than"),
    ],
)
def test_bad_token_files_are_clear(tmp_path, content, expected):
    path = tmp_path / "x.bin"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=expected):
        load_data(str(path), vocab_size=None, seq_len=8, num_samples=0, seed=0)


def test_a_folder_given_as_the_data_file_says_so(tmp_path):
    """nanoGPT's prepare.py leaves train.bin and val.bin in the data set's folder: the folder is no file."""
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
    with pytest.raises(DataError, match="is a folder: give the .bin file inside it"):
        load_data(str(tmp_path), vocab_size=None, seq_len=8, num_samples=0, seed=0)


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    path = tmp_path / "x.bin"
    np.array([1, 2, 300, 4, 5], dtype=np.uint16).tofile(path)
    says = "outside the model's vocabulary of 128: give model_kwargs.vocab_size=301 or more"
    with pytest.raises(DataError, match=says):
        TokenFileData(str(path), seq_len=2, vocab_size=128)


def test_too_little_data_for_one_batch():
    with pytest.raises(DataError, match="fewer than batch_size"):
        GlobalBatchSchedule(num_samples=4, batch_size=8, seed=0)
