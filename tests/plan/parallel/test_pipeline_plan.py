"""Pipeline and context parallelism in the plan: the bubble by schedule, the activations in flight
on a stage, the traffic between stages, context parallel's activations and traffic, the search over
pp and cp, and the 405B question (FSDP x TP x PP against ZeRO-3)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import strategies.registry as registry_module
from harness.plan.network.fabric import collective_seconds
from harness.plan.parallel.backends import backend_for, backend_of, filled_in
from harness.plan.parallel.context_parallel_cost import ULYSSES_EXCHANGES
from harness.plan.parallel.layout import LayoutError
from harness.plan.parallel.pipeline_context import megatron_layout, published_layout, published_options
from harness.plan.parallel.pipeline_cost import (
    DEEPSPEED_RUNTIME,
    TORCH_RUNTIME,
    Pipeline,
    boundary_bytes,
    idle_words,
    micro_batches,
    pipeline_of,
    stage_layers,
    stage_shape,
)
from harness.plan.parallel.pipeline_default import pipeline_line
from harness.plan.plan_cli import PlanConfig, question, strategy_names
from harness.plan.predict import Question, plan_all, plan_backend, plan_strategy
from harness.plan.search.layout_search import search, why_slower
from harness.plan.search.search_cli import search_question
from harness.plan.search.search_space import BatchSplit, pipeline_splits
from harness.plan.speed.step_time import overhead_per_micro_step

SMALL_LLAMA = dict(layers=8, width=1024, heads=16, kv_heads=4, ffn=2816, vocab=32000, arch="llama")


@pytest.fixture
def layout_strategies(monkeypatch) -> None:
    """The registry with tests/plan/layout_strategies.py's planner-only strategies: one taking tp, pp
    and cp sizes (torchtitan's composed mesh), Megatron-style layouts taking pipeline stages."""
    names = registry_module._builtin_modules() + ["tests.plan.layout_strategies"]
    monkeypatch.setattr(registry_module, "_DEFAULT", registry_module.registry_of(names))


def _plan(name: str = "fsdp-tp", **options):
    sizes = {
        k: options.pop(k)
        for k in list(options)
        if k in ("tp_size", "pp_size", "cp_size", "schedule", "microbatches", "cp_attention", "cp_rotate")
    }
    cfg = PlanConfig(
        **{**SMALL_LLAMA, "gpus": 16, "gpus_per_node": 4, "seq_len": 4096, "micro_batch": 8, **options},
        strategy_options=sizes,
    )
    q = question(cfg)
    # The planner's model of `name` with these sizes, whether or not the strategy takes them yet (torchtitan
    # composes them all; plan_strategy gives a registered strategy only the options it takes).
    return q, plan_backend(backend_for(name, q.shape, "bf16", q.gpus, sizes), q)


@pytest.mark.parametrize(
    ("schedule", "virtual", "bubble"),
    [("gpipe", 1, 3 / 8), ("1f1b", 1, 3 / 8), ("interleaved-1f1b", 2, 3 / 16), ("zero-bubble", 1, 0.0)],
)
def test_bubble_by_schedule(schedule: str, virtual: int, bubble: float) -> None:
    assert Pipeline(4, 8, schedule, virtual).bubble == pytest.approx(bubble)


def test_zero_bubble_needs_as_many_micro_batches_as_stages() -> None:
    assert Pipeline(4, 2, "zero-bubble").bubble == pytest.approx(3 / 2)


def test_micro_batches_in_flight_by_schedule() -> None:
    assert Pipeline(4, 16, "gpipe").in_flight == 16
    assert Pipeline(4, 16, "1f1b").in_flight == 4
    assert Pipeline(4, 2, "1f1b").in_flight == 2
    # Megatron's warm-up: 2(p-1) + (v-1)p + 1 = 11 chunks of half a stage.
    assert Pipeline(4, 16, "interleaved-1f1b", 2).in_flight == pytest.approx(5.5)
    assert Pipeline(4, 16, "zero-bubble").in_flight == 7


def test_parabench_pipelines_are_held_to_what_their_runtime_runs() -> None:
    """strategies/torch_mesh.py and zero1_pp.py: a micro-batch a stage by default, which must divide
    the local batch; torch's 1F1B at least one a stage, its looped schedules whole rounds of them;
    DeepSpeed's engine fewer. A published run's pipeline keeps torchtitan's older default."""
    assert pipeline_of({}, 8, 4, TORCH_RUNTIME).microbatches == 4
    with pytest.raises(LayoutError, match="microbatches=4 does not divide the micro-batch of 2 sequences"):
        pipeline_of({}, 2, 4, TORCH_RUNTIME)
    with pytest.raises(LayoutError, match="schedule 1f1b needs at least one micro-batch per stage"):
        pipeline_of({"microbatches": 2}, 2, 4, TORCH_RUNTIME)
    with pytest.raises(LayoutError, match="in rounds of pp_size=4"):
        pipeline_of({"microbatches": 6, "schedule": "interleaved-1f1b"}, 6, 4, TORCH_RUNTIME)
    with pytest.raises(LayoutError, match="microbatches=4 does not divide the micro-batch of 2 sequences"):
        pipeline_of({}, 2, 4, DEEPSPEED_RUNTIME)
    assert pipeline_of({"microbatches": 2}, 2, 4, DEEPSPEED_RUNTIME).microbatches == 2
    assert pipeline_of({"microbatches": 2, "schedule": "gpipe"}, 2, 4, TORCH_RUNTIME).microbatches == 2
    assert pipeline_of({}, 2, 4).microbatches == 2  # one sequence each


def test_the_default_plan_feeds_a_torch_pipeline_a_micro_batch_a_stage_and_says_so() -> None:
    """Without a global batch, a pipeline given one sequence a data-parallel rank (micro_batch=1) runs
    one for each stage (torch's 1F1B refuses fewer), and the plan says its step takes more; with a
    global batch given, that batch holds."""
    cfg = PlanConfig(model="llama3.1-70b", gpus=64, seq_len=8192, micro_batch=1, strategies=["zero1-tp"])
    q = question(cfg)
    (plan,), _ = plan_all(["zero1-tp"], q)
    options = plan.backend.options
    assert plan.layout.pp > 1 and options["microbatches"] >= plan.layout.pp
    line = pipeline_line(plan, q)
    assert (
        f"it takes {options['microbatches']} sequences a data-parallel rank a step where the question gives 1" in line
    )
    assert "No global batch given" in line
    given = question(replace(cfg, batch_size=8, micro_batch=None))  # one sequence for each of 8 data-parallel ranks
    (held,), _ = plan_all(["zero1-tp"], given)
    assert held.layout.pp == 1 or held.backend.options["microbatches"] * held.layout.data_parallel == 8


def test_with_no_batch_given_every_layout_takes_one_sequence_a_gpu() -> None:
    """Neither batch_size= nor micro_batch=: the global batch is one sequence a GPU for every layout, so
    a tensor-parallel group takes its GPUs' sequences and a pipeline runs its data-parallel rank's share
    as micro-batches, each step the same tokens whatever the strategy."""
    q = question(PlanConfig(model="llama3.1-70b", gpus=64, seq_len=8192, activation_checkpointing="full"))
    assert q.global_batch == 64
    plans, _ = plan_all(["fsdp", "fsdp-tp", "zero1-tp", "zero1-pp"], q)
    for plan in plans:
        sequences = plan.micro_batch * plan.grad_accum * plan.layout.data_parallel
        assert sequences == 64, plan.name
        if plan.layout.pp > 1:
            assert plan.backend.options["microbatches"] * plan.layout.data_parallel == 64
            assert pipeline_line(plan, q) is None or "No global batch given" not in pipeline_line(plan, q)


def test_a_pipeline_strategy_whose_own_default_cannot_take_the_batch_gets_the_fewest_stages_that_do() -> None:
    """zero1-pp's default (a stage per node, a micro-batch a stage) does not divide 9 sequences; the
    default plan lays it over the fewest stages that fit and take them (DeepSpeed runs fewer
    micro-batches than stages)."""
    q = question(PlanConfig(model="gpt2-1.5b", gpus=16, batch_size=9))
    with pytest.raises(LayoutError):
        plan_strategy("zero1-pp", q)
    plans, not_planned = plan_all(["zero1-pp", "fsdp-pp"], q, asked=False)
    (plan,) = plans
    assert plan.name == "zero1-pp" and plan.fits and plan.backend.options["microbatches"] == 9
    assert plan.layout.data_parallel * plan.backend.options["microbatches"] == 9
    assert "fsdp-pp" in not_planned


def test_bad_pipeline_options_are_one_line_errors() -> None:
    with pytest.raises(LayoutError, match="not a multiple"):
        Pipeline(4, 6, "interleaved-1f1b", 2)
    with pytest.raises(LayoutError, match="not a pipeline schedule"):
        Pipeline(4, 8, "pipedream")
    with pytest.raises(LayoutError, match="microbatches=3 does not divide the micro-batch of 8 sequences"):
        pipeline_of({"microbatches": 3}, 8, 4)
    assert pipeline_of({}, 8, 4).microbatches == 4  # torchtitan's default: one per stage
    assert pipeline_of({}, 6, 4).microbatches == 6


def test_stage_holds_its_blocks_with_the_head_and_not_a_second_table() -> None:
    q, _ = _plan()
    pipe = Pipeline(3, 3, "1f1b")
    layers = stage_layers(8, pipe)
    assert layers == 3
    stage = stage_shape(q.shape, layers)
    assert stage.dims.layers == 3
    # The head and the final norm; the embedding's table, as large as the head's, is another stage's.
    table = q.shape.dims.vocab * q.shape.dims.width
    assert stage.root_params() == q.shape.root_params() - table
    assert stage.params == q.shape.root_params() - table + sum(q.shape.block_params()[:3])


def test_stage_memory_holds_the_micro_batches_in_flight() -> None:
    q, plain = _plan(tp_size=2)
    _, one_f = _plan(tp_size=2, pp_size=4, schedule="1f1b", microbatches=8)
    _, gpipe = _plan(tp_size=2, pp_size=4, schedule="gpipe", microbatches=8)
    assert one_f.layout.pp == gpipe.layout.pp == 4
    # FSDP inside a stage: its parameters over the stage's 2 data-parallel ranks, against the whole
    # model's over 8; the peak grows with the micro-batches in flight.
    stage = stage_shape(q.shape, 2)
    held = one_f.states_on()["optimizer"] / plain.states_on()["optimizer"]
    assert held == pytest.approx((stage.params / 2) / (q.shape.params / 8), rel=0.01)
    assert gpipe.peak_bytes > one_f.peak_bytes
    # 2 blocks on every GPU: GPipe holds all 8 micro-batches on each; under 1F1B the first holds 4
    # and the last 1 with the head's logits, which outweigh the first's 3 more here, so the peak is
    # the last GPU's.
    assert one_f.activations.head > 0
    assert gpipe.activations.blocks == pytest.approx(8 * one_f.activations.blocks, rel=1e-6)


def test_micro_batches_in_flight_by_rank() -> None:
    # Megatron-LM's warm-up: p - rank - 1 forwards, then one more before the first backward.
    assert [Pipeline(4, 16, "1f1b").in_flight_at(r) for r in range(4)] == [4, 3, 2, 1]
    assert Pipeline(4, 2, "1f1b").in_flight_at(1) == 2
    # Interleaved: 2(p - rank - 1) + (v - 1)p + 1 chunks of 1/v; the last rank (v - 1)p + 1.
    assert Pipeline(4, 16, "interleaved-1f1b", 2).in_flight_at(3) == pytest.approx(2.5)
    assert Pipeline(4, 16, "gpipe").in_flight_at(3) == 16


def test_each_gpu_of_a_pipeline_holds_its_own_tables() -> None:
    q, _ = _plan()
    table = q.shape.dims.vocab * q.shape.dims.width
    blocks = sum(q.shape.block_params()[:2])
    first, middle, last = (stage_shape(q.shape, 2, position) for position in ("first", "middle", "last"))
    # An untied llama: the embedding's table on the first GPU, the final norm and the head's on the
    # last, blocks alone between.
    assert first.params == blocks + table
    assert middle.params == blocks
    assert last.params == blocks + q.shape.root_params() - table
    assert first.dims.layers == middle.dims.layers == last.dims.layers == 2


def test_1f1b_steady_state_moves_at_the_slowest_gpus_compute_and_exchanges() -> None:
    """Megatron-LM's 1F1B pairs each send with a receive: the first and last GPUs wait on one
    exchange a micro-batch, one between two others on two."""
    four, two = Pipeline(4, 8, "1f1b"), Pipeline(2, 8, "1f1b")
    assert four.steady_exchange_wait(None, 0.01) == pytest.approx(0.02)  # split unknown: a GPU between
    assert two.steady_exchange_wait(None, 0.01) == pytest.approx(0.01)
    # Balanced stages: the GPU between sets the pace with its two exchanges.
    assert four.steady_exchange_wait((1.0, 1.0, 1.0), 0.01) == pytest.approx(0.02)
    # A last stage heavier by the head than its exchanges: its one exchange is all the wait.
    assert four.steady_exchange_wait((1.0, 1.0, 1.5), 0.01) == pytest.approx(0.01)
    # Heavier by less than one exchange: the GPU between still paces it.
    assert four.steady_exchange_wait((1.0, 1.0, 1.005), 0.01) == pytest.approx(0.015)


def test_the_slowest_gpu_idles_for_the_others_work() -> None:
    """The fill and the drain are the other GPUs' forwards and backwards of one micro-batch."""
    four = Pipeline(4, 8, "1f1b")
    assert four.idle_share(None) == 1.0
    assert four.idle_share((1.0, 1.0, 1.0)) == pytest.approx(1.0)
    # The head doubles the last GPU's work: it idles for three of the others', (p - 1) halves of its own.
    assert four.idle_share((1.0, 1.0, 2.0)) == pytest.approx(3 / 6)
    assert Pipeline(2, 8, "1f1b").idle_share((0.5, 0.0, 1.0)) == pytest.approx(0.5)


def test_the_bubble_is_said_as_a_share_or_as_a_multiple_past_the_work() -> None:
    assert micro_batches(1) == "1 micro-batch" and micro_batches(8) == "8 micro-batches"
    assert idle_words(0.09) == "9% of the slowest GPU's micro-batch work idle"
    # One micro-batch over 64 stages: the fill and drain are 63 micro-batches of the others' work.
    assert idle_words(Pipeline(64, 1, "1f1b").bubble) == "idle 63.0x as long as the slowest GPU's micro-batch work"


def test_boundary_traffic_on_the_right_link() -> None:
    assert boundary_bytes(2, 4096, 1024, 2, 2) == 2 * 4096 * 1024 * 2 / 2
    _, in_node = _plan(pp_size=4, tp_size=1, gpus=4, schedule="1f1b", microbatches=8)
    _, across = _plan(pp_size=4, tp_size=2, schedule="1f1b", microbatches=8)
    sends = [c for c in in_node.collectives if "pipeline stages" in c.what]
    assert sends and "NVLink" in sends[0].what and sends[0].group.nodes == 1
    sends = [c for c in across.collectives if "pipeline stages" in c.what]
    assert sends and "network" in sends[0].what and sends[0].group.nodes == 2
    # Activations forward and gradients back for each of the 8 micro-batches of 1 sequence.
    assert sends[0].payload_bytes == pytest.approx(2 * 8 * boundary_bytes(1, 4096, 1024, 2, 2))


def test_interleaving_halves_the_bubble_on_the_step() -> None:
    _, one_f = _plan(tp_size=2, pp_size=4, schedule="1f1b", microbatches=8)
    _, inter = _plan(tp_size=2, pp_size=4, schedule="interleaved-1f1b", microbatches=8)
    assert one_f.time.bubble_s > inter.time.bubble_s > 0 and "4 stages" in one_f.time.bubble_what
    assert inter.time.tokens_per_s > one_f.time.tokens_per_s


def test_the_bubble_idles_each_micro_batchs_tensor_parallel_collectives_with_its_compute() -> None:
    q, one_f = _plan(tp_size=2, pp_size=4, schedule="1f1b", microbatches=8)
    t = one_f.time
    # The stage's tensor-parallel collectives run in every micro-batch's critical path, on the last GPU
    # all but the embedding's call of each (every call priced alike).
    tp = [c for c in one_f.collectives if c.what.startswith("tensor-parallel")]
    per_step = sum(c.seconds(q.topology, 1.0) * (c.calls - 1) / c.calls for c in tp) * 8
    # 1F1B waits on its exchanges with its neighbours: the last GPU, heavier by the head, on one a
    # micro-batch, a GPU between on two (test_1f1b_steady_state_moves_at_the_slowest_gpus_...).
    sends = next(c for c in one_f.collectives if "pipeline stages" in c.what)
    one_send = collective_seconds(q.topology, sends.group, "broadcast", sends.payload_bytes / sends.calls)
    assert sends.per_micro_step and one_send > 0 and per_step > 0
    exchanges = t.recurring_comm_s - per_step
    assert 8 * one_send * (1 - 1e-9) <= exchanges <= 2 * 8 * one_send * (1 + 1e-9)
    # The stage runs FSDP without resharding (pipeline_context.py), its backend's work each micro-batch.
    backend = overhead_per_micro_step(replace(one_f.backend, reshard_after_forward=False), q.factors) * 8
    # Each micro-batch's length: its compute, its critical-path collectives, its wait on the host.
    work = t.compute_s - t.work.optimizer_s * q.factors.compute_scale + t.recurring_comm_s + t.host_wait_s
    assert t.overhead_s == pytest.approx(backend)
    # The last GPU, slowest by the head and the loss, idles for the others' work of a micro-batch:
    # less than p - 1 of its own (test_the_slowest_gpu_idles_for_the_others_work), more than half.
    full = Pipeline(4, 8, "1f1b").bubble * work
    assert 0.5 * full < t.bubble_s < full


def test_context_parallel_splits_activations_and_shards_over_dp_and_cp() -> None:
    _, plain = _plan("fsdp", micro_batch=1)
    _, cp = _plan("fsdp", micro_batch=1, cp_size=4)
    assert cp.layout.cp == 4 and cp.layout.data_parallel == 4 and cp.layout.shard == 16
    assert cp.activations.blocks == pytest.approx(plain.activations.blocks / 4, rel=0.01)
    assert cp.states_on()["optimizer"] == pytest.approx(plain.states_on()["optimizer"], rel=0.01)
    exchanges = [c for c in cp.collectives if "all-to-all" in c.what]
    assert exchanges and exchanges[0].group.size == 4 and exchanges[0].window is None


def test_ring_attention_hides_behind_attention() -> None:
    _, ulysses = _plan("fsdp", micro_batch=1, cp_size=4, seq_len=32768)
    _, passed = _plan("fsdp", micro_batch=1, cp_size=4, seq_len=32768, cp_attention="ring", cp_rotate="alltoall")
    _, gathered = _plan("fsdp", micro_batch=1, cp_size=4, seq_len=32768, cp_attention="ring")
    assert any("ring attention" in c.what for c in passed.collectives)
    assert passed.time.exposed_comm_s < ulysses.time.exposed_comm_s
    # torch's default rotate method gathers k and v beside the first of the cp sub-steps only
    assert any("allgather rotate method" in c.what for c in gathered.collectives)
    assert gathered.time.exposed_comm_s >= passed.time.exposed_comm_s


def test_torchs_ring_moves_k_and_v_at_the_query_heads_width_and_their_gradients_in_fp32() -> None:
    from harness.plan.parallel.pipeline_context import GATHERED_KV, GATHERED_KV_GRADS

    # torch's ring (a torch strategy's): SMALL_LLAMA's 4 key/value heads repeated to its 16 query heads
    q, gathered = _plan("fsdp", micro_batch=1, cp_size=4, seq_len=32768, cp_attention="ring")
    dims = q.shape.dims
    assert dims.q_width == 4 * dims.kv_width
    local = 1 * 32768 // 4 * 2 * dims.q_width * 2  # a GPU's k and v in bf16, at the query heads' width
    by_what = {c.what: c for c in gathered.collectives}
    assert by_what[GATHERED_KV].payload_bytes == pytest.approx(local * 4 * by_what[GATHERED_KV].calls)
    assert by_what[GATHERED_KV_GRADS].payload_bytes == pytest.approx(local * 2 * by_what[GATHERED_KV_GRADS].calls)
    # TransformerEngine's ring (a published Megatron run's): the key/value heads, gradients in bf16
    q, _ = _plan()
    sharding = "megatron tp=2 cp=2 dp=4 distributed_optimizer"
    model, options = published_layout(sharding, True)
    megatron = plan_backend(filled_in(backend_of(model, sharding, options), q.shape, "bf16", q.gpus, options), q)
    passes = next(c for c in megatron.collectives if c.what.startswith("ring attention k and v passes"))
    one = 8 * 4096 // 2 * 2 * dims.kv_width * 2 / 2  # micro-batch 8, half the sequence, bf16, over tp 2
    assert passes.payload_bytes == pytest.approx(one * 3 * passes.calls)  # forward, backward, gradients


def test_ulysses_moves_at_least_a_key_value_head_for_each_gpu() -> None:
    # SMALL_LLAMA's 4 key/value heads over 8 GPUs: each repeated to 8 before the exchange
    q, eight = _plan("fsdp", micro_batch=1, cp_size=8, seq_len=32768, gpus=16)
    q, four = _plan("fsdp", micro_batch=1, cp_size=4, seq_len=32768, gpus=16)
    dims = q.shape.dims
    exchange = {
        plan.layout.cp: next(c for c in plan.collectives if "all-to-all q, k, v" in c.what) for plan in (eight, four)
    }
    per_token = {cp: c.payload_bytes / c.calls * ULYSSES_EXCHANGES / (32768 // cp) for cp, c in exchange.items()}
    assert per_token[4] == pytest.approx((2 * dims.q_width + 2 * dims.kv_width) * 2)
    assert per_token[8] == pytest.approx((2 * dims.q_width + 2 * 8 * dims.head_dim) * 2)


def test_pp_and_cp_only_for_fsdp2_and_must_divide() -> None:
    _, zero3 = _plan("zero3", pp_size=2, cp_size=2)
    assert (zero3.layout.pp, zero3.layout.cp) == (1, 1)  # left, as tp_size by a strategy without it
    # The run's own words (strategies/parallel_dims.py), from the planner as from preflight.
    with pytest.raises(LayoutError, match="fsdp: strategy_options.pp_size=3 does not divide the world size 16"):
        _plan("fsdp", pp_size=3)
    with pytest.raises(LayoutError, match="seq_len=4098 does not split into cp_size=4 slices"):
        _plan("fsdp", cp_size=4, seq_len=4098)


def test_published_layouts_read_as_options() -> None:
    assert published_options("FSDP2 dp_shard=8 cp=1") is None
    assert published_options("FSDP2 dp_shard=8 tp=8 pp=8 async_tp schedule=Interleaved 1F1B") == {
        "pp_size": 8,
        "cp_size": 1,
        "tp_size": 8,
        "async_tp": True,
        "schedule": "interleaved-1f1b",
        "microbatches": 8,
    }
    model, options = published_layout("FSDP2 dp_shard=4 cp=2", True)
    assert not model.tensor_parallel and options["cp_size"] == 2 and options["cp_attention"] == "ring"
    megatron, options = published_layout("megatron tp=4 pp=8 vp=6 dp=4 distributed_optimizer", True)
    assert megatron.pipeline_engine and megatron.stage == 1 and megatron.tensor_parallel
    assert not megatron.sequence_parallel  # not named: Megatron-LM's default, every GPU runs the whole residual stream
    assert options == {
        "tp_size": 4,
        "distributed_optimizer": True,
        "megatron_engine": True,
        "pp_size": 8,
        "schedule": "interleaved-1f1b",
        "virtual_stages": 6,
    }
    _, exposed = published_layout("megatron tp=4 pp=8 dp=4 distributed_optimizer", True, overlap_dp=False)
    assert not exposed["overlap_grad_reduce"] and not exposed["overlap_param_gather"]
    _, named = published_layout("megatron tp=4 pp=8 dp=4 distributed_optimizer overlap_grad_reduce", True, False)
    assert named["overlap_grad_reduce"] and not named["overlap_param_gather"]  # a flag the layout names wins
    assert published_layout("megatron tp=8 pp=2 dp=32 ddp", True)[1]["schedule"] == "1f1b"
    megatron_cp, options = published_layout("megatron tp=4 pp=4 vp=5 cp=2 dp=2 distributed_optimizer", True)
    assert megatron_cp.context_parallel_engine and megatron_cp.pipeline_engine
    assert options["cp_size"] == 2 and options["cp_attention"] == "ring" and options["virtual_stages"] == 5
    assert published_layout("megatron tp=8 dp=32 ddp", True) is None  # no pipeline: planned as ddp-tp


def test_megatron_context_parallel_splits_sequences_and_reduces_over_data_and_context_ranks() -> None:
    """Megatron-LM's cp beside its tensor and data parallelism: each GPU keeps half the sequence's
    activations, passes k and v around the ring, and reduces gradients over dp x cp GPUs."""
    q, _ = _plan()
    plans = {}
    for cp, dp in ((1, 8), (2, 4)):
        sharding = f"megatron tp=2 cp={cp} dp={dp} distributed_optimizer"
        model, options = published_layout(sharding, True) or megatron_layout(sharding)
        backend = filled_in(backend_of(model, sharding, options), q.shape, "bf16", q.gpus, options)
        plans[cp] = plan_backend(backend, q)
    one, two = plans[1], plans[2]
    assert (two.layout.cp, two.layout.data_parallel, two.layout.shard) == (2, 4, 8)
    assert two.activations.blocks == pytest.approx(one.activations.blocks / 2, rel=0.01)
    assert two.states == one.states  # the optimizer state sharded over all 8 GPUs either way
    assert two.time.wire_bytes > one.time.wire_bytes / 2  # the ring's k, v beside half the gradient traffic


def test_search_includes_pipeline_and_context_parallel_layouts() -> None:
    cfg = PlanConfig(
        **SMALL_LLAMA,
        gpus=8,
        gpus_per_node=4,
        seq_len=16384,
        global_batch_tokens="256K",
        search=True,
        strategies=["fsdp-pp", "fsdp-cp"],
    )
    q, global_batch = search_question(cfg)
    result = search(q, strategy_names(cfg, q.gpus), global_batch)
    found = result.ranked + result.too_large
    assert any(s.plan.layout.pp > 1 for s in found)
    assert any(s.plan.layout.cp > 1 for s in found)
    assert {s.plan.layout.pp * s.plan.layout.cp * s.plan.layout.tp * s.plan.layout.data_parallel for s in found} == {8}


def test_405b_on_1024_h100_ranks_pipelines_against_zero3(layout_strategies) -> None:
    # test-fsdp-tp-pp-cp takes tp, pp and cp sizes at once, as torchtitan's composed mesh does.
    cfg = PlanConfig(
        model="llama3.1-405b",
        gpus=1024,
        seq_len=8192,
        global_batch_tokens="16M",
        search=True,
        strategies=["zero3", "test-fsdp-tp-pp-cp"],
        strategy_options={"tp_size": 8, "schedule": "interleaved-1f1b"},
    )
    q, global_batch = search_question(cfg)
    result = search(q, strategy_names(cfg, q.gpus), global_batch)
    best = result.ranked[0]
    pipelined = [s for s in result.ranked if s.plan.layout.pp > 1]
    assert pipelined and any(s.strategy == "zero3" for s in result.ranked)
    loser = pipelined[0] if pipelined[0] is not best else next(s for s in result.ranked if s.strategy == "zero3")
    reason = why_slower(loser, best, q.factors.compute_scale).describe()
    assert "slower" in reason
    if loser.plan.layout.pp > 1 and "bubble" in reason:
        assert "stages" in reason and "micro-batches" in reason


def test_registered_fsdp_pp_and_fsdp_cp_are_priced_with_their_meshes_defaults() -> None:
    cfg = PlanConfig(**SMALL_LLAMA, gpus=16, gpus_per_node=8, seq_len=4096, micro_batch=4)
    q = question(cfg)
    pipelined, context = plan_strategy("fsdp-pp", q), plan_strategy("fsdp-cp", q)
    assert pipelined.layout.pp == 2 and pipelined.time.bubble_s > 0  # a stage per node
    # A node's GPUs, each of the 4 key/value heads repeated for two: the run's default (dims_for).
    assert context.layout.cp == 8 and context.layout.data_parallel == 2


def test_deepspeeds_pipeline_engine_is_planned_with_its_one_schedule() -> None:
    cfg = PlanConfig(**SMALL_LLAMA, gpus=16, gpus_per_node=8, seq_len=4096, micro_batch=4)
    q = question(cfg)
    pipelined, flat = plan_strategy("zero1-pp", q), plan_strategy("zero1", q)
    assert pipelined.layout.pp == 2 and pipelined.layout.cp == 1 and pipelined.time.bubble_s > 0
    assert pipelined.peak_bytes < flat.peak_bytes  # half the layers' weights and gradients per stage
    _, zero1 = _plan("zero1", pp_size=2)
    assert zero1.layout.pp == 1  # plain ZeRO-1 takes no stages
    search_cfg = PlanConfig(
        **SMALL_LLAMA,
        gpus=8,
        gpus_per_node=4,
        seq_len=16384,
        global_batch_tokens="256K",
        search=True,
        strategies=["zero1-pp"],
    )
    sq, global_batch = search_question(search_cfg)
    result = search(sq, strategy_names(search_cfg, sq.gpus), global_batch)
    searched = result.ranked + result.too_large
    found = [s.plan for s in searched]
    assert any(p.layout.pp > 1 for p in found) and all(p.layout.cp == 1 for p in found)
    assert {p.backend.options.get("schedule") for p in found if p.layout.pp > 1} == {"1f1b"}
    assert not any("schedule" in s.options for s in searched)  # the name fixes it: a run refuses it set


def test_megatron_copies_nothing_per_micro_step_and_exposes_what_it_does_not_overlap() -> None:
    """Megatron-LM's own buffers: no per-micro-step copies of parameters or gradients, so its
    micro-steps are shorter than replicate's; without its overlap flags the distributed
    optimizer's reduce-scatter and gather run after the compute."""
    q, _ = _plan()
    plans = {}
    for overlap in (True, False):
        model, options = megatron_layout("megatron tp=2 dp=8 distributed_optimizer sequence_parallel", overlap)
        backend = filled_in(backend_of(model, "megatron", options), q.shape, "bf16", q.gpus, options)
        plans[overlap] = plan_backend(backend, q)
    replicate = plan_strategy("zero1-tp", replace(q, strategy_options={"tp_size": 2}))
    assert plans[True].time.work.elementwise_s < replicate.time.work.elementwise_s
    windows = {c.what: c.window for c in plans[False].collectives if "updated" in c.what or "gradients" in c.what}
    assert windows == {"reduce-scatter gradients": None, "all-gather updated parameters": None}
    assert plans[False].time.exposed_comm_s > plans[True].time.exposed_comm_s


def test_fsdp_pp_takes_a_stage_per_node_but_never_more_stages_than_blocks() -> None:
    cfg = PlanConfig(**SMALL_LLAMA, gpus=128, gpus_per_node=8, seq_len=4096, micro_batch=8)
    pipelined = plan_strategy("fsdp-pp", question(cfg))
    assert pipelined.layout.pp == 8  # 16 nodes, 8 blocks: the most stages the blocks allow that divide 128


def _llama_405b(strategy: str) -> Question:
    return question(
        PlanConfig(
            model="llama3.1-405b",
            gpus=1024,
            seq_len=8192,
            batch_size=2048,
            micro_batch=1,
            activation_checkpointing="full",
            strategies=[strategy],
            strategy_options={"tp_size": 8},
        )
    )


def test_the_default_plan_gives_a_layout_too_large_without_stages_the_fewest_that_fit(layout_strategies) -> None:
    """Megatron's rule (tensor parallel in the node, then the fewest pipeline stages that fit):
    405B under ZeRO-1 beside TP 8 does not fit on 1,024 H100s without a pipeline; where the strategy
    takes stages, the default plan lays it over the fewest that fit, its accumulation as the
    pipeline's micro-batches."""
    name = "test-zero1-tp-pp"
    q = _llama_405b(name)
    flat = plan_strategy(name, q)
    (plan,), _ = plan_all([name], q)
    assert flat.fits is False and plan.fits and plan.layout.pp > 1
    options = plan.backend.options
    assert options["microbatches"] == 2048 // plan.layout.data_parallel  # one sequence each, one schedule a step
    fewer = [d for d in range(2, plan.layout.pp) if (1024 // 8) % d == 0]
    for stages in fewer:
        local = 2048 // (1024 // (8 * stages))  # the data-parallel rank's share, one schedule a step
        staged = {"tp_size": 8, "pp_size": stages, "microbatches": local}
        smaller = plan_strategy(name, replace(q, micro_batch=local, grad_accum=1, strategy_options=staged))
        assert smaller.layout.pp == stages and smaller.fits is False
    line = pipeline_line(plan, q)
    assert line and f"{plan.layout.pp} stages" in line
    assert plan_all([name], replace(q, strategy_options={"tp_size": 8, "pp_size": 1}))[0][0].layout.pp == 1


def test_the_default_plan_gives_no_stages_to_a_strategy_that_takes_none(layout_strategies) -> None:
    """A tensor-parallel strategy without pp_size (the registry's: its runtime has no pipeline) is
    offered no layout a run could not use, and is said not to fit; zero1-tp, whose mesh takes
    stages, is given the fewest that fit, as Megatron-LM's layout."""
    q = _llama_405b("test-fsdp-tp")
    (plan,), _ = plan_all(["test-fsdp-tp"], q)
    assert plan.layout.pp == 1 and plan.fits is False and pipeline_line(plan, q) is None
    q = _llama_405b("zero1-tp")
    (plan,), _ = plan_all(["zero1-tp"], q)
    assert plan.layout.pp > 1 and plan.fits and pipeline_line(plan, q)


def test_the_search_runs_a_pipeline_as_one_schedule_a_step(layout_strategies) -> None:
    """Megatron's semantics: a pipelined layout's accumulation is its micro-batches, one flush a step,
    in micro-batches of 1, 2, 4 or 8 sequences; at least as many as the stages (a multiple of them for
    the interleaved schedule)."""
    assert pipeline_splits(512, 8, 4, "1f1b") == [(BatchSplit(64, 1), m) for m in (64, 32, 16, 8)]
    assert pipeline_splits(64, 8, 4, "interleaved-1f1b") == [(BatchSplit(8, 1), 8), (BatchSplit(8, 1), 4)]
    assert pipeline_splits(64, 8, 4, "1f1b", fixed=2) == []  # fewer micro-batches than stages
    cfg = PlanConfig(**SMALL_LLAMA, gpus=16, gpus_per_node=4, seq_len=4096, global_batch_tokens="1M", search=True)
    q, global_batch = search_question(cfg)
    result = search(q, ["test-zero1-tp-pp"], global_batch)
    pipelined = [s for s in result.ranked + result.too_large if s.plan.layout.pp > 1]
    assert pipelined and all(s.grad_accum == 1 for s in pipelined)
    for s in pipelined:
        assert s.micro_batch * s.plan.layout.data_parallel == global_batch
        assert s.options["microbatches"] >= s.plan.layout.pp


def test_megatron_without_sequence_parallelism_runs_the_residual_stream_whole_on_each_gpu() -> None:
    """Megatron-LM without --sequence-parallel (before 2022): the norms and residual adds over the
    whole sequence on every tensor-parallel GPU, and their saved inputs whole too."""
    q, _ = _plan()
    plans = {}
    for sp in ("", " sequence_parallel"):
        sharding = f"megatron tp=4 dp=4 distributed_optimizer{sp}"
        model, options = megatron_layout(sharding)
        backend = filled_in(backend_of(model, sharding, options), q.shape, "bf16", q.gpus, options)
        plans[bool(sp)] = plan_backend(backend, q)
    assert plans[False].time.work.elementwise_s > plans[True].time.work.elementwise_s
    assert plans[False].activations.blocks > plans[True].activations.blocks
    assert plans[False].time.work.matmul_s == plans[True].time.work.matmul_s


@pytest.mark.parametrize(
    "model,gpu", [("llama3.1-70b", "H100"), ("llama3.1-405b", "A100-40"), ("llama3.1-8b", "GB200")]
)
def test_an_interleaved_pipeline_holds_at_least_what_1f1b_holds(model: str, gpu: str) -> None:
    """The default plan's memory-only searches for the fewest stages plan 1F1B alone (pipeline_default._fewest):
    that holds only while interleaving never fits where 1F1B does not, on every stage count and strategy."""
    from harness.plan.parallel.pipeline_default import _pipelined

    q = replace(question(PlanConfig(model=model, gpus=64, seq_len=8192, gpu=gpu)), timed=False)
    pairs = 0
    for name in ("fsdp-pp", "zero1-pp", "fsdp-tp", "zero1-tp"):
        for stages in (2, 4, 8, 16):
            one, looped = (_pipelined(name, q, stages, schedule) for schedule in ("1f1b", "interleaved-1f1b"))
            if one is None or looped is None:
                continue
            pairs += 1
            assert looped.peak_bytes >= one.peak_bytes and not (looped.fits and not one.fits), (name, stages)
    assert pairs >= 8
