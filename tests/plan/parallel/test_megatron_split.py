"""Megatron-LM's uneven pipeline splits in the plan: the embedding and the loss counted as layers
(get_num_layers_to_build in megatron/core/transformer/transformer_block.py), the first and last
stages' own counts, the runtime's cut for parabench's strategies, and what each does to the step:
every GPU waits on the slowest, which under these splits may hold no head."""

from __future__ import annotations

import pytest

from bench import plan_vs_published as published
from harness.plan.parallel.layout import LayoutError
from harness.plan.parallel.pipeline_context import published_layout
from harness.plan.parallel.pipeline_cost import Pipeline, StageSplit, megatron_split, stage_split
from models.stage_split import blocks_per_stage
from tests.plan.test_published import _megatron_row

BOTH = {"embedding_in_pipeline_split": True, "loss_in_pipeline_split": True}


def _pipe(stages: int, virtual: int = 1) -> Pipeline:
    schedule = "interleaved-1f1b" if virtual > 1 else "1f1b"
    return Pipeline(stages, stages * 4, schedule, virtual)


@pytest.mark.parametrize(
    ("layers", "stages", "virtual", "split"),
    [
        (126, 16, 8, StageSplit(7, 8, 7)),  # Llama 3.1 405B, Megatron-Bridge's GB200 layout: 128 / 128 chunks
        (126, 8, 8, StageSplit(15, 16, 15)),  # NeMo's H100 layout
        (30, 4, 8, StageSplit(7, 8, 7)),  # dgxc-benchmarking's 30-layer proxy
        (126, 2, 1, StageSplit(63, 0, 63)),  # two stages: none between
    ],
)
def test_embedding_and_loss_count_as_a_layer_each(layers: int, stages: int, virtual: int, split: StageSplit) -> None:
    assert megatron_split(layers, _pipe(stages, virtual), BOTH) == split


def test_megatron_refuses_what_does_not_divide_in_its_words() -> None:
    with pytest.raises(LayoutError, match=r"126 blocks with the embedding counted as layers \(127\)"):
        megatron_split(126, _pipe(16, 8), {"embedding_in_pipeline_split": True})  # 127 over 16
    with pytest.raises(LayoutError, match="more stages than the 126 blocks"):
        stage_split(126, _pipe(16, 8), {}, runtime_cut=False)  # no split named: 128 chunks, 126 blocks
    with pytest.raises(LayoutError, match="do not divide over the 6 stages between"):
        megatron_split(126, _pipe(8), {"first_pipeline_layers": 14, "last_pipeline_layers": 14})
    with pytest.raises(LayoutError, match="Megatron-LM takes one or the other"):
        megatron_split(126, _pipe(8), {**BOTH, "first_pipeline_layers": 15})


def test_first_and_last_stages_given_their_own_blocks() -> None:
    assert megatron_split(126, _pipe(8), {"first_pipeline_layers": 15, "last_pipeline_layers": 15}) == StageSplit(
        15, 16, 15
    )
    assert megatron_split(126, _pipe(8, 2), {"last_pipeline_layers": 14}) == StageSplit(16, 16, 14)
    with pytest.raises(LayoutError, match="do not divide into 2 virtual stages"):
        megatron_split(98, _pipe(8, 2), {"first_pipeline_layers": 7, "last_pipeline_layers": 7})


def test_the_runtime_cut_is_the_runtimes() -> None:
    """parabench's runtime cuts pp x v stages as models/stage_split.py does, rank r holding r, r + pp, ..."""
    pipe = _pipe(16, 2)
    counts = [len(r) for r in blocks_per_stage(126, 32)]
    held = [counts[r] + counts[r + 16] for r in range(16)]
    split = stage_split(126, pipe, {}, runtime_cut=True)
    assert split == StageSplit(held[0], max(held[1:-1]), held[-1]) == StageSplit(8, 8, 7)
    assert stage_split(126, pipe, {}, runtime_cut=False) == StageSplit(8, 8, 8)  # not known: every GPU the fullest


def test_published_words_become_the_split() -> None:
    _, options = published_layout(
        "megatron tp=4 pp=16 vp=8 dp=4 embedding_in_pipeline_split loss_in_pipeline_split distributed_optimizer", True
    )
    assert options["embedding_in_pipeline_split"] and options["loss_in_pipeline_split"]
    _, options = published_layout("megatron tp=4 pp=8 dp=4 first_pipeline_layers=15 distributed_optimizer", True)
    assert options["first_pipeline_layers"] == 15 and "loss_in_pipeline_split" not in options


def _planned(sharding: str, **extra: str):
    row = _megatron_row(sharding, n_layers="62", gpus="32", nodes="4", micro_batch="1", grad_accum="16", **extra)
    _, plan, skipped = published.question(row)
    assert skipped is None and plan is not None and plan.time is not None
    return plan


def test_a_gpu_between_without_the_head_sets_the_pace() -> None:
    """62 blocks over 4 stages: split evenly as far as known, the fullest GPU holds 16 blocks with the
    head; with the embedding and loss counted (64 / 4) the GPUs between hold 16 and the last 15 with
    the head. The last computes more (its head, about one and a half blocks here, beyond one block)
    but each block's tensor-parallel exchanges (tp 8) make the GPUs between the slowest, so the step
    computes 16 blocks and no head: less compute, and a lower peak, the first GPU holding 15 blocks
    beside the embedding where it held 16."""
    plain = _planned("megatron tp=8 pp=4 dp=1 distributed_optimizer")
    counted = _planned(
        "megatron tp=8 pp=4 dp=1 embedding_in_pipeline_split loss_in_pipeline_split distributed_optimizer"
    )
    assert counted.time.compute_s < plain.time.compute_s
    assert counted.time.imbalance_s < plain.time.imbalance_s
    assert counted.time.tokens_per_s > plain.time.tokens_per_s
    assert counted.peak_bytes < plain.peak_bytes  # the first GPU's peak: one block fewer beside its table
    # What the plain plan computes beyond the counted one is its head, between one block's and two.
    head_share = (plain.time.compute_s - counted.time.compute_s) / plain.time.compute_s
    assert 1 / 17 < head_share < 2 / 18
