"""Megatron-LM's layout planned: ddp-tp and zero1-tp hold a tensor-parallel share of what ddp holds
(zero1-tp's optimizer state a data-parallel share of that), run the tensor-parallel collectives of
fsdp-tp inside the node and all-reduce a tensor-parallel share of the gradients across the nodes
(zero1-tp then broadcasts the parameters it stepped), and `runner.py plan` shows both."""

from __future__ import annotations

import pytest

from harness.plan.network.fabric import Group
from harness.plan.parallel.backends import backend_of, filled_in
from harness.plan.parallel.pipeline_context import megatron_layout
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_backend, plan_strategy
from tests.helpers import run_cli

# Llama 3.1 8B's shape on 2 nodes of 8 GPUs: tensor parallel over a node, data parallel over the two.
LLAMA_8B = dict(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, arch="llama", seq_len=4096)
TP = 8
STRATEGIES = ["ddp", "fsdp-tp", "ddp-tp", "zero1-tp"]


@pytest.fixture(scope="module")
def planned():
    config = PlanConfig(**LLAMA_8B, gpus=16, micro_batch=1, strategies=STRATEGIES, strategy_options={"tp_size": TP})
    q = question(config)
    return {name: plan_strategy(name, q) for name in STRATEGIES}


def test_each_gpu_holds_a_tensor_parallel_share_and_zero1_a_data_parallel_share_of_its_optimizer(planned):
    ddp, ddp_tp, zero1_tp = planned["ddp"], planned["ddp-tp"], planned["zero1-tp"]
    assert (ddp_tp.layout.tp, ddp_tp.layout.data_parallel) == (TP, 2)
    for category in ("params", "grads", "optimizer"):
        # Every matrix split over the group; the norms' vectors, a thousandth of the model, whole.
        assert ddp_tp.states.total(category) == pytest.approx(ddp.states.total(category) / TP, rel=0.01)
    for category in ("params", "grads"):
        assert zero1_tp.states.total(category) == ddp_tp.states.total(category)
    # Whole tensors dealt out to the 2 data-parallel ranks: about half the state each.
    optimizer = zero1_tp.states.total("optimizer")
    assert optimizer == pytest.approx(ddp_tp.states.total("optimizer") / 2, rel=0.05)
    assert zero1_tp.peak_bytes < ddp_tp.peak_bytes
    assert ddp.fits is False and ddp_tp.fits and zero1_tp.fits


def test_tensor_parallel_inside_the_node_and_a_share_of_the_gradients_all_reduced_across(planned):
    ddp, fsdp_tp, ddp_tp, zero1_tp = (planned[name] for name in STRATEGIES)

    def of(plan, prefix):
        return [c for c in plan.collectives if c.what.startswith(prefix)]

    # The same per-layer all-gathers and reduce-scatters of activations as fsdp-tp, on the node's NVLink.
    for plan in (ddp_tp, zero1_tp):
        assert of(plan, "tensor-parallel") == of(fsdp_tp, "tensor-parallel")
        assert all((c.group, c.window) == (Group(TP, 1), None) for c in of(plan, "tensor-parallel"))
    [reduce] = of(ddp_tp, "all-reduce gradients")
    [whole] = of(ddp, "all-reduce gradients")
    # A tensor-parallel share of the fp32 gradients, over one GPU of each node, a unit at a time in backward.
    assert reduce.payload_bytes == pytest.approx(whole.payload_bytes / TP, rel=0.01)
    assert (reduce.group, reduce.window, reduce.calls) == (Group(2, 2), "backward", LLAMA_8B["layers"] + 1)
    assert of(zero1_tp, "all-reduce gradients") == [reduce]
    [broadcast] = of(zero1_tp, "broadcast updated parameters")
    assert broadcast.payload_bytes == reduce.payload_bytes  # the fp32 parameters of the same share
    assert (broadcast.kind, broadcast.group, broadcast.window) == ("broadcast", Group(2, 2), None)
    assert not of(ddp_tp, "broadcast")
    assert zero1_tp.time.wire_bytes > ddp_tp.time.wire_bytes


def test_the_plan_shows_both_by_default():
    args = [f"{key}={value}" for key, value in LLAMA_8B.items()]
    proc = run_cli(["plan", *args, "gpus=16", "micro_batch=1"], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert {"ddp-tp", "zero1-tp", "fsdp-tp", "ddp"} <= rows


@pytest.mark.parametrize(
    "sharding,overlapped",
    [
        ("megatron tp=8 dp=2 ddp", False),  # Megatron's DDP at its default
        ("megatron tp=8 dp=2 ddp overlap_grad_reduce", True),
        ("megatron tp=8 dp=2 distributed_optimizer", True),  # not stated: planned as NeMo's recipes run it
    ],
)
def test_megatrons_gradient_reduction_overlaps_the_backward_only_where_it_is_told_to(sharding, overlapped):
    config = PlanConfig(**LLAMA_8B, gpus=16, micro_batch=1, strategies=["ddp-tp"], strategy_options={"tp_size": TP})
    q = question(config)
    model, options = megatron_layout(sharding)
    backend = filled_in(backend_of(model, "megatron", options), q.shape, "bf16", 16, options)
    plan = plan_backend(backend, q)
    [reduce] = [c for c in plan.collectives if c.what in ("all-reduce gradients", "reduce-scatter gradients")]
    exposed = plan.time.exposed_comm_s - plan.time.recurring_comm_s  # beside tensor parallelism's own
    if overlapped:
        assert reduce.window == "backward" and exposed < reduce.seconds(q.topology, 1.0) / 2
    else:  # the whole gradient buffer, one all-reduce after the backward
        assert (reduce.window, reduce.calls) == (None, 1)
        assert exposed == pytest.approx(reduce.seconds(q.topology, 1.0))


def test_megatrons_tp_comm_overlap_hides_each_blocks_collectives_beside_its_matmuls():
    config = PlanConfig(**LLAMA_8B, gpus=16, micro_batch=1, strategies=["ddp-tp"], strategy_options={"tp_size": TP})
    q = question(config)
    plans = {}
    for sharding in (
        "megatron tp=8 dp=2 distributed_optimizer",
        "megatron tp=8 dp=2 distributed_optimizer tp_comm_overlap",
    ):
        model, options = megatron_layout(sharding)
        plans[sharding.split()[-1]] = plan_backend(
            filled_in(backend_of(model, "m", options), q.shape, "bf16", 16, options), q
        )
    exposed, overlapped = plans["distributed_optimizer"], plans["tp_comm_overlap"]

    def tp(plan):
        return [c for c in plan.collectives if c.what.startswith("tensor-parallel")]

    # The same calls and bytes; each block's in the phase that runs it, the head's and the embedding's exposed.
    assert sum(c.calls for c in tp(overlapped)) == sum(c.calls for c in tp(exposed))
    assert sum(c.payload_bytes for c in tp(overlapped)) == pytest.approx(sum(c.payload_bytes for c in tp(exposed)))
    windows = {(c.kind, c.window): c.calls for c in tp(overlapped)}
    layers = LLAMA_8B["layers"]
    assert windows == {
        ("all-gather", "forward"): 2 * layers,
        ("all-gather", "backward"): 2 * layers,
        ("all-gather", None): 2,
        ("reduce-scatter", "forward"): 2 * layers,
        ("reduce-scatter", "backward"): 2 * layers,
        ("reduce-scatter", None): 2,
    }
    assert overlapped.time.recurring_comm_s < exposed.time.recurring_comm_s / 10
    # Less of the step waits on tensor parallelism (here the host's issue of the micro-step's kernels binds instead).
    assert overlapped.time.step_s - overlapped.time.host_wait_s < exposed.time.step_s
