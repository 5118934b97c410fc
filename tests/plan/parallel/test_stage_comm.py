"""A pipeline's slowest GPU is its compute plus its own blocks' exchanges in each micro-batch's
critical path (stage_comm.py): the planned stage is the fullest GPU's, and a GPU with fewer blocks
runs fewer of each block's tensor-parallel collectives, while the embedding's and the head's run
once a micro-batch whatever the blocks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import plan_vs_published as published
from harness.plan.network.comm import TP_ROOT_CALLS, Collective
from harness.plan.network.expert_comm import DISPATCH_WHAT
from harness.plan.network.fabric import Group
from harness.plan.parallel.pipeline_context import BlockComm, _root_calls_left, _stage_work
from harness.plan.parallel.pipeline_cost import StageSplit
from harness.plan.parallel.stage_comm import block_share, root_recurring_s
from tests.plan.test_published import _megatron_row


def _plan(sharding: str):
    """A 62-block GPT with a 256k vocabulary on 32 H100s, tp 8 x pp 4, whose last GPU (14 blocks,
    the head and the loss) is the slowest."""
    row = _megatron_row(sharding, n_layers="62", vocab="256000", gpus="32", nodes="4", micro_batch="1", grad_accum="16")
    _, plan, skipped = published.question(row)
    assert skipped is None and plan is not None and plan.time is not None
    return plan


def test_the_slowest_last_gpu_is_charged_its_own_blocks_exchanges_not_the_fullest_gpus() -> None:
    """The same last GPU (14 blocks and the head) paces both splits; only the fullest GPU between
    differs (17 blocks or 16), so the exchanges in the step's critical path are the same."""
    seventeen = _plan("megatron tp=8 pp=4 dp=1 first_pipeline_layers=14 last_pipeline_layers=14 distributed_optimizer")
    sixteen = _plan("megatron tp=8 pp=4 dp=1 first_pipeline_layers=16 last_pipeline_layers=14 distributed_optimizer")
    assert seventeen.time.recurring_comm_s == pytest.approx(sixteen.time.recurring_comm_s, rel=1e-9)
    assert seventeen.time.exposed_comm_s == pytest.approx(sixteen.time.exposed_comm_s, rel=1e-9)
    assert seventeen.time.imbalance_s == pytest.approx(sixteen.time.imbalance_s, rel=1e-3)


def _question(layers: int, pp: int) -> tuple[SimpleNamespace, SimpleNamespace, SimpleNamespace]:
    q = SimpleNamespace(
        shape=SimpleNamespace(dims=SimpleNamespace(layers=layers)), factors=SimpleNamespace(compute_scale=1.0)
    )
    return q, SimpleNamespace(grad_accum=1), SimpleNamespace(pp=pp)


def test_a_gpu_between_with_more_blocks_is_the_slowest_once_its_exchanges_count() -> None:
    """Blocks of 1 s with 1 s of exchanges each, a head of 1.5 s: the last GPU (15 blocks and the head)
    computes 16.5 s, more than the 16 blocks between, but runs 30 s a micro-batch to their 32."""
    q, stage_q, layout = _question(62, 4)
    split = StageSplit(15, 16, 15)
    parts = (1.5, 1.0)
    overplanned, uneven, blocks = _stage_work(parts, q, stage_q, layout, split)
    assert (overplanned, blocks) == (1.0, 15)  # compute alone: the last, a block fewer than the planned stage
    exchanges = BlockComm(recurring_s=16.0, context_s=0.0, blocks=16, micro_steps=1)
    overplanned, uneven, blocks = _stage_work(parts, q, stage_q, layout, split, exchanges)
    assert blocks == 16
    assert overplanned == pytest.approx(1.5)  # the head the stage planned
    assert uneven == pytest.approx(16 - (62 + 1.5) / 4)


def test_only_the_blocks_calls_of_a_tensor_parallel_collective_scale_with_them() -> None:
    group = Group(8, 1)
    calls = 4 * 16 + TP_ROOT_CALLS
    tp = Collective(
        "tensor-parallel all-gather of activations", "all-gather", 1e9, calls, None, group, per_micro_step=True
    )
    experts = Collective(DISPATCH_WHAT, "all-to-all", 1e9, 32, None, group, per_micro_step=True)
    loss = Collective("gather the replicas' logits onto GPU 0", "gather", 1e9, 1, None, group, per_micro_step=True)
    assert block_share(tp, None, 1.0) == pytest.approx(64 / 66)
    assert block_share(experts, None, 1.0) == 1.0
    assert block_share(loss, None, 1.0) == 0.0


def test_context_parallels_extra_attention_is_the_slowest_gpus_blocks() -> None:
    """Under context parallelism (tp 2 x pp 4 x cp 2 on 16 GPUs) the same last GPU (14 blocks and the
    head) paces both splits, so the extra attention of its queries against the whole sequence is its
    14 blocks', whichever the fullest GPU between holds (17 blocks or 16): one block's is 0.2% of the
    step's compute; the optimizer's step, the planned stage's parameters', is left out of the match."""

    def blocks_compute(first: int) -> float:
        sharding = f"megatron tp=2 pp=4 cp=2 dp=1 first_pipeline_layers={first} last_pipeline_layers=14"
        row = _megatron_row(
            f"{sharding} distributed_optimizer", n_layers="62", vocab="256000", gpus="16", nodes="2", grad_accum="16"
        )
        q, plan, skipped = published.question(row)
        assert skipped is None and plan is not None and plan.time is not None and plan.time.work is not None
        return plan.time.compute_s - plan.time.work.step_s * q.factors.compute_scale

    assert blocks_compute(14) == pytest.approx(blocks_compute(16), rel=2e-4)


def test_the_first_gpu_runs_the_embeddings_calls_the_last_the_heads_and_one_between_neither() -> None:
    """Blocks of 1 s, a head of 0.5 s, the embedding's and the head's tensor-parallel calls 0.8 s each:
    the last GPU (15 blocks, the head and its calls, 16.3 s) is slower than the 16 blocks between,
    which run neither; the first (15 blocks and the embedding's calls, 15.8 s) is not."""
    q, stage_q, layout = _question(62, 4)
    split = StageSplit(15, 16, 15)
    parts = (0.5, 1.0)
    roots = BlockComm(recurring_s=0.0, context_s=0.0, blocks=16, micro_steps=1, root_s=TP_ROOT_CALLS * 0.8)
    _, _, blocks = _stage_work(parts, q, stage_q, layout, split, roots)
    assert blocks == 15
    assert _root_calls_left(split, parts, q, roots) == pytest.approx(0.8)  # the embedding's, not the last's
    between = StageSplit(15, 17, 15)  # 17 s between, 16.3 s last: a GPU between runs neither
    assert _root_calls_left(between, parts, q, roots) == pytest.approx(1.6)


def test_the_embeddings_and_the_heads_calls_are_the_root_share_of_a_tensor_parallel_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every call priced alike (1 s a collective here): of 66 calls the embedding's and the head's are 2."""
    monkeypatch.setattr(Collective, "seconds", lambda self, topology, host, tail=False: 1.0)
    group = Group(8, 1)
    calls = 4 * 16 + TP_ROOT_CALLS
    tp = Collective(
        "tensor-parallel all-gather of activations", "all-gather", 1e9, calls, None, group, per_micro_step=True
    )
    experts = Collective(DISPATCH_WHAT, "all-to-all", 1e9, 32, None, group, per_micro_step=True)
    assert root_recurring_s([tp, experts], None, 1.0, micro_steps=3) == pytest.approx(3 * 2 / 66)
