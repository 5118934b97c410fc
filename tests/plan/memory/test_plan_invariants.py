"""The plan's memory is physically possible for every question: every strategy, six model shapes
from gpt2-124m to a 405B Llama, 1 to 1,024 GPUs, micro-batch 1 and 8, checkpointing none and full,
under the default factors and under a calibration on the reference H100's peaks at two sizes. No
term below zero, no peak below the model states the GPU holds, no question without an answer,
and a question where nothing fits says what would make it fit."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import runner
from harness.common.units import GIB
from harness.plan.memory.batch_limit import PLAN_LIMIT, fitting_micro_batch
from harness.plan.memory.invariants import memory_violations
from harness.plan.plan_cli import PlanConfig, question, strategy_names
from harness.plan.predict import plan_all, plan_backend, plan_default, plan_strategy
from harness.plan.recommendation import recommend
from harness.plan.speed.calibration import REFERENCE, calibrate_from, default_factors, question_for, read_measurements
from tests.helpers import ROOT

SHAPES = {
    # The grid's 2048 tokens: GPT-2's learned positions raised to take them.
    "gpt2-124m": dict(model="gpt2-124m", model_kwargs={"block_size": 2048}),
    "gpt2-1.5b": dict(model="gpt2-1.5b", model_kwargs={"block_size": 2048}),
    # Falcon-7B: multi-query attention (one key/value head), LayerNorm and a GELU MLP.
    "falcon-7b": dict(layers=32, width=4544, heads=71, kv_heads=1, ffn=18176, vocab=65024, arch="gpt"),
    "llama-13b": dict(layers=40, width=5120, heads=40, ffn=13824, vocab=32000, arch="llama"),
    "llama-70b": dict(layers=80, width=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, arch="llama"),
    "llama-405b": dict(layers=126, width=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256, arch="llama"),
}
GPU_COUNTS = (1, 2, 8, 64, 512, 1024)
H100_350M = ROOT / "bench" / "data" / "h100_gpt2_350m.json"


@pytest.fixture(scope="module")
def factor_sets() -> dict:
    calibrated, _ = calibrate_from(REFERENCE, H100_350M)
    return {"default": default_factors(), "calibrated": calibrated}


def _questions(shape: dict, factors) -> list:
    out = []
    for gpus in GPU_COUNTS:
        base = question(PlanConfig(**shape, gpus=gpus, seq_len=2048))
        for micro_batch in (1, 8):
            for checkpointing in ("none", "full"):
                out.append(
                    (
                        strategy_names(PlanConfig(**shape, gpus=gpus), gpus),
                        replace(base, micro_batch=micro_batch, checkpointing=checkpointing, factors=factors),
                    )
                )
    return out


@pytest.mark.parametrize("factors", ["default", "calibrated"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_plan_is_physically_possible_and_every_question_answered(shape, factors, factor_sets):
    for names, q in _questions(SHAPES[shape], factor_sets[factors]):
        plans, _ = plan_all(names, q, asked=False)
        assert plans, (shape, q.gpus)
        for p in plans:
            where = f"{p.name}, {shape} on {q.gpus} GPUs, micro-batch {q.micro_batch}, {q.checkpointing}"
            assert memory_violations(p.states, p.activations, p.buffers, p.peak_bytes) == [], where
            assert p.peak_bytes >= sum(p.states_on().values()) >= 0, where
            # The fit is the peak allocated with the allocator's reserve, and the host's room for what
            # offload keeps there; torch's max reserved adds the logits' cached block, which the
            # allocator frees before it reports out of memory.
            host = p.host is None or p.host.fits(p.host_bytes)
            assert p.fits == (p.headroom.fits(p.peak_bytes) and host), where
            assert p.reserved_bytes >= p.headroom.reserved(p.peak_bytes), where
        answer = recommend(plans, q)
        if any(p.fits for p in plans):
            assert answer.best is not None and answer.lines[0].startswith(f"Use {answer.best}")
        elif answer.best is None:
            said = "\n".join(answer.lines)
            short = "largest part:" in said or "of host memory per" in said  # the card's shortfall, or the host's
            assert said.startswith(f"Nothing fits in {q.gpus} x") and short, said
            assert len(answer.lines) == 2 and ("It would fit with" in said or "is needed" in said), said
        else:  # nothing fits as asked, something does with more checkpointing
            assert "activation_checkpointing=" in answer.lines[1]


def test_the_calibration_carries_its_misses_by_kind(factor_sets):
    """One size at one micro-batch (the reference compare) tells no kind from another: every miss is
    carried as fixed bytes. Adding the same H100's peaks at gpt2-350m (same tokens per micro-step)
    splits off what grows with the parameters held, and both sizes are reproduced."""
    assert all(c.activation_share == c.bytes_per_param == 0 for c in default_factors().memory.values())
    calibrated = factor_sets["calibrated"]
    for path in (REFERENCE, H100_350M):
        settings, measurements, _ = read_measurements(path)
        for m in measurements:
            assert calibrated.memory[m.strategy].activation_share == 0, m.strategy
            plan = plan_strategy(m.strategy, question_for(settings, m, calibrated))
            assert plan.peak_bytes == pytest.approx(m.peak_bytes, rel=0.01), (path.name, m.strategy)


def test_falcon_7b_under_zero2_holds_its_model_states():
    """8 x A100 40GB, seq 4096, micro-batch 1, full checkpointing: ZeRO-2 keeps the whole bf16 model
    (12.9 GiB) and an eighth of the fp32 master and moments (9.7 GiB) through the step."""
    q = question(PlanConfig(**SHAPES["falcon-7b"], gpus=8, gpu="A100-40", seq_len=4096, micro_batch=1))
    plan = plan_strategy("zero2", replace(q, checkpointing="full"))
    held = plan.states_on()
    assert held["params"] / GIB == pytest.approx(12.9, abs=0.05)
    assert held["optimizer"] / GIB == pytest.approx(9.7, abs=0.05)
    assert plan.peak_bytes > held["params"] + held["optimizer"] + held["grads"]


def test_one_gpu_offloading_everything_has_a_positive_peak():
    q = question(PlanConfig(**SHAPES["falcon-7b"], gpus=1, seq_len=2048, micro_batch=1))
    plan = plan_strategy("zero3-offload", q)
    assert plan.peak_bytes >= plan.activations.total > 0


def test_the_largest_micro_batch_is_the_last_that_fits_and_the_answer_names_it(capsys):
    q = question(PlanConfig(model="gpt2-1.5b", gpus=8, micro_batch=8, strategies=["ddp", "fsdp", "zero3"]))
    plans, _ = plan_all(["ddp", "fsdp", "zero3"], q)
    for p in plans:
        largest = fitting_micro_batch(p, q)
        assert 8 < largest < PLAN_LIMIT, p.name
        assert plan_strategy(p.name, replace(q, micro_batch=largest)).fits, p.name
        assert not plan_strategy(p.name, replace(q, micro_batch=largest + 1)).fits, p.name
    answer = recommend(plans, q)
    best = next(p for p in plans if p.name == answer.best)
    assert f"micro-batches up to {fitting_micro_batch(best, q)} fit" in answer.lines[0]
    assert runner.main(["plan", "model=gpt2-1.5b", "gpus=8", "micro_batch=8", "strategies=[ddp,fsdp,zero3]"]) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line.split() for line in table if line.startswith("strategy"))
    fsdp = next(line.split() for line in table if line.startswith("fsdp "))
    assert int(fsdp[header.index("max")]) == fitting_micro_batch(next(p for p in plans if p.name == "fsdp"), q)


def test_max_mb_is_none_where_no_micro_batch_splits_the_batch_asked_and_fits(capsys):
    # Accelerate's FSDP with TP fits one sequence of 8k in a step of its own, but not beside the accumulation
    # that 4 sequences a rank then need: "NO" beside "max mb 1" read as a split that would run.
    args = ["plan", "model=llama3.1-70b", "gpu=GB200", "gpus=72", "seq_len=8192", "strategies=[accelerate-fsdp-tp]"]
    assert runner.main([*args, "format=json"]) == 0
    planned = json.loads(capsys.readouterr().out)["strategies"][0]
    assert planned["fits"] is False and planned["largest_micro_batch"] == 0
    q = question(PlanConfig(model="llama3.1-70b", gpu="GB200", gpus=72, seq_len=8192))
    assert fitting_micro_batch(plan_default("accelerate-fsdp-tp", q), q) == 1  # alone, at no accumulation


def test_a_mixture_of_experts_largest_micro_batch_holds_its_experts_as_the_plan_does():
    """Without expert parallelism a strategy holds the experts among the rest: the largest micro-batch
    is priced with them, so a plan that does not fit at micro-batch 1 has none, and one that fits
    names the last micro-batch at which it still does."""
    q = question(
        PlanConfig(
            model="kimi-k2", gpus=512, seq_len=4096, batch_size=2048, micro_batch=1, activation_checkpointing="full"
        )
    )
    for strategy in ("fsdp", "zero3"):
        plan = plan_strategy(strategy, q)
        largest = fitting_micro_batch(plan, q)
        if not plan.fits:
            assert largest == 0, strategy
            continue
        assert largest >= 1 and plan_strategy(strategy, replace(q, micro_batch=largest)).fits, strategy
        assert not plan_strategy(strategy, replace(q, micro_batch=largest + 1)).fits, strategy


@pytest.mark.parametrize(("name", "options"), [("fsdp-pp", {"pp_size": 2}), ("fsdp", {"cp_size": 2})])
def test_a_split_models_largest_micro_batch_is_its_stages_or_shards_own(name, options):
    """A pipeline's stage and a context-parallel shard hold less than the whole model's activations:
    the largest micro-batch is the last at which the split plan itself fits."""
    q = question(PlanConfig(model="llama3.1-8b", gpus=8, seq_len=4096, micro_batch=2, strategy_options={name: options}))
    plan = plan_strategy(name, q)
    largest = fitting_micro_batch(plan, q)
    assert plan.fits and largest >= 1
    assert plan_backend(plan.backend, replace(q, micro_batch=largest)).fits
    # A pipeline's local batch grows by whole rounds of its micro-batches, one a stage by default.
    assert largest % plan.layout.pp == 0
    assert not plan_backend(plan.backend, replace(q, micro_batch=largest + plan.layout.pp)).fits


def test_what_would_change_the_answer_names_a_faster_strategy_that_some_remedy_makes_fit():
    """405B on 1,024 H100s at seq 8192, a sequence a data-parallel rank, without checkpointing: the
    fastest strategies fit no way; the line names the fastest that checkpointing makes fit, with its speed."""
    q = question(PlanConfig(model="llama3.1-405b", gpus=1024, seq_len=8192, micro_batch=1))
    plans, _ = plan_all(strategy_names(PlanConfig(model="llama3.1-405b", gpus=1024)), q, asked=False)
    answer = recommend(plans, q)
    remedy = next(line for line in answer.lines if line.startswith("What would change the answer"))
    assert "is faster and fits with activation_checkpointing=" in remedy and "tokens/s per GPU" in remedy
