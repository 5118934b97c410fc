"""DeepSpeed's PipelineModule cut of a published Megatron-DeepSpeed GPT in the plan: the blocks
balanced by partition_balanced (deepspeed/runtime/utils.py @ v0.5.10), the parts filled in order up
to the smallest heaviest part, and what that does to the step: the slowest GPU is a full one
between, not the last with its head, where the blocks do not divide evenly."""

from __future__ import annotations

import pytest

from bench import plan_vs_published as published
from harness.plan.parallel.layout import LayoutError
from harness.plan.parallel.pipeline_cost import Pipeline, StageSplit, deepspeed_split, stage_split
from tests.plan.test_published import _megatron_row


def _pipe(stages: int, virtual: int = 1) -> Pipeline:
    schedule = "interleaved-1f1b" if virtual > 1 else "1f1b"
    return Pipeline(stages, stages * 4, schedule, virtual)


@pytest.mark.parametrize(
    ("layers", "stages", "counted", "split"),
    [
        (78, 12, False, StageSplit(7, 7, 1)),  # BLOOM's trial: "the last stage has 1 block, the rest 7"
        (72, 12, False, StageSplit(6, 6, 6)),  # even: every GPU 6
        (94, 8, False, StageSplit(12, 12, 10)),
        (70, 12, True, StageSplit(5, 6, 5)),  # BLOOM-176B: 70 blocks and the two embeddings over 12
        (100, 6, True, StageSplit(16, 17, 16)),
        (24, 2, False, StageSplit(12, 0, 12)),
    ],
)
def test_the_blocks_fill_the_parts_in_order_up_to_the_smallest_heaviest(layers, stages, counted, split):
    assert deepspeed_split(layers, _pipe(stages), counted) == split
    options = {"embedding_in_pipeline_split": True} if counted else {}
    assert stage_split(layers, _pipe(stages), options, runtime_cut=False, deepspeed_cut=True) == split


def test_deepspeeds_engine_runs_no_virtual_stages():
    with pytest.raises(LayoutError, match="one stage a GPU"):
        deepspeed_split(72, _pipe(4, 2), counted=False)


def test_the_slowest_gpu_is_a_full_one_between_not_the_last_with_its_head():
    # 26 blocks over 4 stages: DeepSpeed's 7, 7, 7, 5 leaves the head on the lightest GPU, where
    # Megatron-LM's engine with no split named is planned as every GPU the fullest, the last with the head.
    sharding = "megatron tp=2 pp=4 dp=1 ddp zero=1"
    engine = published.question(_megatron_row(f"{sharding} deepspeed_pipeline", n_layers="26", grad_accum="8"))[1]
    unknown = published.question(_megatron_row(sharding, n_layers="26", grad_accum="8"))[1]
    assert engine.time.imbalance_s < unknown.time.imbalance_s
    assert engine.time.compute_s < unknown.time.compute_s
