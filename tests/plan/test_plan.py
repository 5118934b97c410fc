"""`runner.py plan`: the ZeRO paper's worked example, model states against what every
strategy really holds (measured in one torchrun job per world size), activations against
autograd's saved tensors, communication volumes, speed, the recommendation, bad input."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import runner
from harness.plan.memory.activations import LOSS_BYTES_PER_LOGIT, activations
from harness.plan.memory.buffers import matmul_weights
from harness.plan.memory.model_states import zero_paper_bytes_per_gpu
from harness.plan.model.model_build import shape_of_module
from harness.plan.model.model_shape import shape_of_description, shape_of_spec
from harness.plan.parallel.backends import planner_models
from harness.plan.plan_cli import PlanConfig, question, strategy_names
from harness.plan.predict import on_device, peak_allocated, plan_all, plan_strategy
from harness.plan.recommendation import recommend
from harness.plan.what_if import skipped_lines
from models.zoo import build_model
from strategies.registry import default_registry
from tests.helpers import ROOT, env_for_tests, forked_torchrun, run_bounded

GB = 1e9
LLAMA_TINY = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
)


def plan(**options) -> tuple:
    """(the question, its plans by name): as `runner.py plan` makes them, the strategies that
    cannot lay the question out left out where none were asked for."""
    cfg = PlanConfig(**options)
    q = question(cfg)
    plans, _ = plan_all(strategy_names(cfg), q, asked=bool(cfg.strategies))
    return q, {p.name: p for p in plans}


def run_plan_cli(*args: str, capsys) -> tuple[int, str, str]:
    code = runner.main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- the ZeRO paper (arXiv 1910.02054, section 3) ------------------------------------------


def test_zero_paper_formulas_per_gpu():
    psi, n, k = 7.5e9, 64, 12
    assert zero_paper_bytes_per_gpu(psi, 0, n, k) == (2 + 2 + k) * psi
    assert zero_paper_bytes_per_gpu(psi, 1, n, k) == (2 + 2 + k / n) * psi
    assert zero_paper_bytes_per_gpu(psi, 2, n, k) == (2 + (2 + k) / n) * psi
    assert zero_paper_bytes_per_gpu(psi, 3, n, k) == (2 + 2 + k) * psi / n
    with pytest.raises(ValueError):
        zero_paper_bytes_per_gpu(psi, 4, n, k)


def test_zero_paper_worked_example_comes_out_exactly(capsys):
    """7.5B parameters, 64 GPUs, mixed-precision Adam: 120, 31.4, 16.6 and 1.9 GB per GPU."""
    code, out, _ = run_plan_cli("params=7.5e9", "gpus=64", "nodes=8", capsys=capsys)
    assert code == 0
    assert "model states per GPU: DDP 120.0 GB, ZeRO-1 31.4 GB, ZeRO-2 16.6 GB, ZeRO-3 1.9 GB." in out
    # The backends as installed: DeepSpeed bf16 holds 2 + 2 + K (4 master + 8 moments) bytes,
    # DDP 4 + 4 + 8 (fp32 parameters, gradients, moments): the paper's 16 bytes either way.
    _, plans = plan(params=7.5e9, gpus=64, nodes=8, precision="bf16", strategies=["ddp", "zero1", "zero2", "zero3"])
    totals = {name: sum(p.states.total(c) for c in ("params", "grads", "optimizer")) for name, p in plans.items()}
    assert totals["ddp"] == zero_paper_bytes_per_gpu(7.5e9, 0, 64) == 120e9
    assert totals["zero2"] == zero_paper_bytes_per_gpu(7.5e9, 2, 64) == 16.640625e9
    assert totals["zero3"] == zero_paper_bytes_per_gpu(7.5e9, 3, 64) == 1.875e9
    # DeepSpeed's ZeRO-1 reduces into its partition in the last micro-step's backward: at rest it
    # holds ZeRO-2's gradients; while accumulating it holds them whole, the paper's ZeRO-1.
    assert totals["zero1"] == totals["zero2"]
    _, accumulating = plan(params=7.5e9, gpus=64, nodes=8, micro_batch=1, batch_size=128, strategies=["zero1"])
    p = accumulating["zero1"]
    whole = p.buffers.backward["whole gradients accumulated between micro-steps"]
    assert p.states.total("params") + whole + p.states.total("optimizer") == zero_paper_bytes_per_gpu(7.5e9, 1, 64)
    assert zero_paper_bytes_per_gpu(7.5e9, 1, 64) == 31.40625e9


# ---- model states against memory_breakdown, every strategy, world sizes 1 and 2 ------------

# Odd vocabulary: FSDP2's uneven dim-0 shards and DeepSpeed's group padding both show.
# Odd sizes, so that padding and uneven shards show; 2 heads, so that fsdp-tp can split them over 2 ranks.
WORKER_MODEL = ("gpt-nano", {"n_embd": 66, "n_head": 2, "vocab_size": 131})
PRECISIONS = ("fp32", "bf16")
# Combinations of the torch mesh beyond the presets' defaults, on two ranks (as the worker names them).
COMBINATIONS = {
    "ddp-tp@pp_size=2": ("ddp-tp", {"pp_size": 2}),  # Megatron-LM's DDP x PP
    "zero1-tp@pp_size=2": ("zero1-tp", {"pp_size": 2}),
    "fsdp@pp_size=2": ("fsdp", {"pp_size": 2}),
    "fsdp@cp_size=2": ("fsdp", {"cp_size": 2}),
    "hsdp@tp_size=2": ("hsdp", {"tp_size": 2}),
    "ddp-tp@cp_size=2": ("ddp-tp", {"cp_size": 2}),
}


# One launcher sets up every registered strategy in turn (28 names, two precisions) at world size 1,
# then again at 2, its imports paid once: minutes on two busy cores. The first test to ask for the
# fixture pays for it, so the module's limit covers the whole job.
WORKER_TIMEOUT_S = 840
pytestmark = pytest.mark.timeout(WORKER_TIMEOUT_S + 120)
WORLDS = (1, 2)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[int, dict[str, dict]]:
    """{world_size: {"strategy/precision": max-over-ranks breakdown}} from tests/plan_worker.py."""
    path = tmp_path_factory.mktemp("plan") / "measured.json"
    cmd = forked_torchrun(
        WORLDS,
        ROOT / "tests" / "plan_worker.py",
        str(path),
        WORKER_MODEL[0],
        json.dumps(WORKER_MODEL[1]),
        ",".join(default_registry().names() + list(COMBINATIONS)),  # the combinations skipped on one rank
        ",".join(PRECISIONS),
        backends=True,
    )
    proc = run_bounded(cmd, timeout=WORKER_TIMEOUT_S, env=env_for_tests(), cwd=ROOT)
    assert proc.returncode == 0, f"plan_worker failed\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    out: dict[int, dict[str, dict]] = {}
    for world in WORLDS:
        ranks = [json.loads(Path(f"{path}.world{world}.rank{r}").read_text()) for r in range(world)]
        out[world] = {key: _max_over_ranks([r[key] for r in ranks]) for key in ranks[0]}
    return out


def _max_over_ranks(results: list[dict]) -> dict:
    if "params" not in results[0]:
        return results[0]
    return {c: max(sum(r[c].values()) for r in results) for c in ("params", "grads", "optimizer")}


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", default_registry().names())
def test_model_states_match_what_each_strategy_holds(measured, name, precision, world):
    result = measured[world][f"{name}/{precision}"]
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert "error" not in result, (
        f"{name} {precision} at world size {world}: {result['error']}\n{result.get('traceback')}"
    )
    _check_states(result, name, {}, precision, world)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_model_states_of_mesh_combinations_match_what_each_rank_holds(measured, combination, precision):
    """The pipeline's fullest stage (the embeddings, the head and its share of the blocks) is what
    the plan prices: on two stages of gpt-nano, the first one's."""
    result = measured[2][f"{combination}/{precision}"]
    assert "error" not in result and "skipped" not in result, result
    _check_states(result, *COMBINATIONS[combination], precision, 2)


def _check_states(result: dict, name: str, options: dict, precision: str, world: int) -> None:
    q, _ = plan(
        model=WORKER_MODEL[0],
        model_kwargs=WORKER_MODEL[1],
        gpus=world,
        micro_batch=2,  # plan_worker.py's: a pipeline's default micro-batches, one a stage, divide it
        precision=precision,
        strategies=[name] if name != "single" or world == 1 else [],
        strategy_options=options,
    )
    predicted = plan_strategy(name, q).states
    for category in ("params", "grads", "optimizer"):
        want, got = result[category], predicted.total(category)
        assert got == pytest.approx(want, rel=0.02), (
            f"{name} {precision} world {world} {category}: predicted {got}, measured {want}"
        )


# ---- activations against the tensors autograd saves ------------------------------------------


def _saved_activation_bytes(model: torch.nn.Module, rows: torch.Tensor, autocast: bool) -> tuple[int, int]:
    """(activation bytes, bf16 weight-copy bytes) autograd saves in a forward: each storage once,
    the parameters themselves left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    # A matmul saves its bf16 weight copy transposed, as a view.
    weight_shapes = {s for p in model.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    saved: dict[int, tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and t.is_floating_point():
            is_copy = autocast and tuple(t.shape) in weight_shapes and t.dtype == torch.bfloat16
            saved[storage.data_ptr()] = (storage.nbytes(), is_copy)
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        model(rows[:, :-1], rows[:, 1:])
    return sum(b for b, c in saved.values() if not c), sum(b for b, c in saved.values() if c)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("style", ["fp32", "autocast", "low_precision"])
@pytest.mark.parametrize(
    "spec,kwargs", [("gpt-nano", {"n_embd": 64, "n_head": 2, "vocab_size": 128}), ("hf:LlamaConfig", LLAMA_TINY)]
)
def test_activation_formula_matches_autograds_saved_tensors(spec, kwargs, style, checkpointing):
    # 3 x 40 = 120 tokens: no activation has a weight's shape, so copies and activations are told apart.
    batch, seq = 3, 40
    torch.manual_seed(0)
    model = build_model(spec, kwargs)
    if style == "low_precision":
        model = model.to(torch.bfloat16)  # how DeepSpeed runs it; FSDP's policy casts the same way
    model.train()
    model.activation_checkpointing = checkpointing == "full"
    rows = torch.randint(0, model.vocab_size, (batch, seq + 1))
    acts_saved, weight_copies = _saved_activation_bytes(model, rows, autocast=style == "autocast")
    shape = shape_of_module(spec, model)
    precision = "fp32" if style == "fp32" else "bf16"
    predicted = activations(
        shape,
        micro_batch=batch,
        seq_len=seq,
        precision=precision,
        mixed_precision="low_precision" if style == "low_precision" else "autocast",
        checkpointing=checkpointing,
    )
    # The loss's gradient buffers exist only in backward: autograd saves 4 of its 12 bytes per logit.
    saved_part = predicted.blocks + predicted.head - (LOSS_BYTES_PER_LOGIT - 4) * shape.dims.vocab * batch * seq
    # CPU kernels keep a few small statistics in bf16 where CUDA keeps fp32: 1% covers them.
    assert acts_saved == pytest.approx(saved_part, rel=0.01)
    if style == "autocast" and checkpointing == "none":
        assert weight_copies == matmul_weights(shape) * 2


class _FusedRMSNorm(torch.autograd.Function):
    """What a fused RMSNorm kernel keeps for backward (torchtitan's TritonFusedRMSNorm:
    `ctx.save_for_backward(x, weight, rstd)`, rstd in fp32), computed here in eager ops."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd[..., None]).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError("the test counts what the forward saves; it runs no backward")


@pytest.mark.parametrize("style", ["fp32", "low_precision"])
def test_a_fused_rms_norm_keeps_its_input_and_statistics_only(style):
    batch, seq = 3, 40
    torch.manual_seed(0)
    model = build_model("hf:LlamaConfig", LLAMA_TINY)
    if style == "low_precision":
        model = model.to(torch.bfloat16)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert len(norms) == 2 * LLAMA_TINY["num_hidden_layers"] + 1
    for norm in norms:
        norm.forward = lambda x, norm=norm: _FusedRMSNorm.apply(x, norm.weight, norm.variance_epsilon)
    model.train()
    rows = torch.randint(0, model.vocab_size, (batch, seq + 1))
    acts_saved, _ = _saved_activation_bytes(model, rows, autocast=False)
    shape = shape_of_module("hf:LlamaConfig", model)
    precision = "fp32" if style == "fp32" else "bf16"
    kwargs = dict(micro_batch=batch, seq_len=seq, precision=precision, checkpointing="none")
    fused = activations(shape, mixed_precision="low_precision", fused_norm=True, **kwargs)
    eager = activations(shape, mixed_precision="low_precision", **kwargs)
    saved_part = fused.blocks + fused.head - (LOSS_BYTES_PER_LOGIT - 4) * shape.dims.vocab * batch * seq
    assert acts_saved == pytest.approx(saved_part, rel=0.01)
    # Each of the five norms keeps 4 bytes per element less: eager keeps an fp32 copy and the
    # normalised tensor where its input would do.
    assert eager.total - fused.total == 5 * batch * seq * LLAMA_TINY["hidden_size"] * 4


def test_activations_grow_linearly_with_sequence_no_score_matrix():
    shape = shape_of_spec("gpt2-124m")
    one, two = (
        activations(shape, micro_batch=1, seq_len=t, precision="bf16", mixed_precision="autocast", checkpointing="none")
        for t in (1024, 2048)
    )
    assert two.blocks == 2 * one.blocks  # a T x T score matrix would make it 4x in its part
    ckpt = activations(
        shape, micro_batch=1, seq_len=1024, precision="bf16", mixed_precision="autocast", checkpointing="full"
    )
    assert ckpt.blocks == 12 * 768 * 4 * 1024  # only each block's fp32 input
    assert ckpt.blocks + ckpt.rebuilt < one.blocks / 3
    selective = activations(
        shape, micro_batch=1, seq_len=1024, precision="bf16", mixed_precision="autocast", checkpointing="selective"
    )
    assert ckpt.total < selective.total < one.total
    math = activations(
        shape,
        micro_batch=1,
        seq_len=2048,
        precision="bf16",
        mixed_precision="autocast",
        checkpointing="none",
        attention="math",
    )
    assert math.blocks > two.blocks + 12 * 12 * 2048 * 2048 * 2 - 1  # the unfused kernel keeps its softmax


# ---- communication and speed -----------------------------------------------------------------


def test_ring_volumes_and_zero3_moves_one_and_a_half_times_ddp():
    q, plans = plan(params=1e9, gpus=8, precision="fp32", strategies=["ddp", "zero1", "zero3", "fsdp"])
    psi, n = 1e9, 8
    assert plans["ddp"].time.wire_bytes == pytest.approx(2 * (n - 1) / n * 4 * psi)
    # DeepSpeed's ZeRO-1 all-reduces each gradient bucket (every rank keeping its partition), then
    # all-gathers the updated parameters: 1.5x data parallel's bytes, not the ZeRO paper's 1x.
    assert plans["zero1"].time.wire_bytes == pytest.approx(3 * (n - 1) / n * 4 * psi)
    assert plans["zero3"].time.wire_bytes == pytest.approx(1.5 * plans["ddp"].time.wire_bytes)
    assert plans["fsdp"].time.wire_bytes == pytest.approx(1.5 * plans["ddp"].time.wire_bytes)


def test_fsdp_accumulation_trades_reduce_scatters_for_unsharded_gradients():
    """fsdp reduce-scatters on every micro-step (as ZeRO-3 does) by default; with
    sync_each_micro_step=false it reduces once but holds the whole gradient meanwhile."""
    common = dict(model="gpt2-124m", gpus=8, micro_batch=2, batch_size=64, precision="bf16", strategies=["fsdp"])
    _, each = plan(**common)
    _, once = plan(**common, strategy_options={"sync_each_micro_step": False})
    kept = "unsharded gradients kept while accumulating"
    assert kept not in each["fsdp"].buffers.backward
    assert once["fsdp"].buffers.backward[kept] == shape_of_spec("gpt2-124m").params * 4  # reduced in fp32
    assert once["fsdp"].peak_bytes > each["fsdp"].peak_bytes
    reduce_scatter = next(c for c in each["fsdp"].collectives if c.kind == "reduce-scatter")
    # 64 sequences = 8 GPUs x 2 x 4 micro-steps: three more reduce-scatters per step.
    assert each["fsdp"].time.wire_bytes - once["fsdp"].time.wire_bytes == pytest.approx(
        3 * reduce_scatter.wire_bytes(), rel=1e-9
    )


def test_a_blocks_gradients_come_after_the_heads_backward():
    """FSDP2's unsharded gradients of a block and its reduce-scatter input are made by that block's
    backward, once the head's has freed the loss's buffers: the peak is the larger of the two moments,
    not their sum."""
    _, plans = plan(model="gpt2-124m", gpus=8, micro_batch=2, precision="bf16", strategies=["fsdp"])
    fsdp = plans["fsdp"]
    grads = "one block's unsharded gradients and reduce-scatter input"
    assert grads in fsdp.buffers.hooks and grads not in fsdp.buffers.backward
    on_gpu = on_device(fsdp.states)
    held = on_gpu["params"] + on_gpu["optimizer"] + sum(fsdp.buffers.backward.values())
    acts = fsdp.activations
    assert acts.head > fsdp.buffers.hooks[grads]  # GPT-2's logits outweigh a block's gradients
    assert peak_allocated(on_gpu, acts, fsdp.buffers, False) == held + acts.total
    larger = replace(fsdp.buffers, hooks={grads: 2 * acts.head})  # a block's gradients outweighing the head's
    assert peak_allocated(on_gpu, acts, larger, False) == held + acts.total + acts.head


def test_step_time_is_compute_plus_what_cannot_hide():
    q, plans = plan(model="gpt2-124m", gpus=1, micro_batch=4, precision="bf16", strategies=["single"])
    single = plans["single"].time
    work = single.work
    assert single.compute_s == pytest.approx((work.micro_step_s + work.optimizer_s) * q.factors.compute_scale)
    assert single.exposed_comm_s == single.contention_s == 0 and single.efficiency == pytest.approx(1, abs=1e-3)
    assert single.tokens_per_s == pytest.approx(4 * 1024 / single.step_s)
    flops = shape_of_spec("gpt2-124m").flops_per_token(1024) * 4 * 1024
    _, fixed = plan(model="gpt2-124m", gpus=1, micro_batch=4, precision="bf16", strategies=["single"], mfu=0.4)
    assert fixed["single"].time.compute_s == pytest.approx(flops / (989e12 * 0.4))  # mfu=: the old fixed rate
    # Small micro-batches across nodes: the network binds where no compute is left to hide it.
    common = dict(model="gpt2-1.5b", gpus=16, nodes=2, micro_batch=1, strategies=["ddp"])
    _, fast = plan(**common)
    _, slow = plan(**common, interconnect="pcie", inter_node="ethernet")
    assert slow["ddp"].time.exposed_comm_s > fast["ddp"].time.exposed_comm_s
    assert slow["ddp"].time.efficiency < fast["ddp"].time.efficiency < 1
    _, explicit = plan(**common, interconnect="nvlink", inter_node="8x400gbps")
    assert explicit["ddp"].time.step_s == pytest.approx(fast["ddp"].time.step_s)  # the H100's own platform


# ---- the recommendation --------------------------------------------------------------------------


def test_what_would_change_the_answer_names_what_takes_the_step():
    """Where the recommended layout runs far below its compute, the line says which term takes the
    step and what shrinks it: a pipeline starved of micro-batches its bubble, a small model's DDP
    its host, never communication by default."""
    q, plans = plan(model="llama3.1-405b", gpu="H100", gpus=1024, seq_len=8192, micro_batch=1, strategies=["zero1-pp"])
    line = recommend(list(plans.values()), q).lines[-1]
    assert line.startswith("What would change the answer: the pipeline's bubble is 9") and "pp_size=" in line
    q, plans = plan(model="gpt2-124m", gpu="H100", gpus=64, micro_batch=1, seq_len=1024, strategies=["ddp"])
    line = recommend(list(plans.values()), q).lines[-1]
    assert line.startswith("What would change the answer: waiting on the host is") and "compile=true" in line
    assert "communication" not in line


def test_recommendation_names_the_fastest_that_fits_and_why_the_others_lose():
    q, plans = plan(params=7.5e9, gpus=64, nodes=8)
    rec = recommend(list(plans.values()), q)
    best = plans[rec.best]
    fitting = [p for p in plans.values() if p.fits]
    assert best.fits and best.time.tokens_per_s >= 0.98 * max(p.time.tokens_per_s for p in fitting)
    assert rec.runner_up and rec.runner_up != rec.best
    text = "\n".join(rec.lines)
    assert "ddp: does not fit" in text and "What would change the answer" in text


def test_a_tie_for_the_fastest_goes_to_the_leanest_that_keeps_its_state_on_the_gpu():
    """Among strategies within 2% of the fastest, the leanest is recommended, said as tied where it
    is not itself the fastest; a strategy that offloads to the host is taken only where none of the
    tied keeps its state on the GPU (its tie hides the host memory and CPUs it takes)."""
    base = dict(model="llama3.1-405b", gpus=1024, seq_len=8192, activation_checkpointing="full")
    names = ["zero3", "zero3-offload"]
    q = question(PlanConfig(**base, batch_size=2048, micro_batch=1, strategies=names))
    plans, _ = plan_all(names, q)
    by = {p.name: p for p in plans}
    assert by["zero3-offload"].peak_bytes < by["zero3"].peak_bytes
    assert by["zero3"].time.tokens_per_s > by["zero3-offload"].time.tokens_per_s > 0.98 * by["zero3"].time.tokens_per_s
    rec = recommend(plans, q)
    assert rec.best == "zero3" and "which keeps its state on the host" in rec.lines[0]
    assert "its state in host memory" in "\n".join(rec.lines)
    # Llama 3.1 70B on 64 H100s: ZeRO++ within 2% of ZeRO-3, 5.4 GiB lighter.
    names = ["zero3", "zero3-zeropp"]
    q = question(
        PlanConfig(**{**base, "model": "llama3.1-70b", "gpus": 64}, global_batch_tokens="4M", strategies=names)
    )
    plans, _ = plan_all(names, q)
    rec = recommend(plans, q)
    assert rec.lines[0].startswith("Use zero3-zeropp: as fast as the fastest that fits (within 2%) and leaner")


def test_recommendation_when_nothing_fits_says_what_would():
    q, plans = plan(model="gpt2-1.5b", gpus=1, gpu="L4", micro_batch=8, strategies=["ddp", "fsdp", "zero3"])
    rec = recommend(list(plans.values()), q)
    assert rec.best is None and len(rec.lines) == 2
    assert rec.lines[0].startswith("Nothing fits in 1 x 22 GiB") and "largest part: activations" in rec.lines[0]
    assert "fsdp with activation_checkpointing=full on 2 GPUs" in rec.lines[1]  # more GPUs
    assert "fsdp-offload with activation_checkpointing=full: optimizer state in host memory" in rec.lines[1]


def test_a_pipeline_staged_without_its_micro_batches_is_told_how_many_would_fit():
    """pp_size given, microbatches left: the pipeline's default of one micro-batch a stage holds half
    the rank's 64 sequences in flight; the remedy names the fewest micro-batches that fit, and so
    planned, it fits."""
    options = {"ddp-tp": {"tp_size": 8, "pp_size": 2}}
    q, plans = plan(
        model="llama3.1-8b", gpus=16, seq_len=8192, batch_size=64, strategies=["ddp-tp"], strategy_options=options
    )
    rec = recommend([plans["ddp-tp"]], q)
    assert rec.best is None
    line = next(line for line in rec.lines if line.startswith("It would fit with"))
    count = int(line.split("strategy_options.microbatches=")[1].split()[0])
    staged = plan_strategy(
        "ddp-tp", replace(q, strategy_options={"ddp-tp": {**options["ddp-tp"], "microbatches": count}})
    )
    fewer = plan_strategy(
        "ddp-tp", replace(q, strategy_options={"ddp-tp": {**options["ddp-tp"], "microbatches": count // 2}})
    )
    assert staged.fits and not fewer.fits


def test_when_no_remedy_of_the_asked_strategy_fits_the_plan_names_layouts_that_do():
    """A 70B under ddp on 8 GPUs at 32K tokens, which no GPU count, checkpointing or offload makes fit:
    context parallelism beside FSDP's offload fits on the same GPUs (every FSDP2 name of the mesh takes
    cp_size), and the plan names it with its size and peak, from the search."""
    q, plans = plan(model="llama3.1-70b", gpus=8, seq_len=32768, micro_batch=1, strategies=["ddp"])
    rec = recommend(list(plans.values()), q)
    text = "\n".join(rec.lines)
    assert rec.best is None and "does not model" not in text
    assert "Neither more GPUs, full checkpointing, offload nor a smaller micro-batch makes ddp fit" in text
    assert "Layouts that fit on these GPUs: strategies=[fsdp-offload] strategy_options.cp_size=2 micro_batch=1" in text
    assert " GiB per GPU, " in text


def test_a_tensor_parallel_layout_too_large_anywhere_flat_is_offered_more_gpus_with_its_pipeline():
    """ddp-tp for a 70B at 32K tokens fits on no count of 8-GPU nodes without a pipeline; the what-if
    on more GPUs plans it as the default plan would there, with the fewest stages that fit."""
    q, plans = plan(model="llama3.1-70b", gpus=8, seq_len=32768, micro_batch=1, strategies=["ddp-tp"])
    text = "\n".join(recommend(list(plans.values()), q).lines)
    assert "It would fit with ddp-tp with activation_checkpointing=full on 32 GPUs" in text


def test_checkpointing_that_would_let_the_faster_strategy_fit_is_suggested():
    q, plans = plan(
        model="gpt2-774m", gpus=8, gpu_mem_gb=24, peak_tflops=989, micro_batch=8, strategies=["ddp", "zero3"]
    )
    assert plans["ddp"].fits is False and plans["zero3"].fits
    rec = recommend(list(plans.values()), q)
    assert rec.best == "zero3"
    assert any("ddp is faster and fits with activation_checkpointing=" in line for line in rec.lines)


# ---- model shapes ------------------------------------------------------------------------------------


def test_hf_architecture_shape_on_the_meta_device_matches_the_real_model():
    real = build_model("hf:LlamaConfig", LLAMA_TINY)
    shape = shape_of_spec("hf:LlamaConfig", LLAMA_TINY)
    assert shape.params == sum(p.numel() for p in real.parameters())
    assert shape.dims.gated_mlp and not shape.dims.fused_qkv and shape.dims.rms_norm and shape.dims.kv_heads == 2
    assert shape.flops_per_token(64) == real.flops_per_token(64)
    assert len(shape.block_params()) == 2


def test_seventy_billion_parameters_cost_no_memory():
    shape = shape_of_spec(
        "hf:LlamaConfig",
        dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            vocab_size=128256,
        ),
    )
    assert 70e9 < shape.params < 71e9


def test_described_gpt_equals_the_zoo_preset():
    preset = shape_of_spec("gpt2-124m")
    described = shape_of_description(params=None, layers=12, width=768, heads=12, vocab=50304, seq_len=1024)
    assert described.params == preset.params and described.dims == preset.dims
    guessed = shape_of_description(params=7.5e9, layers=None, width=None, heads=None, vocab=None, seq_len=1024)
    assert guessed.params == 7.5e9 and "assumed" in guessed.note


# ---- the command ---------------------------------------------------------------------------------------


def test_table_names_every_registered_strategy_the_planner_models(capsys):
    code, out, _ = run_plan_cli("model=gpt2-350m", "gpus=8", "micro_batch=2", capsys=capsys)
    assert code == 0
    for name, model in planner_models().items():
        if name != "single" and not model.expert_parallel:  # those on a mixture of experts: test_moe_plan.py
            assert f"\n{name} " in out
    assert "Use " in out and "Runner-up:" in out


def test_a_registered_strategy_without_a_planner_model_is_refused_as_such(capsys, monkeypatch):
    import harness.plan.plan_cli as plan_cli

    # ddp as a registered strategy whose class declares no planner model.
    modelled = [name for name in plan_cli.known_backends() if name != "ddp"]
    monkeypatch.setattr(plan_cli, "known_backends", lambda: modelled)
    monkeypatch.setattr(plan_cli, "model_of", lambda name: None)
    code, _, err = run_plan_cli("model=gpt2-350m", "gpus=8", "strategies=[ddp]", capsys=capsys)
    assert code == 2
    assert "strategy ddp is registered but the planner has no model of it yet" in err
    code, _, err = run_plan_cli("model=gpt2-350m", "gpus=8", "strategies=[no-such-strategy]", capsys=capsys)
    assert code == 2 and "unknown strategy no-such-strategy" in err


def test_json_and_plots(capsys, tmp_path):
    code, out, _ = run_plan_cli(
        "model=gpt2-124m",
        "gpus=4",
        "format=json",
        "plot=true",
        f"out_dir={tmp_path}",
        "strategies=[ddp,zero3]",
        capsys=capsys,
    )
    assert code == 0
    result = json.loads(out)
    assert [s["strategy"] for s in result["strategies"]] == ["ddp", "zero3"]
    assert result["recommendation"]["best"] in ("ddp", "zero3")
    for path in result["plots"]:
        assert Path(path).stat().st_size > 10_000


def test_plots_of_a_pipeline_leave_out_the_sizes_its_stages_do_not_divide(capsys, tmp_path):
    # The memory chart plans each strategy at other model sizes: a pipeline's stages do not divide
    # every one of them, which must not stop the plan the question asked for.
    code, out, err = run_plan_cli(
        "model=gpt2-1.5b", "gpus=8", "plot=true", f"out_dir={tmp_path}", "strategies=[fsdp,fsdp-pp]", capsys=capsys
    )
    assert code == 0, err
    assert (tmp_path / "plan_memory.png").stat().st_size > 10_000 and "fsdp-pp" in out


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["params=-1"], "params=-1.0 must be a positive"),
        (["model=gpt2-124m", "gpus=0"], "gpus=0 must be a positive"),
        (["model=gpt2-124m", "micro_batch=0"], "micro_batch=0 must be a positive"),
        (["model=gpt2-124m", "layers=12", "width=64"], "either model= or a description"),
        (["layers=0", "width=64"], "layers=0 must be a positive"),
        (["model=gpt2-124m", "gpus=4", "batch_size=10", "strategies=[ddp]"], "does not divide over 4 data-parallel"),
        (["model=gpt2-124m", "gpus=8", "nodes=3"], "does not split over nodes=3"),
        (["model=gpt2-124m", "interconnect=carrier-pigeon"], "unknown interconnect 'carrier-pigeon'"),
        (["model=gpt2-124m", "inter_node=-5"], "unknown inter_node fabric '-5'"),
        (["model=gpt2-124m", "gpus=16", "inter_node=8x"], "give cards x rate per node such as 8x400gbps"),
        (["model=gpt2-124m", "activation_checkpointing=sometimes"], "is not one of none, full, selective"),
        (["model=gpt2-124m", "attention=fast"], "attention='fast' is not one of flash"),
        (["model=gpt2-124m", "gpus=[8,16]", "nodes=2"], "give gpus_per_node= instead"),
        (["model=gpt2-124m", "gpus=[8,zero]"], "must be a positive whole number"),
        (["model=gpt2-124m", "gpus="], "gpus= is empty: give a GPU count (gpus=8)"),
        (["model=tests.user_models:build_bigram", "activation_checkpointing=selective"], "selective keeps the matmuls"),
        (["model=gpt2-124m", "strategies=[zero9]"], "unknown strategy zero9"),
        (["model=gpt2-124m", "gpu=Z80"], "unknown gpu 'Z80'"),
        (["model=no-such-model"], "unknown model 'no-such-model'"),
        (["model=hf:LlamaConfig", "model_kwargs.hiden_size=64"], "no field hiden_size"),
        (["model=gpt2-124m", "mfu=2"], "mfu=2.0 must be in (0, 1]"),
        (["model=gpt2-124m", "gpuz=8"], "unknown config key 'gpuz'"),
    ],
)
def test_bad_input_is_a_one_line_error(capsys, args, fragment):
    code, out, err = run_plan_cli(*args, capsys=capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("parabench: error: ") and fragment in err, err


def test_the_compare_records_the_plans_prediction_beside_what_a_run_measured(reference_run):
    from harness.compare.compare_cli import predicted

    summary, _ = reference_run
    prediction = predicted(Path(summary["config"]["out_dir"]))
    assert set(prediction) >= {
        "mem_params_bytes",
        "mem_grads_bytes",
        "mem_optimizer_bytes",
        "peak_mem_allocated_bytes",
        "tokens_per_s",
    }
    for key in ("mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes"):
        assert prediction[key] == pytest.approx(summary[key], rel=0.02)
    assert prediction["peak_mem_allocated_bytes"] is None and prediction["tokens_per_s"] is None  # CPU run


def test_plan_for_more_gpus_keeps_per_node_count():
    q, _ = plan(model="gpt2-124m", gpus=16, nodes=2, strategies=["ddp"])
    bigger = q.with_gpus(64)
    assert (bigger.nodes, bigger.topology.nodes, bigger.topology.gpus) == (8, 8, 64)
    assert bigger.topology.per_node == 8


def test_a_sweep_over_models_and_gpu_counts_is_one_table_and_one_plot(capsys, tmp_path):
    code, out, _ = run_plan_cli(
        "model=[gpt2-124m,gpt2-350m]",
        "gpus=[8,64]",
        "micro_batch=4",
        "strategies=[ddp,fsdp]",
        "plot=true",
        f"out_dir={tmp_path}",
        capsys=capsys,
    )
    assert code == 0
    assert out.startswith("parabench plan | gpt2-124m, gpt2-350m on 8, 64 GPUs")
    rows = [
        line for line in out.splitlines() if line.split()[:1] in (["gpt2-124m"], ["gpt2-350m"]) and " GPUs:" not in line
    ]
    assert len(rows) == 2 * 2 * 2  # models x GPU counts x strategies, in one table
    assert sum(line.count("on 64 GPUs: Use ") for line in out.splitlines()) == 2
    assert (tmp_path / "plan_sweep.png").stat().st_size > 10_000 and out.count("wrote ") == 1
    code, out, _ = run_plan_cli("model=gpt2-124m", "gpus=[8,16]", "format=json", "strategies=[fsdp]", capsys=capsys)
    assert code == 0 and [p["question"]["gpus"] for p in json.loads(out)["points"]] == [8, 16]
    # No batch given: each GPU count's global batch is one sequence a GPU, stated with the question.
    assert [p["question"]["global_batch_sequences"] for p in json.loads(out)["points"]] == [8, 16]


def test_a_what_if_fills_a_part_of_a_host_before_it_takes_more_hosts():
    """One H100 asked: two are one host of two, sixteen are two full hosts of eight with a card per
    GPU; a host size the user gave (gpus_per_node=, nodes=) is kept."""
    one = question(PlanConfig(model="llama3.1-8b", gpus=1, gpu="H100"))
    assert (one.with_gpus(2).nodes, one.with_gpus(8).nodes) == (1, 1)
    sixteen = one.with_gpus(16).topology
    assert (sixteen.nodes, sixteen.per_node, sixteen.fabric.nics) == (2, 8, 8)
    pairs = question(PlanConfig(model="llama3.1-8b", gpus=2, gpus_per_node=2, gpu="H100"))
    assert pairs.with_gpus(8).topology.per_node == 2
    given = question(PlanConfig(model="llama3.1-8b", gpus=2, nodes=1, gpu="H100"))
    assert given.with_gpus(4).topology.per_node == 2


@pytest.mark.parametrize(
    "asked, hosts",
    [
        ({"gpu": "GB200", "nodes": 4}, (4, 4)),  # four compute trays of 4, not four hosts of 2
        ({"gpu": "H100", "nodes": 4}, (4, 8)),
        ({"gpu": "H100", "nodes": 2, "gpus_per_node": 4}, (2, 4)),
        ({"gpu": "H100", "nodes": 4, "gpus": 8}, (4, 2)),  # a gpus= given is split over the nodes, as before
        ({"gpu": "H100"}, (1, 8)),
    ],
)
def test_nodes_alone_plans_that_many_whole_hosts(asked, hosts):
    """nodes= without gpus= means full hosts (gpus_per_node=, or the card's), not the default 8 GPUs
    spread over them; gpus=8 alone stays one host of 8."""
    topology = question(PlanConfig(model="llama3.1-8b", **asked)).topology
    assert (topology.nodes, topology.per_node) == hosts


def test_a_question_without_a_batch_keeps_one_sequence_a_gpu_on_more_gpus():
    """The what-if on more GPUs keeps a batch the question gave, and one it did not give stays a
    sequence a GPU: never "batch_size=256 does not divide over 512 ranks" for a batch no one asked."""
    q, plans = plan(model="deepseek-v3", gpus=256, seq_len=4096)
    assert q.global_batch == 256 and q.with_gpus(512).global_batch == 512
    assert not any("batch_size" in line for line in skipped_lines(list(plans.values()), q))
    given, _ = plan(model="deepseek-v3", gpus=256, seq_len=4096, batch_size=256, strategies=["fsdp"])
    assert given.with_gpus(512).global_batch == 256


@pytest.mark.parametrize("name", default_registry().planned_names())
def test_a_cpu_runs_prediction_answers_for_every_strategy(name):
    """What a compare records beside each run on a CPU: memory only (no GPU's links to time), and
    never an exception, whatever the layout (pipeline and context parallel included)."""
    from configs.schema import RunConfig
    from harness.plan.for_run import prediction_for_run

    model = "moe-nano" if planner_models()[name].expert_parallel else "gpt-nano"
    config = RunConfig(strategy=name, model=model, batch_size=16, seq_len=64)
    summary = {"device_type": "cpu", "world_size": 2, "nodes": 1, "micro_batch": 8, "grad_accum": 1}
    predicted = prediction_for_run(config, summary)
    assert predicted["tokens_per_s"] is None and predicted["peak_mem_allocated_bytes"] is None
