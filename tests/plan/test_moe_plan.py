"""Mixtures of experts in the planner: shapes read offline held to the models transformers and the zoo
build, the experts' states held to what ddp-ep, zero1-ep and zero2-ep (and fsdp, zero1 without expert
parallel) hold on two ranks, the runtime's refusals of an expert-parallel size, the all-to-all's
price, what expert parallel and load imbalance change, and the search over ep_size."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.common.hardware import gpu_spec
from harness.plan.memory.expert_memory import expert_shape
from harness.plan.model.model_catalogue import summary
from harness.plan.model.model_shape import PlanError, shape_of_spec
from harness.plan.model.moe_shape import total_params
from harness.plan.network.all_to_all import NVLINK_ALL_TO_ALL_EFFICIENCY, all_to_all_seconds
from harness.plan.network.fabric import FABRICS, Group, topology_of
from harness.plan.parallel.layout import LayoutError
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_all, plan_strategy
from harness.plan.search.layout_search import search, why_slower
from harness.plan.search.search_cli import search_question
from tests.helpers import ROOT, env_for_tests, forked_torchrun, run_bounded

MIXTRAL = dict(model="mixtral-8x7b", gpu="H100", seq_len=4096, micro_batch=1)


def _plan(name: str, **options):
    q = question(PlanConfig(**{**MIXTRAL, **options, "strategies": [name]}))
    return plan_strategy(name, q)


@pytest.mark.parametrize(
    "name,total,active",
    [
        ("mixtral-8x7b", 47, 13),  # Mixtral of Experts, arXiv 2401.04088: 47B, 13B active
        ("gpt-oss-120b", 117, 5.1),  # openai/gpt-oss README: 117B, 5.1B active (its embedding left out)
        ("gpt-oss-20b", 21, 3.6),
        ("qwen3-30b-a3b", 30.5, 3.3),  # Qwen3 model card: 30.5B, 3.3B activated
        ("qwen3-235b-a22b", 235, 22),
    ],
)
def test_the_catalogues_mixtures_of_experts_have_their_published_counts(name, total, active):
    s = summary(name).shape
    d = s.dims
    embedding = d.vocab * d.width if name.startswith("gpt-oss") else 0

    def stated_as(count: float, stated: float) -> bool:  # to the figure's last digit, rounded or cut
        return abs(count / 1e9 - stated) < (1 if stated == int(stated) else 0.1)

    assert stated_as(total_params(s), total)
    assert stated_as(s.flops_params - embedding, active)


@pytest.mark.parametrize(
    "spec,kwargs",
    [
        ("hf:MixtralConfig", {"num_hidden_layers": 2}),
        ("hf:Qwen3MoeConfig", {"num_hidden_layers": 2, "head_dim": 128}),
        ("hf:Qwen2MoeConfig", {"num_hidden_layers": 2}),
        ("hf:OlmoeConfig", {"num_hidden_layers": 2}),
        ("hf:GptOssConfig", {"num_hidden_layers": 2}),
    ],
)
def test_hf_mixtures_of_experts_read_offline_are_the_built_models(spec, kwargs):
    import torch
    import transformers

    config = getattr(transformers, spec[3:])(**kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    built = sum(p.numel() for p in model.parameters())
    shape = shape_of_spec(spec, kwargs)
    assert total_params(shape) == built
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert shape.dims.moe.routed_params(shape.dims.width) == experts


def test_the_zoos_moe_presets_are_the_models_they_build():
    import torch

    from models.zoo import build_model

    for name in ("moe-nano", "moe-micro"):
        with torch.device("meta"):
            model = build_model(name, {})
        shape = shape_of_spec(name)
        assert total_params(shape) == sum(p.numel() for p in model.parameters())
        assert shape.flops_params == model.num_params()  # the active parameters, positions left out


def test_unread_families_are_one_line():
    with pytest.raises(PlanError, match="DeepSeek-V2's routing") as err:
        shape_of_spec("hf:DeepseekV2Config")
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, int]]:
    """What each strategy holds on two CPU ranks training moe-nano (tests/plan_worker.py), max over ranks."""
    path = Path(__import__("tempfile").mkdtemp()) / "measured.json"
    names = ("ddp-ep", "zero1-ep", "zero2-ep", "fsdp", "zero1")
    cmd = forked_torchrun(
        2, ROOT / "tests" / "plan_worker.py", str(path), "moe-nano", "{}", ",".join(names), "fp32,bf16", backends=names
    )
    proc = run_bounded(cmd, timeout=420, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads(Path(f"{path}.world2.rank{r}").read_text()) for r in range(2)]
    return {
        k: {c: max(sum(r[k][c].values()) for r in ranks) for c in ("params", "grads", "optimizer")} for k in ranks[0]
    }


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["ddp-ep", "zero1-ep", "zero2-ep", "fsdp", "zero1"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_expert_states_are_what_each_strategy_holds(measured, name, precision):
    q = question(PlanConfig(model="moe-nano", gpus=2, precision=precision, strategies=[name]))
    states = plan_strategy(name, q).states
    for category, want in measured[f"{name}/{precision}"].items():
        assert states.total(category) == want, (name, precision, category)


def test_a_bad_ep_size_is_refused_in_the_runtimes_words():
    with pytest.raises(
        LayoutError,
        match=r"ep_size=3 does not divide the model's 8 experts: use strategy_options.ep_size=1 or 2 or 4 or 8",
    ):
        _plan("ddp-ep", gpus=24, strategy_options={"ep_size": 3})
    with pytest.raises(LayoutError, match=r"strategy_options.ep_size=16 does not divide the world size 8"):
        _plan("zero1-ep", gpus=8, strategy_options={"ep_size": 16})
    with pytest.raises(LayoutError, match="has none"):
        plan_strategy("ddp-ep", question(PlanConfig(model="gpt2-124m", gpus=8, strategies=["ddp-ep"])))
    # The strategy's own size is said to be its default, and what to use instead divides the GPUs too.
    kimi = question(PlanConfig(model="kimi-k2", gpus=512, seq_len=4096, strategies=["zero1-ep"]))
    with pytest.raises(LayoutError) as refused:
        plan_strategy("zero1-ep", kimi)
    said = str(refused.value)
    assert "the default ep_size=512 (every data-parallel GPU) does not divide the model's 384 experts" in said
    assert said.endswith("use strategy_options.ep_size=1 or 2 or 4 or 8 or 16 or 32 or 64 or 128")


def test_a_dense_model_leaves_the_expert_parallel_strategies_out_unless_asked():
    q = question(PlanConfig(model="gpt2-124m", gpus=8))
    plans, not_planned = plan_all(["ddp", "ddp-ep", "zero1-ep"], q, asked=False)
    assert [p.name for p in plans] == ["ddp"] and not not_planned


def test_tensor_parallel_beside_a_mixture_is_refused_as_not_planned():
    with pytest.raises(LayoutError, match="beside a mixture of experts is not planned yet"):
        _plan("fsdp-tp", gpus=8, strategy_options={"tp_size": 2})


def test_expert_parallel_shards_the_experts_and_reduces_them_over_their_own_group():
    ep8 = _plan("zero1-ep", gpus=64, strategy_options={"ep_size": 8})
    ep4 = _plan("zero1-ep", gpus=64, strategy_options={"ep_size": 4})
    assert (ep8.layout.experts.ep, ep8.layout.experts.edp) == (8, 8)
    assert ep8.states.total("params") < ep4.states.total("params")  # each GPU holds fewer experts
    reduced = [c for c in ep8.collectives if "holding the same" in c.what]
    assert reduced and all(c.group.size == 8 for c in reduced)
    exchanged = [c for c in ep8.collectives if c.kind == "all-to-all"]
    assert exchanged and exchanged[0].group == Group(8, 1)  # eight neighbours: one node
    # ddp-ep's replicate all-reduces each block's experts during the backward, over the two GPUs
    # (one a node) that hold the same ones; fsdp-ep gathers and reduce-scatters them there.
    ddp = _plan("ddp-ep", gpus=16, strategy_options={"ep_size": 8})
    (reduce,) = [c for c in ddp.collectives if "holding the same" in c.what]
    assert (reduce.kind, reduce.window, reduce.group) == ("all-reduce", "backward", Group(2, 2))
    fsdp = _plan("fsdp-ep", gpus=16, strategy_options={"ep_size": 8})
    kinds = {c.kind for c in fsdp.collectives if "holding the same" in c.what}
    assert kinds == {"all-gather", "reduce-scatter"}


def test_the_all_to_all_is_priced_on_nvlink_inside_a_node_and_on_the_cards_across():
    h100 = gpu_spec("H100")
    topology = topology_of(h100, 64, 8, FABRICS["ndr"])
    payload = 2**30
    inside = all_to_all_seconds(topology, Group(8, 1), payload)
    assert inside == pytest.approx(payload * 7 / 8 / (450e9 * NVLINK_ALL_TO_ALL_EFFICIENCY), rel=0.01)
    across = all_to_all_seconds(topology, Group(16, 2), payload)
    assert across > 3 * inside  # half of it on one 400G card a GPU
    assert all_to_all_seconds(topology, Group(1, 1), payload) == 0.0


def test_imbalance_slows_the_busiest_gpus_experts_and_is_named():
    cfg = dict(**MIXTRAL, gpus=64, strategies=["zero1-ep"], strategy_options={"ep_size": 8})
    balanced = plan_strategy("zero1-ep", question(PlanConfig(**cfg)))
    skewed = plan_strategy("zero1-ep", question(PlanConfig(**cfg, moe_imbalance=1.5)))
    assert skewed.time.step_s > balanced.time.step_s
    assert skewed.activations.total > balanced.activations.total
    assert skewed.time.work.expert_imbalance_s > 0 == balanced.time.work.expert_imbalance_s
    with pytest.raises(PlanError, match="moe_imbalance=0.5"):
        question(PlanConfig(**cfg, moe_imbalance=0.5))


def test_the_search_varies_ep_size_over_the_divisors_of_the_experts():
    cfg = PlanConfig(
        model="mixtral-8x7b",
        gpus=64,
        gpu="H100",
        seq_len=4096,
        global_batch_tokens="4M",
        search=True,
        strategies=["zero1-ep", "fsdp"],
    )
    q, global_batch = search_question(cfg)
    result = search(q, ["zero1-ep", "fsdp"], global_batch)
    eps = {s.plan.layout.experts.ep for s in result.ranked + result.too_large if s.strategy == "zero1-ep"}
    assert eps == {2, 4, 8}  # the divisors of 8 experts above 1 (ep 1 is zero1's layout)
    best = result.ranked[0]
    assert all(why_slower(s, best, 1.0).slower >= 0 for s in result.ranked[1:])


@pytest.mark.parametrize("name", ["fsdp-ep", "ddp-ep"])
def test_the_search_lays_out_the_torch_meshs_expert_parallel_at_tp_1(name):
    """fsdp-ep and ddp-ep take tp_size, yet their tp 1 is their own layout (their meshes name no tp), not a
    plain strategy's: the search varies their ep_size there, as plan lays them out by default."""
    cfg = PlanConfig(**{**MIXTRAL, "micro_batch": None}, gpus=64, global_batch_tokens="4M", search=True)
    q, global_batch = search_question(replace(cfg, strategies=[name]))
    result = search(q, [name], global_batch)
    eps = {s.plan.layout.experts.ep for s in result.ranked + result.too_large if s.plan.layout.tp == 1}
    assert eps == {2, 4, 8}


def test_a_mixture_of_experts_is_planned_without_torch(tmp_path):
    code = (
        "import sys, runner; runner.main(['plan', 'model=mixtral-8x7b', 'gpus=64', 'seq_len=4096', "
        "'strategies=[ddp-ep,zero1-ep,zero2-ep]', 'strategy_options.ep_size=8']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = run_bounded([sys.executable, "-c", code], timeout=60, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "46.7B params, 12.9B active" in proc.stdout and "8 experts 14336 wide, top-2" in proc.stdout


def test_a_gpus_experts_shape_holds_its_share_of_every_moe_block():
    moe = shape_of_spec("mixtral-8x7b").dims.moe
    mine = expert_shape(moe, 4096, 4, 1)
    assert mine.params == moe.routed_params(4096) // 4


def test_published_moe_runs_are_planned_with_their_expert_layout():
    from bench import plan_vs_published as published
    from bench.layout_kinds import degrees
    from bench.moe_rows import MoERowError, recompute_modules, with_experts

    rows = published.plan_rows(published.read_rows(published.DATA / "moe_runs.csv"))
    h100 = [o for o in rows if o.row["gpu"] == "H100-80"]
    assert sum(o.plan is not None for o in h100) >= 30
    for o in (o for o in rows if o.plan is not None):
        sharding = o.row["sharding"]
        assert o.plan.layout.experts.ep == degrees(sharding).ep
        stated = [int(w[4:]) for w in sharding.split() if w.startswith("edp=")]
        assert not stated or o.plan.layout.experts.edp == stated[0]
    row = next(o.row for o in rows if "recompute=layernorm+moe_act" in o.row["sharding"])
    assert recompute_modules(row) == ("layernorm", "moe_act")
    assert published.question(row)[0].checkpointing == "none"  # the modules stand for selective recomputation
    wrong = {**row, "sharding": row["sharding"].replace("edp=", "edp=9")}
    model, options = published._layout(row)
    with pytest.raises(MoERowError, match="is not GPUs / \\(ep x etp x pp\\)"):
        with_experts(wrong, model, options)


def test_published_moe_runs_carry_the_overlaps_their_quoted_configs_set():
    from bench import plan_vs_published as published

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    for row in rows:
        tokens = row["sharding"].split()
        notes = row["notes"]
        if "fp8_dot_product_attention=True" in notes:
            assert "fp8_attention" in tokens, row["source"]
        if any(s in notes for s in ("overlap_moe_expert_parallel_comm=True", "moe_a2a_overlap=True")):
            assert "a2a_overlap" in tokens, row["source"]
    # Megatron-Bridge's perf_recipes (26.06.01 on) end every GB200 and GB300 MXFP8 MoE function with a helper
    # that turns the all-to-all overlap on (qwen/common.py, gpt_oss/common.py, deepseek/common.py).
    recipes = [r for r in rows if "src/megatron/bridge/perf_recipes/" in r["notes"] and r["precision"] == "mxfp8"]
    assert len(recipes) == 16
    assert all("a2a_overlap" in r["sharding"].split() for r in recipes)
    # Every Megatron-core run but DeepSeek's own (its HAI-LLM) is on TransformerEngine's layers: the Model Zoo's
    # yamls and FlagPerf's script say so, Megatron-LM's README runs its default, Megatron-Bridge its providers.
    megatron = [r for r in rows if r["sharding"].startswith("megatron") and not r["source"].startswith("arXiv")]
    assert all("transformer_engine" in r["sharding"].split() for r in megatron)
    # The Model Zoo's attention is TransformerEngine's choice (cuDNN), its loss fused where the yaml says so.
    zoo = [r for r in rows if r["source"].startswith("yanring/Megatron-MoE-ModelZoo")]
    assert len(zoo) == 22
    for row in zoo:
        tokens = row["sharding"].split()
        assert "transformer_engine" in tokens and "attention=cudnn" in tokens, row["source"]
        assert ("fused_loss" in tokens) == ("--cross-entropy-loss-fusion true" in row["notes"]), row["source"]


def test_a_step_replayed_from_one_cuda_graph_issues_at_the_replays_rate_without_a_sync():
    import re

    from bench import plan_vs_published as published
    from harness.plan.speed.host_issue import GRAPH_REPLAY_S_PER_KERNEL

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    for row in rows:
        impls = re.findall(r"cuda_graph_impl=?'?(\w+)", row["notes"])
        graphed = bool(impls) and impls[-1] == "full_iteration"
        assert graphed == ("cuda_graph=full_iteration" in row["sharding"].split()), row["source"]
    row = next(r for r in rows if "cuda_graph=full_iteration" in r["sharding"] and r["model"] == "qwen3-235b-a22b")
    eager = {**row, "sharding": row["sharding"].replace(" cuda_graph=full_iteration", "")}
    graphed_host, eager_host = published.question(row)[1].time.host, published.question(eager)[1].time.host
    assert graphed_host.synced_forward_short_s is None and eager_host.synced_forward_short_s is not None
    assert graphed_host.seconds < eager_host.seconds * GRAPH_REPLAY_S_PER_KERNEL / 4.7e-6 * 1.01
    wrong = {**row, "sharding": row["sharding"].replace("cuda_graph=full_iteration", "cuda_graph=attn")}
    with pytest.raises(published.PublishedError, match="cuda_graph=attn is not one the planner models"):
        published.question(wrong)


def test_layers_replayed_from_cuda_graphs_issue_between_a_graphed_step_and_an_eager_one():
    from bench import plan_vs_published as published

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    for row in rows:  # the token where Megatron-Bridge's perf matrix turned enable_cuda_graph on, and only there
        assert ("cuda_graph=layers" in row["sharding"].split()) == ("sets cuda_graphs: true" in row["notes"])
    row = next(r for r in rows if "cuda_graph=layers" in r["sharding"] and r["model"] == "qwen3-235b-a22b")
    eager = {**row, "sharding": row["sharding"].replace(" cuda_graph=layers", "")}
    step = {**row, "sharding": row["sharding"].replace("cuda_graph=layers", "cuda_graph=full_iteration")}
    layers, eager_plan, step_plan = (published.question(r)[1].time for r in (row, eager, step))
    # The embedding, head and loss still eager, and a launch a layer's pass: more than the whole step's
    # one graph, far less than every kernel issued on the Grace host; the layers' shapes fixed, no sync.
    assert step_plan.host.seconds < layers.host.seconds < eager_plan.host.seconds / 10
    assert layers.host.synced_forward_short_s is None and layers.host_wait_s == 0
    assert eager_plan.host_wait_s > 0 and layers.step_s < eager_plan.step_s


def test_automodels_moe_layer_is_planned_as_megatron_cores_with_fused_norms():
    from bench import plan_vs_published as published

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    automodel = [r for r in rows if r["source"].startswith("NVIDIA-NeMo/Automodel")]
    assert len(automodel) == 4
    assert all({"megatron_moe_layer", "fused_norm"} <= set(r["sharding"].split()) for r in automodel)
    row = next(r for r in automodel if r["model"] == "qwen3-30b-a3b")
    plain = {**row, "sharding": row["sharding"].replace(" fused_norm megatron_moe_layer", "")}
    ran, eager = published.question(row)[1].time, published.question(plain)[1].time
    # Megatron-core's fused permutation and weighted SwiGLU, TransformerEngine's RMSNorm: fewer bytes moved,
    # one grouped matmul a projection where the zoo's layer loops over the 16 local experts.
    assert ran.work.elementwise_s < 0.6 * eager.work.elementwise_s
    assert ran.host.kernels < eager.host.kernels / 2
    assert ran.tokens_per_s > 1.2 * eager.tokens_per_s


def test_published_moe_runs_name_the_dispatcher_their_quoted_configs_leave():
    """Megatron-Bridge's DGX functions for Qwen3 set `moe_token_dispatcher_type = "alltoall"` after the recipe's
    apply_flex_dispatcher_backend made it 'flex' (scripts/performance/configs/qwen/qwen3_llm_pretrain.py @
    c0b9a00031b), so the preset's flex backend goes unused: a per-pair all-to-all, not DeepEP's node forwarding."""
    import re

    from bench import plan_vs_published as published
    from bench.moe_rows import moe_head

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    quoted = [r for r in rows if re.search(r"moe_token_dispatcher_type ?= ?['\"]", r["notes"])]
    assert len(quoted) >= 40
    for row in quoted:
        last = re.findall(r"moe_token_dispatcher_type ?= ?['\"](\w+)", row["notes"])[-1]
        assert (last == "alltoall") == (moe_head(row)["dispatcher"] == "alltoall"), row["source"]
    # Qwen3-235B at EP 32 over four DGX H100s: the per-pair exchange sends 6 of a token's 8 copies across nodes
    # where node forwarding sends 2.7, so the run that ran alltoall is planned slower than node forwarding would be.
    row = next(
        r for r in quoted if r["model"] == "qwen3-235b-a22b" and r["gpu"] == "H100-80" and "c0b9a00031b" in r["source"]
    )
    forwarded = {**row, "notes": row["notes"].replace("dispatcher=alltoall", "dispatcher=deepep", 1)}
    ran, would = published.question(row)[1].time, published.question(forwarded)[1].time
    assert ran.wire_bytes > 1.5 * would.wire_bytes
    assert ran.tokens_per_s < would.tokens_per_s


def test_qwen3_235b_runs_count_the_embedding_and_the_loss_in_their_pipeline_split():
    """Megatron-Bridge's Qwen3-235B-A22B recipe and the Model Zoo's yaml set account_for_embedding_in_pipeline_split
    and account_for_loss_in_pipeline_split: 94 blocks + 2 cut over PP x VP, the first and last GPUs a block short
    (xtuner's H800 benchmark states that cut, the flags read from it)."""
    from bench import plan_vs_published as published
    from bench.layout_kinds import degrees

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    pipelined = [
        r
        for r in rows
        if r["model"] == "qwen3-235b-a22b" and r["sharding"].startswith("megatron") and degrees(r["sharding"]).pp > 1
    ]
    assert len(pipelined) == 63
    for row in pipelined:
        assert {"embedding_in_pipeline_split", "loss_in_pipeline_split"} <= set(row["sharding"].split()), row["source"]
        assert "ccount_for_embedding_in_pipeline_split" in row["notes"] or "account-for-embedding" in row["notes"]
    # PP 8 without virtual stages: the last GPU holds 11 blocks beside the head where an even cut gives it 12.
    row = next(r for r in pipelined if r["gpu"] == "B200" and "vp=" not in r["sharding"])
    even = {**row, "sharding": row["sharding"].replace(" embedding_in_pipeline_split loss_in_pipeline_split", "")}
    split, whole = published.question(row)[1].time, published.question(even)[1].time
    assert split.imbalance_s < whole.imbalance_s
    assert split.tokens_per_s > whole.tokens_per_s


def test_a_node_forwarding_dispatcher_sends_fewer_bytes_across_nodes():
    from harness.plan.network.expert_comm import forwarded_copies
    from harness.plan.parallel.expert_layout import ExpertLayout

    across = ExpertLayout(32, 1, 1, Group(32, 4), Group(1, 1))
    # Top-8 over 4 nodes reaches 2.7 other nodes on average: the per-pair exchange's 6 copies across.
    assert forwarded_copies(8, across) * 3 / 4 == pytest.approx(3 * (1 - 0.75**8))
    assert forwarded_copies(8, ExpertLayout(8, 1, 1, Group(8, 1), Group(1, 1))) == 8


def test_every_expert_parallel_strategy_is_in_a_mixtures_plan(tmp_path):
    from harness.plan.parallel.backends import planner_models

    q = question(PlanConfig(**MIXTRAL, gpus=64, strategy_options={"ep_size": 8}))
    names = [n for n, m in planner_models().items() if n != "single"]
    plans, _ = plan_all(names, q, asked=False)
    planned = {p.name for p in plans}
    assert {"ddp-ep", "zero1-ep", "zero2-ep"} <= planned


def test_a_dropless_forward_waits_on_its_host_where_it_reads_the_expert_counts():
    from harness.plan.speed.host_issue import HostIssue

    plan = _plan("ddp-ep", gpus=8, strategy_options={"ep_size": 8})
    assert plan.time.host.synced_forward_short_s is not None  # the zoo's and transformers' experts sync
    host = HostIssue(100, 0, 0.010, synced_forward_short_s=0.004, backward_s=0.006)
    # unsynchronised the host's 10 ms hide behind 12 ms of GPU; synchronised, the forward's 4 ms of short
    # kernels follow its 3 ms of matmuls: 7 ms against the GPU's 4 ms forward.
    assert host.wait(forward_s=0.004, forward_long_s=0.003, micro_compute_s=0.012, recurring_s=0.0) == pytest.approx(
        0.003
    )
    assert HostIssue(100, 0, 0.010).wait(0.004, 0.003, 0.012, 0.0) == 0.0


def test_expert_parallel_at_tp_1_is_not_blamed_on_the_models_heads(capsys):
    """fsdp-ep and ddp-ep take tp_size but their meshes name no tp: without it they run at tp 1 however
    the heads split, so the line that says a mesh's tp was held below a node by the heads is not theirs."""
    from harness.plan.plan_cli import main

    assert main(["model=mixtral-8x7b", "gpus=64", "seq_len=4096", "micro_batch=1", "strategies=[fsdp-ep,ddp-ep]"]) == 0
    assert " at tp 1: the largest tp" not in capsys.readouterr().out


@pytest.mark.parametrize("name, world", [("zero3", 2), ("zero3", 64), ("zero2", 2), ("accelerate-zero3", 8)])
def test_deepspeed_sizes_a_mixtures_buckets_by_every_parameter_it_is_handed(name, world):
    """DeepSpeed's plugins size the reduce bucket by the module's parameters, experts and all (model_size
    of the built model); the plan's bucket, which prices ZeRO-3's reduce-scatters and the memory it holds,
    is the same, not the dense part's alone."""
    import torch

    from harness.plan.parallel.backends import backend_for
    from models.zoo import build_model
    from strategies.deepspeed_config import model_size, sizing_config

    with torch.device("meta"):
        model = build_model("moe-micro", {})
    runtime = sizing_config(model_size(model), 3 if "zero3" in name else 2, world)["zero_optimization"]
    planned = backend_for(name, shape_of_spec("moe-micro"), "bf16", world).options
    assert planned["reduce_bucket_size"] == runtime["reduce_bucket_size"]


def test_deepspeeds_expert_parallel_sizes_its_buckets_by_the_experts_a_rank_keeps():
    """zero1-ep and zero2-ep hand DeepSpeed the dense part and each block's E / ep experts: OLMoE's 0.48B
    dense parameters and an eighth of its 6.4B of experts pass the 5e8 bucket the dense part alone did not."""
    from harness.plan.parallel.backends import backend_for
    from strategies.deepspeed_config import DEEPSPEED_REDUCE_BUCKET

    shape = shape_of_spec("olmoe-1b-7b")
    held = shape.params + shape.dims.moe.routed_params(shape.dims.width) // 8
    assert shape.params < DEEPSPEED_REDUCE_BUCKET < held
    planned = backend_for("zero2-ep", shape, "bf16", 8, {"ep_size": 8}).options
    assert planned["reduce_bucket_size"] >= DEEPSPEED_REDUCE_BUCKET


def test_the_docs_deepseek_v3_example_is_what_the_plan_gives(capsys):
    """docs/planner.md quotes what its DeepSeek-V3 command gives: the figures are the plan's, as printed."""
    import re

    from harness.plan.plan_cli import main

    doc = (ROOT / "docs" / "planner.md").read_text()
    command = re.search(r"```\npython runner.py plan (model=deepseek-v3 .*?)\n```\n\ngives (.*?): without", doc, re.S)
    assert command is not None
    args, said = command.group(1).replace("\\\n", " ").split(), " ".join(command.group(2).split())
    assert main(args) == 0
    out = capsys.readouterr().out
    fsdp_ep = re.search(r"^fsdp-ep .*? ([\d.]+)\s+yes .* ([\d,]+)\s+(\d+)%\s+\d+%$", out, re.M)
    zero1_ep = re.search(r"^zero1-ep .* ([\d,]+)\s+\d+%\s+\d+%$", out, re.M)
    reserved = re.search(r"zero1-ep would be faster but does not fit \(([\d.]+) GiB per GPU\)", out)
    assert fsdp_ep and zero1_ep and reserved, out
    assert said == (
        f"fsdp-ep at {fsdp_ep.group(2)} tokens/s per GPU ({fsdp_ep.group(3)}% MFU, {float(fsdp_ep.group(1)):.1f} GiB), "
        f"zero1-ep {zero1_ep.group(1)} but {reserved.group(1)} GiB with the allocator's reserve"
    )


def test_megatron_runs_gpt_oss_clamped_glu_through_its_fused_kernel(monkeypatch):
    """Megatron-core's TEGroupedMLP runs gpt-oss's clamped GLU as weighted_bias_quick_geglu_impl (the clamps and
    their concatenation eager, then one fused kernel): 11 elements of F moved each way a token-expert pair where
    the reference code's eager operators move 16 and 32."""
    from bench import plan_vs_published as published
    from harness.plan.speed import expert_compute
    from harness.plan.speed.compute import memory_bytes_per_s

    rows = published.read_rows(published.DATA / "moe_runs.csv")
    row = next(r for r in rows if r["model"] == "gpt-oss-120b" and r["gpu"] == "GB300" and r["precision"] == "bf16")
    q, fused, _ = published.question(row)
    monkeypatch.setattr(expert_compute, "MEGATRON_CLAMPED_ELEMENTS", expert_compute.CLAMPED_SWIGLU_ELEMENTS)
    eager = published.question(row)[1]
    moe = q.shape.dims.moe
    assert moe.clamped_swiglu and fused.layout.experts.ep == 64 and "recompute=" not in row["sharding"]
    pairs = q.micro_batch * q.seq_len * moe.top_k  # EP 64, TP 1: every token's top-k pairs, balanced
    moved = (16 + 32 - 11 - 11) * moe.expert_ffn * 2 * pairs * moe.moe_layers
    saved_s = eager.time.work.elementwise_s - fused.time.work.elementwise_s
    assert saved_s == pytest.approx(moved / memory_bytes_per_s(q.gpu), rel=0.01)
    assert fused.time.tokens_per_s > eager.time.tokens_per_s
    # What it keeps: the clamps the projection's output (2F), the fused kernel its clamped input (2F), the down
    # projection the product (F), where the eager operators keep 6F.
    from harness.plan.memory import expert_memory

    kept = {
        megatron: expert_memory.ffn_bytes(
            q.shape.dims,
            tokens=q.micro_batch * q.seq_len,
            tp=1,
            experts=fused.layout.experts,
            precision="bf16",
            mixed_precision="bf16",
            megatron=megatron,
            fp8_inputs=False,
            imbalance=1.0,
            recompute=frozenset(),
        )[2]
        for megatron in (True, False)
    }
    one_f = pairs * moe.expert_ffn * 2
    assert kept[False] - kept[True] == pytest.approx(one_f + pairs * q.shape.dims.width * 2, rel=1e-6)


def test_a_capacity_that_drops_caps_the_busiest_gpu_and_one_padded_runs_every_expert_full():
    from bench import plan_vs_published as published
    from harness.plan.memory.expert_memory import routed_pairs
    from harness.plan.parallel.expert_layout import ExpertLayout

    # Megatron-core's flex dispatcher (DeepEP) cannot pad: tokens over 5x the mean drop, none are added
    rows = published.read_rows(published.DATA / "moe_runs.csv")
    row = next(r for r in rows if "capacity=5.0" in r["notes"] and "dispatcher=deepep" in r["notes"])
    dropless = {**row, "notes": row["notes"].replace("capacity=5.0", "capacity=dropless")}
    padded = {**row, "notes": row["notes"].replace("dispatcher=deepep", "dispatcher=alltoall")}
    dropping_plan, dropless_plan = published.question(row)[1], published.question(dropless)[1]
    assert dropping_plan.time.work.matmul_s == pytest.approx(dropless_plan.time.work.matmul_s)
    # its sizes are dynamic, so its forward waits on the host for them as a dropless one does
    assert dropping_plan.time.host.synced_forward_short_s is not None
    padded_plan = published.question(padded)[1]
    assert padded_plan.time.work.matmul_s > 2 * dropless_plan.time.work.matmul_s  # the experts at 5x
    assert padded_plan.time.host.synced_forward_short_s is None  # padded: fixed sizes, no wait
    exchange = "all-to-all send and receive buffers of one block"
    assert padded_plan.buffers.backward[exchange] == pytest.approx(5 * dropping_plan.buffers.backward[exchange], 1e-6)
    moe = published.shape_of_row(row).dims.moe
    layout = ExpertLayout(ep=8, etp=1, edp=1)
    assert routed_pairs(moe, 1024, layout, 1.5) == pytest.approx(1.5 * 1024 * 8)  # under 5x: the router's own
    assert routed_pairs(moe, 1024, layout, 9.0) == pytest.approx(5 * 1024 * 8)  # capped at the capacity


def test_megatrons_fp32_accumulation_makes_a_few_tokens_an_expert_weight_gradient_memory_bound():
    from bench import plan_vs_published as published
    from harness.plan.speed.gemm import gemm_seconds

    h100 = gpu_spec("H100")
    # 512 tokens an expert: the fp32 result read and written outweighs the matmul's flops; 8192: it does not
    assert gemm_seconds(3072, 4096, 512, h100, "bf16", accumulate=True) > 1.5 * gemm_seconds(
        3072, 4096, 512, h100, "bf16"
    )
    assert gemm_seconds(3072, 4096, 8192, h100, "bf16", accumulate=True) == gemm_seconds(3072, 4096, 8192, h100, "bf16")
    rows = published.read_rows(published.DATA / "moe_runs.csv")
    row = next(r for r in rows if "tp=4 pp=8 vp=4 ep=8" in r["sharding"] and "H800" in r["gpu"])
    assert "fp32 main parameters and gradient reduction" in row["mp_mode"]  # Megatron's --bf16
    bf16_grads = {**row, "mp_mode": "bf16 gradients"}
    fused, plain = published.question(row)[1].time.work, published.question(bf16_grads)[1].time.work
    assert fused.matmul_s > 1.02 * plain.matmul_s  # its experts see 512 tokens each at TP 4
    # nanotron's matmuls write bf16 gradients its own accumulator adds after (nanotron_step.py)
    sweep = published.read_rows(published.DATA / "sweeps" / "nanotron_ultrascale_playbook.csv")
    nanotron = next(r for r in sweep if "tp=8 " in r["sharding"] and r["micro_batch"] == "1")
    assert "fp32 main parameters and gradient reduction" in nanotron["mp_mode"]
    unfused = {**nanotron, "mp_mode": "bf16 gradients"}
    assert published.question(nanotron)[1].time.work.matmul_s == published.question(unfused)[1].time.work.matmul_s


def test_megatrons_moe_recompute_module_issues_the_moe_blocks_forward_again():
    from harness.plan.parallel.expert_layout import ExpertLayout
    from harness.plan.speed.expert_compute import expert_kernels

    shape = shape_of_spec("qwen3-235b-a22b")
    layout = ExpertLayout(ep=8, etp=1, edp=1)
    kept = expert_kernels(shape, layout, True, "none")
    again = expert_kernels(shape, layout, True, "none", ("moe", "layernorm"))
    assert kept.again == 0 and again.again == pytest.approx(kept.forward)  # no shared experts, no dense blocks
    assert expert_kernels(shape, layout, True, "full").again == pytest.approx(kept.forward)


def test_a_recomputed_moe_forward_waits_on_its_host_as_the_forward_does():
    from bench import plan_vs_published as published
    from harness.plan.speed.host_issue import HostIssue

    host = HostIssue(100, 0, 0.010, synced_forward_short_s=0.002, backward_s=0.006, synced_again_short_s=0.003)
    # the forward: 3 ms of matmuls then 2 ms of short kernels' issue against its 4 ms; the recomputation: 1.5 ms
    # of matmuls and 3 ms of issue against its 2 ms; the rest of the backward's 3 ms of issue hide in its 6 ms
    assert host.wait(0.004, 0.003, 0.012, 0.0, again_s=0.002, long_share=0.75) == pytest.approx(0.001 + 0.0025)
    unsynced = HostIssue(100, 0, 0.010, synced_forward_short_s=0.002, backward_s=0.006)
    assert unsynced.wait(0.004, 0.003, 0.012, 0.0, again_s=0.002, long_share=0.75) == pytest.approx(0.001)
    rows = published.read_rows(published.DATA / "moe_runs.csv")
    moe = next(r for r in rows if "recompute=moe " in r["sharding"] and "H800" in r["gpu"])
    act = next(r for r in rows if "recompute=layernorm+moe_act " in r["sharding"] and "H800" in r["gpu"])
    assert published.question(moe)[1].time.host.synced_again_short_s is not None
    assert published.question(act)[1].time.host.synced_again_short_s is None  # the SwiGLU alone: no sync again
