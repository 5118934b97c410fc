"""The host's floor under a micro-step: what it issues (the model's kernels as the backend runs
them, and the collectives), that it binds only where each GPU's work per op is small, and that
compiling lowers it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from harness.common.hardware import GPUS
from harness.plan.model.model_shape import PlanError, shape_of_description, shape_of_spec
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_backend, plan_strategy
from harness.plan.speed.compute import ACCUMULATE_KERNELS, BIAS_GRAD_KERNELS, ROOT_KERNELS, micro_step_kernels
from harness.plan.speed.host_issue import (
    GRACE_HOST_SLOWDOWN,
    HOST_S_PER_COLLECTIVE,
    HOST_S_PER_KERNEL,
    LAUNCH_BLOCKING,
    LAYER_SYNC_COPIES,
    LAYER_SYNCS,
    host_rates,
    issue_rates,
)
from harness.plan.speed.kernel_table import KernelTable

# A GPT of 1,024 wide on one node: at tensor parallel 8 and one sequence, each GPU's share of a
# block is tens of microseconds of GPU work against the block's ~100 kernels to issue.
SMALL = dict(layers=24, width=1024, heads=16, vocab=50304, seq_len=2048, gpu="A100")


def _plan(strategy: str, *, micro_batch: int, tp: int | None = None, compile: bool = False, **model):
    options = {"tp_size": tp} if tp else {}
    config = PlanConfig(
        **(model or SMALL),
        gpus=8,
        micro_batch=micro_batch,
        compile=compile,
        strategies=[strategy],
        strategy_options=options,
    )
    return plan_strategy(strategy, question(config))


def test_a_micro_step_takes_at_least_its_host_time_where_each_gpus_work_is_small():
    plan = _plan("ddp-tp", micro_batch=1, tp=8)
    t = plan.time
    assert t.host is not None and t.host_wait_s > 0
    # The step's compute and critical-path collectives are shorter than the host's issue; the step is not.
    assert t.compute_s + t.recurring_comm_s < t.host.seconds <= t.step_s
    assert t.tokens_per_s / 8 < 2048 / t.host.seconds  # no faster than the host can issue


def test_the_floor_leaves_large_micro_steps_alone():
    t = _plan("ddp", micro_batch=8).time
    assert t.host_wait_s == 0.0 and t.host.seconds < 0.2 * t.compute_s


def test_the_smaller_each_gpus_work_the_more_of_the_step_waits_on_the_host():
    shares = [_plan("ddp-tp", micro_batch=mb, tp=8).time for mb in (8, 4, 2, 1)]
    waits = [t.host_wait_s / t.step_s for t in shares]
    # At micro-batch 1 a sixth or more of the step is the host's, beside 2 MiB rings at the A100 node's
    # measured pace (collective_ramp.py).
    assert waits == sorted(waits) and waits[-1] > 0.15


def test_tensor_parallel_issues_its_collectives_on_every_micro_step():
    half, whole = _plan("ddp-tp", micro_batch=1, tp=2).time.host, _plan("ddp-tp", micro_batch=1, tp=8).time.host
    assert half.kernels == whole.kernels  # every GPU of the group runs the whole block's kernels
    assert whole.collectives >= 4 * SMALL["layers"]  # a block's gathers and scatters, forward and backward
    issued = whole.seconds - whole.kernels * HOST_S_PER_KERNEL["eager"]
    assert issued == pytest.approx(whole.collectives * HOST_S_PER_COLLECTIVE)


def test_compiling_fuses_the_elementwise_kernels_and_issues_them_from_its_wrapper():
    shape = shape_of_spec("llama3.1-8b")
    eager, compiled = micro_step_kernels(shape, "none"), micro_step_kernels(shape, "none", compiled=True)
    assert compiled.total < 0.6 * eager.total
    assert HOST_S_PER_KERNEL["compiled"] < HOST_S_PER_KERNEL["eager"] / 4
    assert _plan("ddp", micro_batch=1, compile=True).time.host.seconds < _plan("ddp", micro_batch=1).time.host.seconds


def test_checkpointing_issues_the_forward_again():
    shape = shape_of_spec("llama3.1-8b")
    none, full, selective = (micro_step_kernels(shape, mode) for mode in ("none", "full", "selective"))
    assert none.again == 0 and full.again == none.forward - ROOT_KERNELS[0] and 0 < selective.again < full.again


def test_each_projections_bias_adds_the_reduction_torch_runs_for_its_gradient():
    # What torch itself runs: a biased linear layer's backward is its two matmuls and one sum more.
    counts = {}
    for bias in (True, False):
        layer, x = torch.nn.Linear(16, 8, bias=bias), torch.randn(2, 4, 16, requires_grad=True)
        out = layer(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out.backward(torch.ones_like(out))
        counts[bias] = Counter(e.name for e in prof.events() if e.name in ("aten::mm", "aten::sum"))
    assert counts[False] == {"aten::mm": 2} and counts[True] == {"aten::mm": 2, "aten::sum": 1}
    # The plan counts one such kernel for each of a GPT block's four biased projections, not for its norms.
    description = dict(params=None, layers=2, width=64, heads=4, vocab=128, seq_len=32)
    plain, biased = (shape_of_description(**description, biases=b) for b in (False, True))
    assert sum(t.projection_bias for t in biased.tensors if t.block == 0) == 4
    added = micro_step_kernels(biased, "none").backward - micro_step_kernels(plain, "none").backward
    norm_biases = 2  # each accumulated into .grad as every parameter is
    assert added == 2 * (4 * (BIAS_GRAD_KERNELS + ACCUMULATE_KERNELS) + norm_biases * ACCUMULATE_KERNELS)


def test_fused_kernels_issued_from_python_pay_eagers_rate():
    config = PlanConfig(**SMALL, gpus=8, micro_batch=1, compile=True, strategies=["ddp"])
    q = question(config)
    compiled = plan_strategy("ddp", q).time.host
    te = plan_strategy("ddp", replace(q, eager_launches=True)).time.host  # TransformerEngine's modules
    assert te.kernels == compiled.kernels
    rates = HOST_S_PER_KERNEL["eager"] - HOST_S_PER_KERNEL["compiled"]
    assert te.seconds - compiled.seconds == pytest.approx(te.kernels * rates)  # the collectives' alike


def test_a_grace_host_issues_each_kernel_slower_than_an_x86_one():
    x86, grace = host_rates(GPUS["B200"]), host_rates(GPUS["GB200"])
    assert x86 == HOST_S_PER_KERNEL
    assert grace["eager"] == pytest.approx(x86["eager"] * GRACE_HOST_SLOWDOWN) and GRACE_HOST_SLOWDOWN > 2
    on_b200 = _plan("ddp-tp", micro_batch=1, tp=4, **{**SMALL, "gpu": "B200"}).time.host
    on_gb200 = _plan("ddp-tp", micro_batch=1, tp=4, **{**SMALL, "gpu": "GB200"}).time.host
    assert on_gb200.kernels == on_b200.kernels
    assert on_gb200.seconds == pytest.approx(on_b200.seconds * GRACE_HOST_SLOWDOWN)


def test_a_grace_host_runs_the_backends_own_work_slower_unless_it_was_measured_there():
    """The reference compare's backend overheads were measured on an x86 host: on a Grace host the same
    Python takes GRACE_HOST_SLOWDOWN times as long; a calibration on the machine itself is taken as is."""
    on_b200 = _plan("zero3", micro_batch=1, **{**SMALL, "gpu": "B200"})
    on_gb200 = _plan("zero3", micro_batch=1, **{**SMALL, "gpu": "GB200"})
    assert on_b200.time.overhead_s > 0
    assert on_gb200.time.overhead_s == pytest.approx(on_b200.time.overhead_s * GRACE_HOST_SLOWDOWN)
    q = question(PlanConfig(**{**SMALL, "gpu": "GB200"}, gpus=8, micro_batch=1, strategies=["zero3"]))
    measured = replace(q, factors=replace(q.factors, measured=True))
    assert plan_strategy("zero3", measured).time.overhead_s == pytest.approx(on_b200.time.overhead_s)


def test_blocking_launches_add_the_hosts_whole_issue_time_to_every_micro_step():
    # A large micro-step hides its host entirely; with CUDA_LAUNCH_BLOCKING=1 (a published run's
    # option) none of it is hidden.
    config = PlanConfig(**SMALL, gpus=8, micro_batch=8, strategies=["ddp"])
    asynchronous = plan_strategy("ddp", question(config))
    blocked = replace(asynchronous.backend, options={**asynchronous.backend.options, LAUNCH_BLOCKING: True})
    blocking = plan_backend(blocked, question(config)).time
    assert asynchronous.time.host_wait_s == 0.0
    assert blocking.host_wait_s == pytest.approx(blocking.host.seconds)
    assert blocking.step_s == pytest.approx(asynchronous.time.step_s + blocking.host.seconds)


def test_layers_that_wait_on_blocking_copies_pay_their_forwards_issue_beside_its_long_kernels():
    # Megatron-DeepSpeed's layer (a published run's option): each forward, and each recomputed one,
    # waits on its copies, so a small micro-step's forward cannot be issued ahead of the GPU; a large
    # one's long kernels still hide the issue of its short ones.
    def planned(micro_batch: int, option: str | None):
        config = PlanConfig(
            **SMALL, gpus=8, micro_batch=micro_batch, strategies=["ddp"], activation_checkpointing="full"
        )
        plan = plan_strategy("ddp", question(config))
        options = {**plan.backend.options, option: True} if option else plan.backend.options
        return plan_backend(replace(plan.backend, options=options), question(config)).time

    free, synced, blocking = (planned(1, option) for option in (None, LAYER_SYNCS, LAUNCH_BLOCKING))
    assert synced.host.kernels == free.host.kernels + 2 * LAYER_SYNC_COPIES * SMALL["layers"]
    assert free.host_wait_s == 0.0 < synced.host_wait_s
    assert free.step_s < synced.step_s < blocking.step_s
    assert planned(8, LAYER_SYNCS).step_s == pytest.approx(planned(8, None).step_s)


def test_dataparallel_waits_on_its_host_as_single_does():
    """DataParallel's one thread issues its first replica's kernels as single's does, its other replicas'
    launches on top: on one GPU its step is single's, and a host-bound micro-step is no faster on more."""
    one = question(PlanConfig(model="gpt2-124m", gpus=1, strategies=["single", "dataparallel"]))
    single, threads = plan_strategy("single", one).time, plan_strategy("dataparallel", one).time
    assert single.host_wait_s > 0 and threads.host_wait_s == pytest.approx(single.host_wait_s)
    assert threads.step_s == pytest.approx(single.step_s)
    two = question(PlanConfig(model="gpt2-124m", gpus=2, strategies=["dataparallel"]))
    assert plan_strategy("dataparallel", two).time.step_s > single.step_s


def test_a_given_host_pace_prices_every_kernel_and_the_backends_own_work_at_it():
    """host_us_per_kernel= is the user's host: twice the x86 rate doubles the host's issue, compiled
    launches and the backend's own host work alike, and it stands in place of a Grace host's slowdown."""
    x86 = _plan("ddp-tp", micro_batch=1, tp=4)
    slow = _plan("ddp-tp", micro_batch=1, tp=4, **{**SMALL, "host_us_per_kernel": 48})
    assert slow.time.host.kernels == x86.time.host.kernels
    assert slow.time.host.seconds == pytest.approx(2 * x86.time.host.seconds)
    zero3_x86 = _plan("zero3", micro_batch=1).time
    zero3_slow = _plan("zero3", micro_batch=1, **{**SMALL, "host_us_per_kernel": 48}).time
    assert zero3_slow.overhead_s == pytest.approx(2 * zero3_x86.overhead_s) and zero3_x86.overhead_s > 0
    assert slow.time.tokens_per_s < x86.time.tokens_per_s
    compiled = _plan("ddp-tp", micro_batch=1, tp=4, compile=True, **{**SMALL, "host_us_per_kernel": 48})
    compiled_x86 = _plan("ddp-tp", micro_batch=1, tp=4, compile=True)
    assert compiled.time.host.seconds == pytest.approx(2 * compiled_x86.time.host.seconds)
    on_b200 = _plan("ddp-tp", micro_batch=1, tp=4, **{**SMALL, "gpu": "B200"}).time.host
    given_on_gb200 = _plan("ddp-tp", micro_batch=1, tp=4, **{**SMALL, "gpu": "GB200", "host_us_per_kernel": 24})
    assert given_on_gb200.time.host.seconds == pytest.approx(on_b200.seconds)


def test_a_given_host_pace_stands_before_the_cards_measured_table(monkeypatch):
    table = KernelTable(card="A100", source="a test's table", host_s_per_kernel={"eager": 30e-6, "compiled": 6e-6})
    monkeypatch.setattr("harness.plan.speed.host_issue.kernel_table", lambda gpu: table)
    a100 = GPUS["A100"]
    assert issue_rates(a100) == (table.host_s_per_kernel, "measured on the card: a test's table")
    given, basis = issue_rates(replace(a100, host_us_per_kernel=12.0))
    assert given["eager"] == pytest.approx(12e-6) and basis == "host_us_per_kernel=, as given"
    assert given["compiled"] == pytest.approx(HOST_S_PER_KERNEL["compiled"] / 2)


def test_the_plan_says_which_host_pace_it_priced_and_refuses_a_pace_that_is_none():
    from harness.plan.plan_cli import basis_lines

    default = next(line for line in basis_lines(question(PlanConfig(**SMALL))) if line.startswith("host issue"))
    assert "24.0 us of CPU an eager kernel" in default and "host_us_per_kernel= gives your host's" in default
    given = next(
        line
        for line in basis_lines(question(PlanConfig(**SMALL, host_us_per_kernel=40)))
        if line.startswith("host issue")
    )
    assert "40.0 us of CPU an eager kernel" in given and "as given" in given
    for bad in (0, -3.0, float("nan")):
        with pytest.raises(PlanError, match="host_us_per_kernel=.* must be a positive, finite number"):
            question(PlanConfig(**SMALL, host_us_per_kernel=bad))
    for other_unit in (24e-6, 0.024e6):  # seconds, nanoseconds
        with pytest.raises(PlanError, match="is microseconds of CPU to issue one eager kernel: give 1 to 1000"):
            question(PlanConfig(**SMALL, host_us_per_kernel=other_unit))
