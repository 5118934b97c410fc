"""nanotron's cut of a model into pipeline stages in the plan: blocks weighed by nanotron's own
estimate of their compute, each rank's share ending where the running weight passes it
(huggingface/nanotron nouamane/bench2 @ 67c5ebb6a925, models/base.py build_model), and what that
does to a published nanotron run's step: a heavy head gets a GPU of its own instead of sitting beside
as many blocks as the others."""

from __future__ import annotations

import pytest

from bench import plan_vs_published as published
from harness.plan.model.model_shape import TransformerDims
from harness.plan.parallel.nanotron_split import nanotron_split, nanotron_stage_blocks
from harness.plan.parallel.pipeline_cost import StageSplit
from tests.plan.test_published import _megatron_row

# The Ultra-Scale Playbook's 1B: a decoder layer weighs 4 x 32 x 64 x 2048 + 3 x 8192 x 2048
# (67.1M), the head 131072 x 2048 (268.4M): four layers.
PLAYBOOK_1B = TransformerDims(
    layers=16, width=2048, heads=32, head_dim=64, kv_heads=32, ffn_width=8192, vocab=131072, gated_mlp=True
)


@pytest.mark.parametrize(
    ("stages", "blocks", "head_rank"),
    [
        # 20 layers' weight over 8 ranks, 2.5 each: rank 0 takes layers 1-3 (3 passes 2.5), rank 1
        # layers 4-6 (5 is not past 5), rank 2 layers 7-8, and so on; the head goes alone to rank 6,
        # whose share (17.5) the head's weight passes, and the loss to rank 7.
        (8, [3, 3, 2, 3, 2, 3, 0, 0], 6),
        (4, [6, 5, 5, 0], 3),  # 5 layers' weight each: the head alone on the last rank
        (2, [11, 5], 1),  # 10 each: the eleventh layer passes rank 0's share
    ],
)
def test_each_rank_takes_blocks_until_its_running_weight_passes_its_share(stages, blocks, head_rank):
    assert nanotron_stage_blocks(PLAYBOOK_1B, stages) == (blocks, head_rank)


def test_the_plans_last_gpu_is_the_heads_and_the_loss_only_ranks_are_left_out():
    assert nanotron_split(PLAYBOOK_1B, 8) == StageSplit(first=3, middle=3, last=0)


def test_a_light_head_sits_beside_blocks_like_an_even_cut():
    small_vocab = TransformerDims(
        layers=24, width=4096, heads=32, head_dim=128, kv_heads=32, ffn_width=11008, vocab=32000
    )
    blocks, head_rank = nanotron_stage_blocks(small_vocab, 4)
    assert head_rank == 3 and sum(blocks) == 24 and blocks[-1] >= 5


def test_a_nanotron_pipeline_is_planned_faster_than_every_gpu_holding_the_fullest_share_and_the_head():
    # The same published run, nanotron's engine named or not: with a 1B's heavy head, nanotron's cut
    # leaves the head a GPU of its own where an unknown split plans it beside two blocks.
    shape = dict(model="nanotron-1b", arch="llama", n_layers="16", d_model="2048", n_heads="32", kv_heads="32")
    shape |= dict(ffn="8192", vocab="131072", seq_len="4096", micro_batch="1", grad_accum="256", gpus="8")
    nanotron = published.question(_megatron_row("megatron tp=1 pp=8 dp=1 ddp nanotron", **shape))[1]
    unknown = published.question(_megatron_row("megatron tp=1 pp=8 dp=1 ddp", **shape))[1]
    assert nanotron.time.imbalance_s < unknown.time.imbalance_s
    assert nanotron.time.compute_s < unknown.time.compute_s
