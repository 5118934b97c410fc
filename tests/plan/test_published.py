"""bench/plan_vs_published.py: the plan held against published training runs, from the CSVs in
bench/data, without torch and in seconds; a CSV it cannot read is a one-line error."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import plan_vs_published as published
from bench import published_breakdown
from bench.layout_kinds import Degrees, degrees, kinds_of, scale_of
from bench.moe_rows import moe_runs_held
from harness.common.hardware import GPUS
from harness.plan import published_accuracy
from harness.plan.network.comm import PIPELINED
from harness.plan.network.fabric import FABRICS
from harness.plan.published_accuracy import CONTEXT, DATA_PARALLEL, KINDS, PIPELINE, TP_ACROSS, TP_INSIDE
from tests.helpers import ROOT, env_for_tests


@pytest.fixture(scope="module")
def every_csv() -> dict[Path, list]:
    """Every runs CSV of bench/data planned once (seconds of planning), for the tests that read them."""
    return {path: published.plan_rows(published.read_rows(path)) for path in published.runs_csvs()}


@pytest.fixture(scope="module")
def outcomes(every_csv):
    return {path.name: every_csv[path] for path in published.FIRST_CSVS}


def test_runs_that_ran_are_planned_to_fit_and_the_oom_one_not(outcomes):
    runs = [o for rows in outcomes.values() for o in rows if o.plan is not None]
    assert len(runs) > 200
    # At most 3% of the runs that ran are planned not to fit (today: VectorLM's Llama-3-8B on one
    # A100, bf16 model and AdamW state, whose loss over 128,256 logits a token the plan puts past the card).
    assert sum(not o.plan.fits for o in runs) <= 0.03 * len(runs)
    # torchtitan's llama2-13b without checkpointing at local batch 2 on 64 A100s ran its Triton fused
    # RMSNorm (llama_13b.toml at the commit the figures were published): planned with the eager
    # norm's fp32 copies it would sit 8% over the card.
    (titan_13b,) = [
        o
        for o in outcomes["torchtitan_llama_fsdp.csv"]
        if o.row["model"] == "llama2-13b" and o.row["activation_checkpointing"] == "false"
    ]
    assert titan_13b.plan.reserved_bytes < titan_13b.plan.headroom.usable
    (oom,) = published.plan_rows(published.read_rows(published.OOM_CSV))
    assert oom.plan.fits is False  # llama2-70b, local batch 2, selective AC: out of memory as published


def test_the_published_memory_is_predicted_within_fifteen_percent(outcomes):
    # torchtitan's bf16 FSDP tables each; over every published max reserved (the float8 runs of
    # public_runs.csv too) the median |error|. The 70B 2D runs reserved 22-27% more than planned.
    memory = [o for o in outcomes["torchtitan_llama_fsdp.csv"] if o.memory_error is not None]
    assert len(memory) == 4 and all(abs(o.memory_error) < 0.15 for o in memory)
    every = sorted(abs(o.memory_error) for rows in outcomes.values() for o in rows if o.memory_error is not None)
    assert len(every) >= 10 and every[len(every) // 2] <= 0.15
    # The June 2025 H200 runs: torchtitan then compiled its loss with the model, and gathered fp8 weights.
    h200 = [o for o in outcomes["public_runs.csv"] if o.row["gpu"] == "H200-141" and o.memory_error is not None]
    assert h200 and all(abs(o.memory_error) < 0.05 for o in h200)


def test_fp8_runs_are_planned_and_rowwise_scaling_is_said_not_to_be(outcomes):
    rows = outcomes["public_runs.csv"]
    fp8 = [o for o in rows if o.plan is not None and o.row["precision"] in ("fp8", "float8")]
    assert len(fp8) >= 15 and {o.row["source"].split(":")[0] for o in fp8} >= {
        "pytorch/torchtitan",
        "mosaicml/llm-foundry",
    }
    errors = sorted(abs(o.error) for o in fp8)
    # median |error|: NeMo's TransformerEngine rows (TE's weight cache, te_fp8; their recipes' fused
    # cross-entropy and userbuffers overlap), llm-foundry's te.Linear rows with eager elementwise work
    assert errors[len(errors) // 2] < 0.13
    rowwise = [o for o in rows if "rowwise" in o.row["notes"] and o.row["precision"] == "float8"]
    assert rowwise and all(o.plan is None and "rowwise" in o.skipped for o in rowwise)


def test_the_report_states_the_figures_and_the_bias_by_gpu_nodes_and_sequence(tmp_path, every_csv, monkeypatch):
    # The runs CSVs' rows, as main reads them again, get the module's plans of the same rows
    # (planning is deterministic and nothing downstream changes an outcome); the sweep's, the
    # out-of-memory and the CI rows, which only main plans, are planned here.
    planned = {json.dumps(published.read_rows(path)): outcomes for path, outcomes in every_csv.items()}
    plan_rows = published.plan_rows
    monkeypatch.setattr(published, "plan_rows", lambda rows: planned.get(json.dumps(rows)) or plan_rows(rows))
    out, quoted = tmp_path / "plan_vs_published.md", tmp_path / "published_accuracy.json"
    assert published.main(["--out", str(out), "--accuracy", str(quoted)]) == 0
    text = out.read_text()
    # The figures a recommendation quotes are the report's, the sweep's apart: the shipped file is
    # what the current plan gives (each bucket's runs, its median within a point).
    shipped, now = published_accuracy.published_figures(), json.loads(quoted.read_text())
    assert now["sweep"]["kinds"]["TP across nodes"]["runs"] > 100
    assert set(shipped) == set(now)
    groups = [(g, now[g], shipped[g]) for g in ("kinds", "work", "families")]
    groups += [(f"{kind} by scale", now["kinds_by_scale"][kind], shipped["kinds_by_scale"][kind]) for kind in KINDS]
    groups.append(("sweep", now["sweep"]["kinds"], shipped["sweep"]["kinds"]))
    for group, buckets, shipped_buckets in groups:
        assert set(buckets) == set(shipped_buckets), group
        for bucket, figures in buckets.items():
            had = shipped_buckets[bucket]
            assert had["runs"] == figures["runs"], (group, bucket)
            assert had["median_abs_error"] == pytest.approx(figures["median_abs_error"], abs=0.01), (group, bucket)
    for section in ("### torchtitan_llama_fsdp.csv", "### public_runs.csv", "### Published out-of-memory"):
        assert section in text
    assert text.count("median error") >= 2 and "within 15%" in text
    for title in ("| GPU |", "| nodes |", "| sequence length |"):
        assert text.count(title) >= 2
    assert "Command: `python bench/plan_vs_published.py --out" in text
    assert "planned not to fit: right" in text
    for part in ("### Accuracy at a glance", "| more than 64 nodes |", "| strategy ddp-tp |", "Coverage:", "regret"):
        assert part in text
    # Every runs CSV of bench/data is read, and the goals stand beside the figures.
    assert "### model_parallel_nvidia.csv" in text and "| TP x DP inside a node |" in text and "| H100-80 |" in text
    assert "### Goals" in text and text.count("| yes |") + text.count("| NO |") >= 6
    assert "### Will it fit?" in text and "- Runs that ran out of memory: 1 of 1 planned not to fit" in text
    assert "torch's max reserved" in text and "median |error|" in text
    # The Playbook's sweep: its own section (every row planned but the pipeline with more stages than
    # blocks), by nodes and by layout on both networks, and a line of the goals table ...
    sweep = text.split("### The Ultra-Scale Playbook's sweep, apart from the goals' buckets")[1].split("###")[0]
    assert "on the Ultra-Scale Playbook's sweep (its own section) | <= 10% |" in text
    assert "; 1 not planned." in sweep and "the plan's pick is the fastest published in" in sweep
    for table in ("| nodes |", "| layout | runs | on p5:", "| TP across nodes |", "| pipeline stages |"):
        assert table in sweep
    # ... and a layer's time on a micro-batch, published beside planned, by where the pipeline runs.
    for table in ("| tensor parallel | pp 1, one node |", "| micro-batch | layouts | published, median |"):
        assert table in sweep


def test_megatron_tensor_by_data_parallel_runs_are_planned_as_ddp_tp_and_zero1_tp(outcomes):
    rows = outcomes["public_runs.csv"]
    megatron = [o for o in rows if o.row["sharding"].startswith("megatron")]
    assert {published.strategy_of(o.row) for o in megatron} == {"ddp-tp", "zero1-tp"}
    # Narayanan et al.'s weak-scaling runs (32 to 3,072 A100s, TP 1-8 x PP 1-64 x DP, full
    # recomputation, the vocabulary split over the TP GPUs): each within 15%, the median within
    # 8%.
    table_1 = [o for o in megatron if "examples/sc21" in o.row["source"]]
    errors = sorted(abs(o.error) for o in table_1)
    assert len(table_1) == 10 and all(o.plan is not None for o in table_1)
    assert errors[-1] < 0.15 and statistics.median(errors) < 0.08
    # With Megatron-LM's pipeline (1F1B, or interleaved with vp= virtual stages) and its context
    # parallelism they are planned, with the stages and the sequence split they ran.
    pipelined = [o for o in megatron if "pp=" in o.row["sharding"]]
    assert len(pipelined) >= 10 and all(o.plan is not None and o.plan.layout.pp > 1 for o in pipelined)
    split = [o for o in megatron if "cp=" in o.row["sharding"]]
    assert len(split) == 2 and all(o.plan is not None and o.plan.layout.cp == 2 for o in split)


def test_one_jobs_settings_are_grouped_and_the_pick_is_scored(outcomes):
    every = [o for rows in outcomes.values() for o in rows]
    picks = published.choices(every)
    assert picks and all(pick.row["model"] == best.row["model"] == key[1] for key, pick, best in picks)
    assert all(best.published >= pick.published for _, pick, best in picks)
    assert {published.scale_of({"nodes": n}) for n in ("1", "4", "32", "128")} == set(published.SCALES)
    # One publication's runs: torchtitan's 70B float8 2D settings of December 2024 and of June 2025
    # (another torch: 829 and 809.8 tokens/s without async TP) are two jobs.
    seventy = [
        key for key in published.jobs_of(every) if key[1:6] == ("llama3.1-70b", "H100-96", "256", "8192", "float8")
    ]
    assert len(seventy) == 2
    # The goals: the plan picks the fastest published setting in three jobs of four, and what a pick
    # gives up is at most 10% of the fastest.
    regrets = [best.published / pick.published - 1 for _, pick, best in picks]
    assert sum(r <= 0 for r in regrets) >= 0.75 * len(regrets) and max(regrets) <= 0.10


def test_async_tensor_parallel_runs_are_planned_with_their_collectives_pipelined(outcomes):
    rows = [o for o in outcomes["public_runs.csv"] if o.plan is not None and "tp=" in o.row["sharding"]]
    fused = [o for o in rows if "async_tp" in o.row["sharding"].split()]
    assert len(fused) >= 10 and all(o.plan.backend.options["async_tp"] for o in fused)
    # TransformerEngine's userbuffers (a NeMo row's tp_comm_overlap) pipeline them as well.
    overlapped = [o for o in rows if "tp_comm_overlap" in o.row["sharding"].split()]
    assert overlapped and not set(map(id, overlapped)) & set(map(id, fused))
    assert all(any(c.window == PIPELINED for c in o.plan.collectives) for o in fused + overlapped)
    pipelined = fused + overlapped
    assert not any(c.window == PIPELINED for o in rows if o not in pipelined for c in o.plan.collectives)
    # Each 2D run published both ways (same publication, model, precision, batch): async TP planned faster.
    pairs = {}
    for o in rows:
        key = (published.publication(o.row), o.row["model"], o.row["precision"], o.row["micro_batch"], o.row["gpus"])
        pairs.setdefault(key, {})["async_tp" in o.row["sharding"].split()] = o
    both = [(p[False], p[True]) for p in pairs.values() if len(p) == 2]
    assert len(both) >= 5 and all(fast.predicted > slow.predicted for slow, fast in both)


def test_the_per_token_line_separates_what_grows_with_the_sequence(outcomes):
    c, a, worst = published.line_fit([(512, 3.0 + 0.5 * 512), (2048, 3.0 + 0.5 * 2048), (8192, 3.0 + 0.5 * 8192)])
    assert (c, a, worst) == (pytest.approx(3.0), pytest.approx(0.5), pytest.approx(0.0, abs=1e-12))
    lines = published.per_token_lines(outcomes["public_runs.csv"])
    table = [line for line in lines if line.startswith("| mpt-")]
    assert len(table) >= 15  # every model on every card llm-foundry swept on 8 GPUs
    assert any("at most" in line and "of a planned step" in line for line in lines)


def test_a_csv_missing_a_column_is_a_one_line_error(tmp_path):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        columns = [c for c in published.COLUMNS if c != "seq_len"]
        csv.writer(f).writerow(columns)
    proc = subprocess.run(
        [sys.executable, "bench/plan_vs_published.py", str(path), "--out", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env_for_tests(),
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no column seq_len" in proc.stderr and "give every column" in proc.stderr


def _row(sharding: str, gpus: int, nodes: int, **extra: str) -> dict[str, str]:
    return {"sharding": sharding, "gpus": str(gpus), "nodes": str(nodes), "gpu": "H100-80", **extra}


def test_layout_kinds_and_scales_are_read_from_the_rows():
    megatron = _row("megatron tp=4 pp=4 vp=5 cp=2 dp=2 distributed_optimizer sequence_parallel", 64, 8)
    assert kinds_of(megatron) == (TP_INSIDE, PIPELINE, CONTEXT) and scale_of(megatron) == "2-8 nodes"
    # Tensor parallel over more GPUs than a node holds is across nodes; on a GB200 rack's trays of 4 it
    # stays inside the NVLink domain of 72.
    assert kinds_of(_row("megatron tp=8 pp=4 dp=4 distributed_optimizer", 128, 32)) == (TP_ACROSS, PIPELINE)
    rack = _row("megatron tp=8 pp=4 dp=4 distributed_optimizer", 128, 32, gpu="GB200")
    assert kinds_of(rack) == (TP_INSIDE, PIPELINE)
    assert kinds_of(_row("FSDP2 dp_shard=32 tp=8 pp=8", 2048, 256)) == (TP_INSIDE, PIPELINE)
    assert kinds_of(_row("FSDP1-FULL_SHARD", 8, 1)) == (DATA_PARALLEL,)
    assert kinds_of(_row("megatron tp=1 pp=1 dp=64 distributed_optimizer", 64, 8)) == (DATA_PARALLEL,)
    assert degrees("megatron tp=1 pp=2 ep=32 dp=128 distributed_optimizer") == Degrees(tp=1, pp=2, cp=1, ep=32)
    assert [scale_of({"nodes": n}) for n in ("", "1", "8", "9", "64", "65")] == [
        "one node",
        "one node",
        "2-8 nodes",
        "9-64 nodes",
        "9-64 nodes",
        "more than 64 nodes",
    ]


def test_the_breakdowns_count_every_run_under_each_of_its_kinds(every_csv):
    every = [o for outcomes in every_csv.values() for o in outcomes]
    kinds = published_breakdown.by_kind(every)
    for kind, rows in kinds.items():
        assert len(rows) == sum(kind in kinds_of(o.row) for o in every)
    assert sum(len(rows) for rows in published_breakdown.by_scale(every).values()) == len(every)
    assert sum(len(rows) for rows in published_breakdown.by_card(every).values()) == len(every)
    lines = published_breakdown.breakdown_lines(every, published.strategy_of)
    planned = [o for o in kinds[PIPELINE] if o.error is not None]
    (pipelines,) = [line for line in lines if line.startswith(f"| {PIPELINE} |")]
    assert pipelines.split("|")[2:4] == [f" {len(kinds[PIPELINE])} ", f" {len(planned)} "]


def test_every_row_of_every_csv_is_planned_or_listed_with_a_reason(every_csv):
    paths = published.runs_csvs()
    assert published.DATA / "model_parallel_nvidia.csv" in paths and published.OOM_CSV not in paths
    assert all(p.name not in ("nccl_tests_published.csv", "xla_sm90_matmul_bf16.csv") for p in paths)
    assert list(every_csv) == paths
    for path, outcomes in every_csv.items():
        for o in outcomes:
            assert (o.plan is None) == bool(o.skipped), (path.name, o.row["model"])
            assert o.skipped is None or "not a number" not in o.skipped, (path.name, o.row["model"], o.skipped)
    rows = every_csv[published.DATA / "model_parallel_nvidia.csv"]
    assert len(rows) >= 200 and sum(o.plan is not None for o in rows) >= 150
    assert all(o.row["source"].count("@") == 1 and len(o.row["source"].split("@")[1]) == 40 for o in rows)
    assert not [o for o in rows if o.skipped and o.skipped.startswith("card")]  # every card is known
    gb200 = [o for o in rows if o.row["gpu"] == "GB200" and o.plan is not None]
    assert gb200 and all(o.plan.layout.tp_group.nodes == 1 for o in gb200)  # TP stays in the NVL72 rack
    # Its MoE rows carry no shape beyond the columns: moe_runs.csv holds them, with their notes' moe head.
    moe = [o for o in rows if o.row["arch"] == "moe"]
    assert moe and all(o.skipped and o.skipped.startswith("mixture of experts without") for o in moe)
    # MXFP8 on Blackwell: the fp8 projections, their block scales applied by the tensor cores.
    mx = [o for o in rows if "MXFP8" in o.row["notes"] and o.row["arch"] != "moe" and o.row["gpu"] == "B200"]
    assert mx and all(o.plan is not None and published.recipe_of_row(o.row).fp8_block_scaling for o in mx)
    # Megatron-LM's and NeMo's tensor, pipeline and context parallelism are planned with the degrees they ran.
    split = [(o, degrees(o.row["sharding"])) for o in rows if o.plan is not None]
    assert sum(d.pp > 1 and d.cp > 1 for _, d in split) >= 30
    assert all((o.plan.layout.tp, o.plan.layout.pp, o.plan.layout.cp) == (d.tp, d.pp, d.cp) for o, d in split)


def test_a_networks_cards_and_rate_per_node_are_read():
    fabric = published._fabric({"network": "8x400gbps-ib", "gpus": "64", "nodes": "8"}, GPUS["H100"])
    assert (fabric.nics, fabric.gbps) == (8, 400)
    assert published._fabric({"network": "ndr", "gpus": "64", "nodes": "8"}, GPUS["H100"]) is FABRICS["ndr"]
    assert published._fabric({"network": "unstated", "gpus": "16", "nodes": "2"}, GPUS["A100"]) is FABRICS["dgx-a100"]
    tray = published._fabric({"network": "unstated", "gpus": "64", "nodes": "16"}, GPUS["GB200"])
    assert (tray.nics, tray.gbps) == (4, 400)  # a GB200 compute tray: four GPUs, a 400G card each


def test_the_goals_say_which_bucket_misses():
    def outcome(sharding: str, error: float, fits: bool = True):
        return SimpleNamespace(
            row=_row(sharding, 64, 8), error=error, plan=SimpleNamespace(fits=fits), memory_error=None
        )

    runs = [outcome("megatron tp=8 pp=1 dp=8 ddp", 0.05)] * 3 + [outcome("megatron tp=8 pp=2 dp=4 ddp", 0.30, False)]
    (median, within, not_fit) = published_breakdown.goals(runs, [])
    assert not median.met and "PP 30.0%" in median.now and "TP x DP inside a node" not in median.now
    assert within.met is True and within.now == "75% of 4"
    assert not not_fit.met and not_fit.now == "25.0% of 4"


def _megatron_row(sharding: str, **extra: str) -> dict[str, str]:
    """One published Megatron run with every column (a GPT-3-shaped 1.3B on 8 H100s)."""
    row = dict.fromkeys(published.COLUMNS, "")
    row.update(
        source="example/repo:README.md@" + "0" * 40,
        model="gpt-1.3b",
        arch="gpt",
        n_layers="24",
        d_model="2048",
        n_heads="16",
        vocab="51200",
        seq_len="2048",
        gpus="8",
        nodes="1",
        gpu="H100-80",
        network="ndr",
        micro_batch="2",
        grad_accum="4",
        activation_checkpointing="false",
        compile="false",
        sharding=sharding,
        precision="bf16",
        mp_mode="bf16 parameters, fp32 main parameters",
        notes="",
    )
    row.update(extra)
    return row


def _planned_row(sharding: str, **extra: str):
    """The question and the plan of `_megatron_row(sharding, **extra)`, which the plan must lay out."""
    q, plan, skipped = published.question(_megatron_row(sharding, **extra))
    assert skipped is None and plan is not None and plan.time is not None and plan.activations is not None
    return q, plan


def test_plan_tokens_name_the_kernel_engine_loss_and_head_and_leave_the_layout_alone():
    plain = _megatron_row("megatron tp=2 pp=1 dp=4 distributed_optimizer")
    tokens = "attention=math transformer_engine fused_loss tied_embeddings=false"
    tagged = _megatron_row(f"megatron tp=2 pp=1 dp=4 distributed_optimizer sequence_parallel {tokens}")
    assert published._layout_sharding(tagged) == "megatron tp=2 pp=1 dp=4 distributed_optimizer sequence_parallel"
    q_plain, _, _ = published.question(plain)
    q, plan, why = published.question(tagged)
    assert why is None and plan is not None
    assert (q_plain.attention, q_plain.compiled, q_plain.fused_loss) == ("flash", False, False)
    assert (q.attention, q.compiled, q.eager_launches, q.fused_loss) == ("math", True, True, True)
    head = int(plain["vocab"]) * int(plain["d_model"])
    assert published.shape_of_row(tagged).params == published.shape_of_row(plain).params + head  # an untied head
    fp8 = published.recipe_of_row({**tagged, "precision": "fp8"})
    assert fp8.te_fp8 and fp8.fp8_saved_inputs and fp8.tied_embeddings is False
    assert not published.recipe_of_row({**plain, "precision": "fp8"}).te_fp8  # no TransformerEngine named


def test_a_megatron_rows_overlap_is_what_its_sharding_names_never_its_notes():
    said = "overlap_grad_reduce true and the data-parallel communication overlapped, as the recipe says"
    silent = published.question(_megatron_row("megatron tp=2 pp=1 dp=4 distributed_optimizer", notes=said))[1]
    assert silent.backend.options["overlap_grad_reduce"] is False
    assert silent.backend.options["overlap_param_gather"] is False
    named = published.question(
        _megatron_row("megatron tp=2 pp=1 dp=4 distributed_optimizer overlap_grad_reduce overlap_param_gather")
    )[1]
    assert named.backend.options["overlap_grad_reduce"] and named.backend.options["overlap_param_gather"]
    assert named.time.tokens_per_s > silent.time.tokens_per_s


def test_deepspeeds_pipeline_engine_waits_on_its_transfers_and_gathers_them_whole():
    row = _megatron_row(
        "megatron tp=2 pp=2 dp=2 ddp zero=1 deepspeed_pipeline", grad_accum="8", published_tok_s_gpu="1000"
    )
    plain = _megatron_row("megatron tp=2 pp=2 dp=2 ddp zero=1", grad_accum="8")
    engine, megatron = published.question(row)[1], published.question(plain)[1]
    deeper = [
        published.question(_megatron_row(f"megatron tp=2 pp=4 dp=1 ddp zero=1{token}", grad_accum="8"))[1]
        for token in (" deepspeed_pipeline", "")
    ]
    sends = [next(c for c in p.collectives if "between pipeline stages" in c.what) for p in (*deeper, engine, megatron)]
    assert sends[0].calls == 2 * sends[1].calls  # four transfers a micro-batch, not two, with a GPU between two
    assert sends[2].calls == sends[3].calls  # two stages: each exchanges every other step, two a micro-batch
    gathers = [c for c in engine.collectives if "PartitionedTensor" in c.what]
    assert len(gathers) == 1 and gathers[0].calls == 3 * 8 and gathers[0].group.size == 2
    assert not any("PartitionedTensor" in c.what for c in megatron.collectives)
    assert engine.time.tokens_per_s < megatron.time.tokens_per_s
    tied = [c for c in engine.collectives if "tied embedding" in c.what]
    assert len(tied) == 1 and tied[0].window is None  # gpt ties its head: reduced after the flush


def test_a_run_with_blocking_launches_waits_on_its_host_every_micro_batch():
    plain = _megatron_row("megatron tp=2 pp=2 dp=2 ddp zero=1 deepspeed_pipeline", grad_accum="8")
    row = _megatron_row("megatron tp=2 pp=2 dp=2 ddp zero=1 deepspeed_pipeline launch_blocking", grad_accum="8")
    assert published._layout_sharding(row) == published._layout_sharding(plain)
    asynchronous, blocking = published.question(plain)[1], published.question(row)[1]
    assert blocking.time.host_wait_s == pytest.approx(8 * blocking.time.host.seconds)  # each micro-batch's issue
    assert blocking.time.tokens_per_s < asynchronous.time.tokens_per_s


def test_a_run_whose_layers_wait_on_blocking_copies_issues_them_and_waits_on_its_host():
    plain = _megatron_row("megatron tp=8 pp=1 dp=1 ddp", micro_batch="1")
    row = _megatron_row("megatron tp=8 pp=1 dp=1 ddp layer_syncs", micro_batch="1")
    assert published._layout_sharding(row) == published._layout_sharding(plain)
    free, synced = published.question(plain)[1].time, published.question(row)[1].time
    assert synced.host.kernels == free.host.kernels + 2 * 24  # two copies in each of its 24 layers' forward
    assert synced.host.synced_forward_short_s is not None and free.host.synced_forward_short_s is None
    assert synced.tokens_per_s < free.tokens_per_s


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("attention=fast", r"attention=fast: give one of flash, .*math"),
        ("tied_embeddings=maybe", r"tied_embeddings=maybe: give tied_embeddings=true or false"),
        ("cp_rotate=ring", r"cp_rotate=ring: give cp_rotate=allgather or alltoall"),
    ],
)
def test_a_bad_plan_token_is_a_one_line_error(token, message):
    with pytest.raises(published.PublishedError, match=message):
        row = _megatron_row(f"megatron tp=2 pp=1 dp=4 distributed_optimizer {token}")
        published.question(row)


def test_torchs_gathered_context_parallel_waits_on_its_gathers():
    rows = [
        row
        for row in published.read_rows(published.DATA / "public_runs.csv")
        if published._token_value(row, published.CP_ROTATE_TOKEN) == "allgather"
    ]
    assert rows
    for row in rows:
        gathered = published.question(row)[1]
        assert gathered.backend.options["cp_attention"] == "ring"
        assert gathered.backend.options.get("schedule", "1f1b") == "1f1b"  # the token left the layout's schedule alone
        passed = published.question({**row, "sharding": row["sharding"].replace("allgather", "alltoall")})[1]
        assert any("allgather rotate method" in c.what for c in gathered.collectives)
        assert not any("allgather rotate method" in c.what for c in passed.collectives)
        assert gathered.time.exposed_comm_s >= passed.time.exposed_comm_s


def test_every_dense_megatron_row_names_its_attention_kernel():
    for path in published.runs_csvs():
        for row in published.read_rows(path):
            if row["sharding"].startswith("megatron") and path.name != "moe_runs.csv":
                assert published._token_value(row, published.ATTENTION_TOKEN), (path.name, row["model"])


def test_megatrons_ddp_reduces_its_low_precision_gradients_as_they_are():
    shape_params = published.shape_of_row(_megatron_row("megatron tp=1 pp=1 dp=8 ddp")).params
    as_they_are = published.question(_megatron_row("megatron tp=1 pp=1 dp=8 ddp"))[1]
    fp32 = published.question(
        _megatron_row(
            "megatron tp=1 pp=1 dp=8 ddp", mp_mode="bf16 parameters, fp32 main parameters and gradient reduction"
        )
    )[1]
    reduce = [next(c for c in p.collectives if c.what == "all-reduce gradients") for p in (as_they_are, fp32)]
    assert reduce[0].payload_bytes == 2 * shape_params  # megatron/model/distributed.py: param.grad, bf16
    assert reduce[1].payload_bytes == 4 * shape_params  # its fp32 main_grad


def test_a_pipeline_gpu_is_charged_its_own_tables_and_micro_batches():
    # Megatron-Bridge's Llama 3.1 405B on 256 GB200 at PP 16 x VP 4, the embedding and the loss
    # counted in the split: 8 blocks on each GPU between, 7 beside the embedding or the head. Planned
    # as 8 blocks beside a table with the first GPU's micro-batches in flight it sat 4% past the
    # card (189.5 GiB, 181.6 usable); each GPU as it is held, it fits, as it ran.
    rows = [
        r
        for r in published.read_rows(published.DATA / "model_parallel_nvidia.csv")
        if r["model"] == "llama3.1-405b" and r["gpu"] == "GB200" and "pp=16 vp=4" in r["sharding"]
    ]
    planned = [o for o in published.plan_rows(rows) if o.plan is not None]
    assert planned and all("embedding_in_pipeline_split" in o.row["sharding"] for o in planned)
    assert all(o.plan.fits for o in planned)


def test_a_moe_run_both_csvs_hold_counts_once():
    """model_parallel_nvidia.csv records Megatron-Bridge's MoE runs without their shape, moe_runs.csv with it:
    every one but the layout that does not divide (bench/data/README.md) is the same run, counted there."""
    moe_rows = published.read_rows(published.DATA / published.MOE_CSV)
    nvidia = published.read_rows(published.DATA / "model_parallel_nvidia.csv")
    shapeless = [r for r in nvidia if r["arch"] == "moe"]
    repeats = moe_runs_held(moe_rows)
    assert len([r for r in shapeless if repeats(r)]) == len(shapeless) - 1
    assert not any(repeats(r) for r in nvidia if r["arch"] != "moe")
    assert not any(repeats(r) for r in moe_rows)  # a row with its shape is the one counted


def test_megatron_fsdp_holds_its_root_its_head_gradient_and_fp8_weights_as_its_source_says():
    """Megatron-FSDP's units are its transformer layers: the embedding and the output layer stay
    gathered for the step, and the output layer's weight gradient is made beside the logits' gradient;
    with fp8 parameters the blocks' matrices are held and gathered as fp8 (a uint8 weight buffer)."""
    row = next(
        r
        for r in published.read_rows(published.DATA / "model_parallel_nvidia.csv")
        if r["gpu"] == "GB200" and "megatron_fsdp" in r["sharding"] and "fp8_param_gather" in r["sharding"]
    )
    shape = published.shape_of_row(row)
    fp8 = published.question(row)[1]
    bf16 = published.question({**row, "sharding": row["sharding"].replace(" fp8_param_gather", "")})[1]
    head = shape.dims.vocab * shape.dims.width
    assert fp8.buffers.backward["root parameters gathered for the step"] == 2 * shape.root_params()
    assert fp8.buffers.backward["the output layer's weight gradient, beside the logits' gradient"] == 2 * head
    gathered = "blocks gathered (in use + prefetched)"
    assert fp8.buffers.backward[gathered] == pytest.approx(bf16.buffers.backward[gathered] / 2, rel=0.01)
    # The embedding and the output layer keep their bf16 weights: 3% of the 70B.
    assert fp8.states_on()["params"] == pytest.approx(bf16.states_on()["params"] / 2, rel=0.05)


def test_deepspeeds_optimizer_offload_is_planned_on_the_host_and_flash4_is_listed():
    """A `deepspeed zero=N ... offload` row is planned with its optimizer state and step on the host
    (the parameters on the GPU), each GPU stepping its own shard; a kernel the planner holds no rate
    of (FlashAttention-4) is listed with its reason, not planned with another kernel's."""
    rows = published.read_rows(published.DATA / "model_parallel_other.csv")
    offloaded = [o for o in published.plan_rows(rows) if "offload" in o.row["sharding"].split()]
    planned = [o for o in offloaded if o.plan is not None]
    assert {o.row["model"] for o in planned} >= {"gpt-175b", "gpt-1t", "gpt-2t", "llama3.1-8b"}
    for o in planned:
        assert o.plan.backend.offload_optimizer and not o.plan.backend.offload_params
        shard = o.plan.backend.stage == 3 and o.plan.time.offload_step_s > 0
        assert shard, o.row["model"]
    unplanned = [o.skipped for o in offloaded if o.plan is None]
    assert unplanned and all("attention=flash4" in why for why in unplanned)
    # DeepSpeed's Azure 2T ran with its checkpoints in main memory (`activation_offload`): 122 GiB on the GPU without.
    (two_t,) = [o for o in planned if o.row["model"] == "gpt-2t"]
    assert two_t.plan.fits and two_t.plan.peak_bytes < 40 * 2**30


def test_the_sweeps_goal_line_holds_it_to_the_same_target():
    """The Ultra-Scale Playbook's sweep is held to the goals' 10% in a line of its own (the report's
    section is checked with the whole report, above)."""

    def outcome(error: float):
        return SimpleNamespace(error=error)

    assert published.sweep_goal_row([outcome(0.05), outcome(-0.08)]).endswith("| 6.5% of 2 | yes |")
    assert published.sweep_goal_row([outcome(0.5), outcome(0.3)]).endswith("| 40.0% of 2 | NO |")


def test_nanotrons_zero1_all_reduces_its_fp32_gradients_after_the_backward_and_copies_back_by_hand():
    """nanotron's ZeRO-1 beside its fp32 accumulation runs no DDP: one all-reduce of the whole fp32
    gradient buffer after the backward, then a list all-gather copied back tensor by tensor and rank
    by rank from Python, neither beside any compute; Megatron's distributed optimizer reduce-scatters."""
    layout = "megatron tp=2 pp=1 dp=4 ddp zero=1 overlap_grad_reduce"
    _, megatron = _planned_row(layout)
    q, nanotron = _planned_row(f"{layout} nanotron")
    assert any(c.what == "reduce-scatter gradients" for c in megatron.collectives)
    reduce, gather = (c for c in nanotron.collectives if "nanotron's ZeRO-1" in c.what)
    assert (reduce.kind, reduce.calls, reduce.window) == ("all-reduce", 1, None)
    assert reduce.payload_bytes == pytest.approx(q.shape.params / 2 * 4)  # fp32, its tensor-parallel half
    assert (gather.kind, gather.window, gather.group.size) == ("all-gather", None, 4)
    assert gather.host_copies == len(q.shape.tensors) * 4
    assert nanotron.time.overhead_s > megatron.time.overhead_s
    assert "copied back from a list all-gather" in nanotron.time.overhead_what
