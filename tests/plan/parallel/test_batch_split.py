"""A global batch split over each layout's own data-parallel ranks (gpus / tp_size), the
recommendation's what-ifs on more GPUs keeping it, and DataParallel planned inside one node only."""

from __future__ import annotations

import pytest

import runner
from harness.plan.model.model_shape import PlanError
from harness.plan.parallel.batch_split import nearest_split, split, widest_split
from harness.plan.parallel.layout import LayoutError
from harness.plan.plan_cli import PlanConfig, question, strategy_names
from harness.plan.predict import batching, plan_all, plan_strategy
from harness.plan.recommendation import recommend
from harness.plan.what_if import fewest_gpus, skipped

# Heads and kv heads that tensor parallelism over a node's 8 GPUs divides.
LLAMA_SMALL = dict(layers=4, width=1024, heads=16, kv_heads=8, vocab=32000, arch="llama", seq_len=2048)


def _plans(**options):
    cfg = PlanConfig(**options)
    q = question(cfg)
    plans, not_planned = plan_all(strategy_names(cfg), q, asked=bool(cfg.strategies))
    return q, {p.name: p for p in plans}, not_planned


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = runner.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_split_is_micro_batches_and_accumulation_over_the_ranks():
    assert split(24, 2, 3) == (3, 4)
    assert split(24, 8, None) == (3, 1)  # no micro-batch given: each rank's share at once
    with pytest.raises(LayoutError, match="batch_size=24 does not divide over 16 data-parallel ranks"):
        split(24, 16, 1)
    with pytest.raises(LayoutError, match=r"over 2 data-parallel ranks \(gpus / tp_size 8\)\): choose a micro_batch"):
        split(24, 2, 5, tp=8)
    # A what-if takes the largest micro-batch up to the asked one that divides the share.
    assert nearest_split(64, 16, 8) == (4, 1) and nearest_split(96, 8, 8) == (6, 2)
    assert nearest_split(64, 2, 8) == (8, 4)
    with pytest.raises(LayoutError):
        nearest_split(8, 16, 1)
    # The question's own split: over every GPU where it can, else over the most ranks it divides over.
    assert widest_split(64, 8, 2) == (2, 4) and widest_split(24, 16, 3) == (3, 1) and widest_split(7, 8, None) == (7, 1)


def test_a_tensor_parallel_layout_splits_the_batch_over_its_own_ranks():
    """24 sequences in micro-batches of 3 on 16 GPUs: 4 micro-steps on each of fsdp-tp's 2
    data-parallel ranks (tp 8), where splitting over every GPU refused the question."""
    q, plans, not_planned = _plans(**LLAMA_SMALL, gpus=16, batch_size=24, micro_batch=3)
    tp = plans["fsdp-tp"]
    assert (tp.layout.tp, tp.layout.data_parallel) == (8, 2)
    assert batching(q, tp.layout) == (3, 4)
    assert tp.time.tokens_per_s * tp.time.step_s == pytest.approx(24 * 2048)
    # Every GPU a data-parallel rank, hybrid sharding's replicas too: 24 does not divide over 16.
    for name in ("ddp", "fsdp", "hsdp", "zero1"):
        assert name not in plans and "does not divide over 16 data-parallel ranks" in not_planned[name]
    # Without a micro-batch, each layout takes its ranks' whole share at once.
    q, plans, _ = _plans(**LLAMA_SMALL, gpus=16, batch_size=32)
    assert batching(q, plans["fsdp-tp"].layout) == (16, 1) and batching(q, plans["hsdp"].layout) == (2, 1)


def test_the_plan_states_each_layouts_split(capsys):
    args = [f"{k}={v}" for k, v in LLAMA_SMALL.items()]
    code, out, _ = _cli(capsys, *args, "gpus=16", "batch_size=48", "micro_batch=3", "strategies=[fsdp,fsdp-tp]")
    assert code == 0
    assert "batch 48 x 2048 tokens over each layout's data-parallel ranks in micro-batches of 3" in out
    assert "Batch 48 over 16 data-parallel ranks: micro-batch 3 x 1 accumulation (fsdp)." in out
    assert "Batch 48 over 2 data-parallel ranks: micro-batch 3 x 8 accumulation (fsdp-tp)." in out


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["model=gpt2-124m", "gpus=4", "batch_size=7", "micro_batch=2"], "micro_batch=2 does not divide the 7"),
        # 64 GPUs: a pipeline of 48 blocks has at most 32 stages, so 9 sequences split over no layout's ranks.
        (["model=gpt2-1.5b", "gpus=64", "batch_size=9"], "gpt2-1.5b on 64 GPUs: no strategy can lay it out: "),
    ],
)
def test_a_batch_no_layout_can_split_is_one_line(capsys, args, fragment):
    code, out, err = _cli(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and fragment in err, err


def test_the_what_if_on_more_gpus_keeps_the_batch_and_splits_it_as_it_can():
    """llama2-7b on 8 GPUs, 64 sequences in micro-batches of 8: fsdp fits on 32 GPUs, each rank
    taking its 2 sequences in one micro-batch of 2."""
    q, plans, _ = _plans(model="llama2-7b", gpus=8, batch_size=64, micro_batch=8, seq_len=4096, strategies=["fsdp"])
    assert plans["fsdp"].fits is False
    gpus, found = fewest_gpus("fsdp", q)
    assert found.fits and batching(q.with_gpus(gpus), found.layout) == (64 // gpus, 1)
    assert not plan_strategy("fsdp", q.with_gpus(gpus // 2)).fits


def test_a_what_if_the_batch_cannot_take_stops_there_and_says_why(capsys):
    """8 sequences of a 70B model on 8 GPUs: nothing fits, and 16 GPUs cannot split the batch;
    the recommendation is made all the same."""
    options = dict(model="llama3.1-70b", gpus=8, batch_size=8, seq_len=8192, strategies=["fsdp", "zero3"])
    q, plans, _ = _plans(**options)
    assert not any(p.fits for p in plans.values())
    rec = recommend(list(plans.values()), q)
    assert rec.lines[0].startswith("Nothing fits")
    why = "not planned on 16 GPUs: batch_size=8 does not divide over 16 data-parallel ranks"
    assert {name: reason.split(":")[0] for name, reason in skipped(list(plans.values()), q).items()} == {
        "fsdp": "not planned on 16 GPUs",
        "zero3": "not planned on 16 GPUs",
    }
    args = [f"{k}={v}" for k, v in options.items() if k != "strategies"]
    code, out, _ = _cli(capsys, *args, "strategies=[fsdp,zero3]")
    assert code == 0 and f"What-if on more GPUs stops for fsdp, zero3: {why}" in out


@pytest.mark.parametrize(
    "given, says",
    [
        ("global_batch_tokens=1K", "global_batch_tokens=1,024 (1 sequence of 1024) is too few to split over any"),
        ("batch_size=1", "give batch_size= of at least 8, the fewest a layout here takes, or fewer gpus="),
    ],
)
def test_a_batch_no_strategy_can_split_says_the_smallest_to_give(capsys, given, says):
    # Not every strategy's refusal in the option the user did not give (batch_size= for a batch in tokens).
    code, out, err = _cli(capsys, "model=llama3.1-8b", "gpus=64", given)
    assert code == 2 and out == "" and err.count("\n") == 1 and len(err) < 300 and says in err, err


def test_a_what_if_that_stops_names_the_strategy_once():
    q, plans, _ = _plans(model="llama3.1-70b", gpus=8, micro_batch=1, strategies=["dataparallel"])
    assert skipped(list(plans.values()), q) == {
        "dataparallel": "not planned on 16 GPUs: one process drives every GPU (its replicas are threads), so it "
        "runs inside one node: not planned beyond 8 GPUs (gpus=16 on 2 nodes)"
    }


def test_dataparallel_is_planned_inside_one_node_only():
    _, plans, not_planned = _plans(model="gpt2-124m", gpus=64, micro_batch=4)
    assert "dataparallel" not in plans and "ddp" in plans
    assert "one process drives every GPU" in not_planned["dataparallel"]
    assert "runs inside one node: not planned beyond 8 GPUs (gpus=64 on 8 nodes)" in not_planned["dataparallel"]
    # The lines that say a reason name its strategy, so the reason does not name it again.
    assert not not_planned["dataparallel"].startswith("dataparallel")
    _, plans, _ = _plans(model="gpt2-124m", gpus=8, micro_batch=4)
    assert plans["dataparallel"].layout.data_parallel == 8
    with pytest.raises(PlanError, match="runs inside one node") as err:
        _plans(model="gpt2-124m", gpus=16, micro_batch=4, strategies=["dataparallel"])
    assert "\n" not in str(err.value)


def test_the_global_batch_in_tokens_is_the_plans_batch_too(capsys):
    """global_batch_tokens= is the plain plan's batch as it is the search's: the same question as
    batch_size= in sequences; both at once is one line."""
    tokens = question(PlanConfig(**LLAMA_SMALL, gpus=8, global_batch_tokens="64K"))
    sequences = question(PlanConfig(**LLAMA_SMALL, gpus=8, batch_size=32))
    assert tokens.global_batch == sequences.global_batch == 32
    assert (tokens.micro_batch, tokens.grad_accum) == (sequences.micro_batch, sequences.grad_accum) == (4, 1)
    code, out, err = _cli(capsys, "model=gpt2-124m", "gpus=8", "batch_size=32", "global_batch_tokens=32K")
    assert code == 2 and out == "" and "give global_batch_tokens= or batch_size= (sequences), not both" in err


def test_a_share_that_does_not_fit_at_once_is_accumulated_in_the_largest_micro_batch_that_fits(capsys):
    """Without micro_batch=, a layout takes its ranks' share at once where it fits; where it does not,
    the largest micro-batch that divides the share and fits, the rest accumulated, as a run whose
    global batch is given would set it. Llama 3.1 405B on 1,024 H100s at 16M tokens: ZeRO-3's two
    sequences a rank do not fit at once, one a micro-step does."""
    base = dict(model="llama3.1-405b", gpus=1024, seq_len=8192, activation_checkpointing="full")
    q = question(PlanConfig(**base, global_batch_tokens="16M", strategies=["zero3"]))
    plans, _ = plan_all(["zero3"], q)
    (zero3,) = plans
    assert (zero3.micro_batch, zero3.grad_accum) == (1, 2) and zero3.fits
    whole = plan_strategy("zero3", q)
    assert (whole.micro_batch, whole.grad_accum) == (2, 1) and whole.fits is False
    code, out, _ = _cli(capsys, *(f"{k}={v}" for k, v in base.items()), "global_batch_tokens=16M", "strategies=[zero3]")
    assert code == 0
    assert "Batch 2048 over 1024 data-parallel ranks: micro-batch 1 x 2 accumulation (zero3)." in out
    assert "Use zero3" in out
