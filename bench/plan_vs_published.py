#!/usr/bin/env python3
"""The plan against published training runs: every row of a published-runs CSV (the columns of
bench/data/torchtitan_llama_fsdp.csv) planned as it ran, predicted tokens/s per GPU and memory
beside the published ones, and the summary: the goals, median error, share within 15%, fit misses,
pick rate and regret among one job's published settings, by layout kind (data parallel only,
tensor parallel inside and across nodes, pipelines, context parallel), scale and card over every
CSV together, and the bias by GPU, node count and sequence length for each CSV separately.

    python bench/plan_vs_published.py                      # every runs CSV of bench/data, to bench/results/
                                                           # and harness/plan/published_accuracy.json
    python bench/plan_vs_published.py my_runs.csv --out -  # another CSV, printed only
    python bench/plan_vs_published.py --rows               # every row's prediction as well

Runs from a fresh clone on the CPU in seconds (no torch: the planner reads the shapes). A row the
planner cannot plan as it ran (a mixture of experts, Megatron-FSDP, partial recomputation, block- or
rowwise-scaled fp8, a card it does not know) is listed with the reason and left out of the figures.
Each row's mapping to the plan's options is in `question` below: the model's shape and run from its
columns, the network from its `network`, and how it computed from the plan tokens its `sharding`
names (the attention kernel, TransformerEngine's modules, a fused loss, a tied head, the data- and
tensor-parallel overlap, DeepSpeed's pipeline engine, InternEvo's HybridZeroOptimizer, torch's
context-parallel rotate method), each written from its source's configs (bench/data/README.md,
"Plan tokens").
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.layout_kinds import degrees, kinds_of, scale_of  # noqa: E402
from bench.moe_rows import (  # noqa: E402
    CUDA_GRAPH_TOKEN,
    RECOMPUTE_TOKEN,
    MoERowError,
    graph_options,
    moe_head,
    moe_runs_held,
    moe_shape_of_row,
    qk_norm,
    recompute_modules,
    with_experts,
)
from bench.published_breakdown import (  # noqa: E402
    Pick,
    accuracy_figures,
    breakdown_lines,
    choice_by_kind_lines,
    figures_of,
    goal_lines,
    work_bucket,
)
from bench.sweep_layer_time import flat_time_lines, layer_time_lines  # noqa: E402
from harness.common.hardware import GPUSpec, gpu_spec  # noqa: E402
from harness.common.units import GIB  # noqa: E402
from harness.plan.memory.recipe import Recipe, with_tied_embeddings  # noqa: E402
from harness.plan.model.model_shape import ModelShape, PlanError, shape_of_description  # noqa: E402
from harness.plan.network.comm import HYBRID_ZERO, ZERO3_LIST_COLLECTIVES  # noqa: E402
from harness.plan.network.fabric import FABRICS, Fabric, default_fabric, parse_fabric, topology_of  # noqa: E402
from harness.plan.parallel.backends import MEGATRON_FSDP as MEGATRON_FSDP_UNITS  # noqa: E402
from harness.plan.parallel.backends import backend_of, filled_in  # noqa: E402
from harness.plan.parallel.deepspeed_pipeline import DEEPSPEED_PIPELINE  # noqa: E402
from harness.plan.parallel.pipeline_context import megatron_layout, published_layout  # noqa: E402
from harness.plan.plan_options import PLAN_PRECISIONS, check_precision  # noqa: E402
from harness.plan.predict import Question, StrategyPlan, plan_backend, storage_precision  # noqa: E402
from harness.plan.published_accuracy import (  # noqa: E402
    ACCURACY_FILE,
    DATA_PARALLEL,
    KINDS,
    PIPELINE,
    SCALES,
    TP_ACROSS,
    TP_INSIDE,
    leading_kind,
)
from harness.plan.speed.alibi_scores import ALIBI  # noqa: E402
from harness.plan.speed.attention import KERNELS as ATTENTION_KERNELS  # noqa: E402
from harness.plan.speed.calibration import default_factors  # noqa: E402
from harness.plan.speed.compute import kernel_launches  # noqa: E402
from harness.plan.speed.dropout import SOFTMAX_DROPOUT_FUSION  # noqa: E402
from harness.plan.speed.host_issue import LAUNCH_BLOCKING, LAYER_SYNCS, host_slowdown  # noqa: E402
from harness.plan.speed.masked_softmax import SWAPPED_SOFTMAX_CHECK  # noqa: E402
from harness.plan.speed.nanotron_step import NANOTRON_ENGINE  # noqa: E402
from harness.plan.speed.scaled_scores import SCALED_SCORES  # noqa: E402
from harness.plan.speed.step_time import HOST_S_PER_LAUNCH, for_card  # noqa: E402
from strategies.plan_model import PlanModel  # noqa: E402

DATA = ROOT / "bench" / "data"
# The runs this script was first held to (FSDP and ZeRO, a few Megatron-LM and NeMo rows); every
# other CSV of bench/data with the same columns (the model-parallel runs) follows them.
FIRST_CSVS = (DATA / "torchtitan_llama_fsdp.csv", DATA / "public_runs.csv")
OOM_CSV = DATA / "published_oom.csv"
# Runs that are not performance publications (bench/data/README.md): reported on their own, outside the goals.
CI_BASELINES = DATA / "ci_baselines" / "megatron_functional_tests.csv"
# One team's sweep of thousands of layouts on its own cluster, each a single step (bench/data/README.md says
# why it is reported apart from the goals' buckets, and how far the plan is from it).
SWEEP = DATA / "sweeps" / "nanotron_ultrascale_playbook.csv"
MOE_CSV = "moe_runs.csv"  # the mixtures of experts with their shape (bench/moe_rows.py)
COLUMNS = (
    "source",
    "model",
    "arch",
    "n_layers",
    "d_model",
    "n_heads",
    "ffn",
    "kv_heads",
    "vocab",
    "seq_len",
    "gpus",
    "nodes",
    "gpu",
    "network",
    "micro_batch",
    "grad_accum",
    "activation_checkpointing",
    "compile",
    "sharding",
    "precision",
    "mp_mode",
    "published_tok_s_gpu",
    "published_mem_gib",
)
WITHIN = 0.15
KERNEL_FOR_MPT = "triton"
CHECKPOINTING = {
    "true": "full",
    "full": "full",
    "yes": "full",
    "false": "none",
    "none": "none",
    "no": "none",
    "": "none",
}


def _checkpointing(value: str) -> str:
    """A row's activation checkpointing as the plan's mode (selective: torchtitan's op-level policy;
    a Megatron row's selective is its core attention's recomputation instead, `question`)."""
    key = value.strip().lower()
    return "selective" if "selective" in key else CHECKPOINTING.get(key, "full")


class PublishedError(ValueError):
    """A CSV that cannot be read as published runs (one line, says what to give)."""


@dataclass(frozen=True)
class Outcome:
    row: dict[str, str]
    plan: StrategyPlan | None
    skipped: str | None = None

    @property
    def published(self) -> float | None:
        value = self.row.get("published_tok_s_gpu")
        return float(value) if value else None

    @property
    def predicted(self) -> float | None:
        if self.plan is None or self.plan.time is None:
            return None
        return self.plan.time.tokens_per_s / int(self.row["gpus"])

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.published:
            return None
        return self.predicted / self.published - 1

    @property
    def memory_error(self) -> float | None:
        """Predicted max reserved against the published figure (torchtitan reports max reserved GiB)."""
        value = self.row.get("published_mem_gib")
        if not value or self.plan is None or self.plan.reserved_bytes is None:
            return None
        return self.plan.reserved_bytes / GIB / float(value) - 1


def runs_csvs(data: Path = DATA) -> list[Path]:
    """Every CSV of published runs in `data`: FIRST_CSVS, then the others with their columns
    (not the out-of-memory configurations, nor the CSVs of kernels and collectives), by name."""
    others = []
    for path in sorted(data.glob("*.csv")):
        if path in FIRST_CSVS or path == OOM_CSV:
            continue
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if all(c in header for c in COLUMNS):
            others.append(path)
    return [p for p in FIRST_CSVS if p.parent == data] + others


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise PublishedError(
            f"{path}: no such file: give a CSV of published runs (the columns of {FIRST_CSVS[0].name})"
        )
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise PublishedError(
                f"{path}: no column {', '.join(missing)}: give every column of {FIRST_CSVS[0].name} "
                "(bench/data/README.md describes them)"
            )
        return list(reader)


NETWORK_PER_NODE = re.compile(r"(\d+)x(\d+(?:\.\d+)?)gbps-(?:ib|roce|efa)")


def _fabric(row: dict[str, str], gpu: GPUSpec) -> Fabric:
    """The network a row names: torchtitan's hosts, llm-foundry's RoCE, fms-fsdp's per-node figure."""
    text = row["network"].strip().lower()
    if text in FABRICS:
        return FABRICS[text]
    per_node = NETWORK_PER_NODE.fullmatch(text)
    if per_node:  # bench/data/README.md's `<cards>x<rate>gbps-<ib|roce|efa>`
        return parse_fabric(f"{per_node.group(1)}x{per_node.group(2)}gbps")
    if "per-gpu" in text and "unstated" not in text:
        rate = text.split("gbps")[0].split("-")[-1]
        return parse_fabric(f"{int(row['gpus']) // int(row['nodes'] or 1)}x{rate}gbps")
    if "1600gbps-per-node" in text:
        return FABRICS["mosaicml-a100"]
    if "inter-node" in text:  # fms-fsdp: "400gbps-inter-node", per node or per GPU not stated: per node
        return parse_fabric(text.split("gbps")[0] + "gbps")
    return default_fabric(gpu, gpu.gpus_per_host)


def _megatron_sharding(sharding: str) -> str:
    """A Megatron row's sharding in the planner's words: DeepSpeed's ZeRO-1 beside Megatron-LM's
    model parallelism (Megatron-DeepSpeed's `zero=1`) shards the optimizer state over the
    data-parallel GPUs as Megatron-LM's distributed optimizer does."""
    return " ".join("distributed_optimizer" if token == "zero=1" else token for token in sharding.split())


DENSE_ARCHS = ("gpt", "llama", "mpt")  # the archs shape_of_row plans; the others are mixtures of experts


def _not_modelled(row: dict[str, str]) -> str | None:
    """Why a row's run is one the planner has no model for (its model, layout or recomputation), or None."""
    sharding, checkpointing = row["sharding"].lower(), row["activation_checkpointing"].strip().lower()
    tokens = sharding.split()
    if moe_head(row) is None and (row["arch"] not in DENSE_ARCHS or degrees(sharding).ep > 1):
        # moe_runs.csv's rows carry their shape in the notes' moe head; the others name only their family.
        return "mixture of experts without the notes' moe head (moe_runs.csv holds the planned runs): not planned"
    if MEGATRON_FSDP in tokens and moe_head(row) is not None:
        return "Megatron-FSDP beside expert parallel: not modelled"
    if FP8_PARAM_GATHER in tokens and MEGATRON_FSDP not in tokens:
        return "fp8 parameters beside Megatron's DDP or distributed optimizer: not modelled"
    if "offload" in tokens and not sharding.startswith("deepspeed"):  # DeepSpeed's is its optimizer offload
        return "offloading to the host: not modelled"
    named = _token_value(row, ATTENTION_TOKEN)
    if named in UNPRICED_ATTENTION:
        return f"attention={named}: {UNPRICED_ATTENTION[named]}, whose rate the planner does not hold: not modelled"
    if any(t.startswith("zero_group=") for t in tokens) and HYBRID_ZERO not in tokens:
        return "ZeRO over a subgroup of the data-parallel GPUs (zero_group=): not modelled"
    if checkpointing == "partial":
        return "recomputing some of the layers (partial): not modelled"
    return None


def _card(row: dict[str, str]) -> GPUSpec | str:
    """The row's card, or why it has none."""
    name = row["gpu"].strip()
    spec = gpu_spec(name)
    return spec if spec is not None else f"card {name}: not one the planner knows"


# What a row's `sharding` says beyond its layout (bench/data/README.md, "Plan tokens"), each written into
# the row from its source's configs: the attention kernel, TransformerEngine's modules, a fused
# cross-entropy, whether the head is tied to the embedding, DeepSpeed's pipeline engine, and the attention
# in fp8 (TransformerEngine's fp8 DotProductAttention).
ATTENTION_TOKEN = "attention="
# Kernels published runs name that harness/plan/speed/attention.py holds no rate of: their rows are listed,
# not planned with another kernel's rate.
UNPRICED_ATTENTION = {"flash4": "FlashAttention-4 (Blackwell)"}
MEGATRON_FSDP = "megatron_fsdp"
# Megatron-core's fp8 parameters (`fp8_param_gather`): Megatron-FSDP holds and gathers the blocks' weights
# in fp8 (recipe.py's fp8_all_gather). TransformerEngine's cross-entropy writes the logits' gradient
# over them (Megatron-core's cross_entropy_fusion_impl='te': recipe.py's loss_in_place).
FP8_PARAM_GATHER = "fp8_param_gather"
LOSS_IN_PLACE = "loss_in_place"
# The head's matmul and the cross-entropy fused a chunk of tokens at a time (Liger-Kernel's fused linear
# cross-entropy: recipe.py's fused_linear_loss), beside `fused_loss`.
FUSED_LINEAR_LOSS = "fused_linear_loss"
# The blocks' saved activations in host memory, but for those in flight (DeepSpeed's cpu_checkpointing, the
# checkpoints of its activation checkpointing kept on the CPU: recipe.py's activation_offload).
ACTIVATION_OFFLOAD = "activation_offload"
# Megatron-core's cpu_offloading_num_layers: that many blocks' activations in host memory (recipe.py).
OFFLOAD_TOKEN = "activation_offload_layers="
TRANSFORMER_ENGINE = "transformer_engine"
FUSED_LOSS = "fused_loss"
TIED_TOKEN = "tied_embeddings="
FP8_ATTENTION = "fp8_attention"
FUSED_NORM = "fused_norm"  # the norms' own fused kernels beside unfused blocks (AutoModel's TransformerEngine RMSNorm)
BIASES = "biases"  # a GPT with a bias in every linear layer and norm (Megatron-LM's), each a tensor of its own
# nanotron's engine beside its Megatron-style layers: its fp32 cast of the logits and its cross-entropy, its
# FP32GradientAccumulator (speed/nanotron_step.py).
NANOTRON = "nanotron"
# torch's context parallel (torchtitan's experimental.context_parallel_rotate_method): `allgather`
# gathers every k, v shard after the first chunk's attention, `alltoall` passes them round the ring.
CP_ROTATE_TOKEN = "cp_rotate="
CP_ROTATE_METHODS = ("allgather", "alltoall")
# The run's dropout probability, on the attention's probabilities and on each block's outputs alike (recipe.py's
# attention_dropout and hidden_dropout: Megatron-LM's defaults of 0.1 where its scripts set neither).
DROPOUT_TOKEN = "dropout="
# A mixture of experts' (bench/moe_rows.py): Megatron-core's recomputed modules, the all-to-all overlap, its MoE
# layer on another engine.
PLAN_FLAGS = (
    TRANSFORMER_ENGINE,
    FUSED_LOSS,
    LOSS_IN_PLACE,
    FUSED_LINEAR_LOSS,
    ACTIVATION_OFFLOAD,
    FP8_PARAM_GATHER,
    FUSED_NORM,
    DEEPSPEED_PIPELINE,
    LAUNCH_BLOCKING,
    LAYER_SYNCS,
    SWAPPED_SOFTMAX_CHECK,
    SOFTMAX_DROPOUT_FUSION,
    ALIBI,
    SCALED_SCORES,
    HYBRID_ZERO,
    FP8_ATTENTION,
    BIASES,
    NANOTRON,
    "a2a_overlap",
    ZERO3_LIST_COLLECTIVES,
    "megatron_moe_layer",
)
# The plan tokens that are the backend's options as they stand, each priced where it is defined.
BACKEND_FLAGS = (
    LAUNCH_BLOCKING,  # host_issue.py: every launch waits for its kernel
    LAYER_SYNCS,  # host_issue.py: each layer's forward waits on blocking copies
    SWAPPED_SOFTMAX_CHECK,  # masked_softmax.py: the fused kernel refused or not
    ALIBI,  # alibi_scores.py: the bias copied into the scores and read back
    SCALED_SCORES,  # scaled_scores.py: the scale and the mask as passes of their own
    SOFTMAX_DROPOUT_FUSION,  # dropout.py: OneFlow's softmax draws the dropout
)
PLAN_KEYS = (
    ATTENTION_TOKEN,
    TIED_TOKEN,
    CP_ROTATE_TOKEN,
    RECOMPUTE_TOKEN,
    CUDA_GRAPH_TOKEN,
    OFFLOAD_TOKEN,
    DROPOUT_TOKEN,
)


def _plan_tokens(row: dict[str, str]) -> list[str]:
    """The row's plan tokens: the words of its sharding that say how it ran, not how it is laid out."""
    return [w for w in row["sharding"].split() if w in PLAN_FLAGS or w.startswith(PLAN_KEYS)]


def _layout_sharding(row: dict[str, str]) -> str:
    """The row's sharding without its plan tokens: the layout alone, as the planner's parsers read it."""
    tokens = set(_plan_tokens(row))
    return " ".join(w for w in row["sharding"].split() if w not in tokens)


def _token_value(row: dict[str, str], key: str) -> str | None:
    values = [w[len(key) :] for w in _plan_tokens(row) if w.startswith(key)]
    return values[-1] if values else None


def _tied_embeddings(row: dict[str, str]) -> bool | None:
    """The head tied to the embedding (true) or a separate matrix (false) where the row says so,
    against its arch's default (gpt: tied, llama: untied); None: as the arch is."""
    value = _token_value(row, TIED_TOKEN)
    if value is None:
        return None
    if value not in ("true", "false"):
        raise PublishedError(f"{row['model']}: tied_embeddings={value}: give tied_embeddings=true or false")
    return value == "true"


def _cp_rotate(row: dict[str, str]) -> str | None:
    """How torch's context parallel exchanged k and v in the row's run (its `cp_rotate=` token), or None."""
    rotate = _token_value(row, CP_ROTATE_TOKEN)
    if rotate is not None and rotate not in CP_ROTATE_METHODS:
        raise PublishedError(f"{row['model']}: cp_rotate={rotate}: give cp_rotate=allgather or alltoall")
    return rotate


def _layout(row: dict[str, str]) -> tuple[PlanModel, dict] | str:
    """The run's sharding as a PlanModel and its options, or why it cannot be planned."""
    sharding = _layout_sharding(row)
    rotate = _cp_rotate(row)
    if sharding.lower().startswith("megatron"):
        sharding = _megatron_sharding(sharding)
    reduce_fp32 = "reduce fp32" in row["mp_mode"] or "DEFAULT" in row["mp_mode"]
    # A Megatron row's data-parallel overlap is what its sharding names (overlap_grad_reduce,
    # overlap_param_gather), nothing else: both off where it names neither.
    split = published_layout(sharding, reduce_fp32, overlap_dp=False)
    if split is not None and not isinstance(split, str):
        model, options = split
        if DEEPSPEED_PIPELINE in _plan_tokens(row):
            options = {**options, DEEPSPEED_PIPELINE: True}  # deepspeed_pipeline.py prices its engine
        if rotate is not None:
            options = {**options, "cp_rotate": rotate}  # context_parallel_cost.py's CP_ROTATE
        return _experts(row, (model, options))
    if split is not None:
        return split
    if row["activation_checkpointing"] == "selective" and "fraction p of blocks" in row["notes"]:
        return "checkpointing an unstated fraction of the blocks: not modelled"
    lowered = sharding.lower()
    if lowered.startswith("megatron") and MEGATRON_FSDP in lowered.split():
        return _experts(row, _megatron_fsdp_layout(sharding))
    if lowered.startswith("megatron") and HYBRID_ZERO in _plan_tokens(row):
        return _experts(row, _hybrid_zero_layout(sharding))
    if lowered.startswith("megatron"):
        return _experts(row, megatron_layout(sharding, overlap_dp=False))
    if "zero" in lowered:  # DeepSpeed: ZeRO-1, ZeRO-2, ZeRO-3 (as 2021's DeepSpeed ran it where the row says so)
        stage = next((int(c) for c in lowered.split("zero")[1] if c in "123"), 3)
        listed = stage == 3 and ZERO3_LIST_COLLECTIVES in _plan_tokens(row)
        # `offload`: the optimizer state and its step on the host (DeepSpeedCPUAdam), the parameters on the GPU.
        model = PlanModel("deepspeed", stage, "low_precision", offload_optimizer="offload" in lowered.split())
        return model, {ZERO3_LIST_COLLECTIVES: True} if listed else {}
    if lowered.startswith("ddp") or "distributeddataparallel" in lowered:
        return PlanModel("torch", 0, data_parallel=True), {}
    common = dict(engine="torch", stage=3, mixed_precision="low_precision", reduce_in_fp32=reduce_fp32)
    # FSDP reduce-scatters on every micro-step in these runs (Composer and torchtitan keep no
    # unsharded gradients between micro-steps).
    options = {"sync_each_micro_step": True}
    if "SHARD_GRAD_OP" in sharding:
        return PlanModel(**common, reshard_after_forward=False), options
    if "HYBRID" in sharding:
        return PlanModel(**common, hybrid_shard=True), options
    if "tp=" in sharding and int(sharding.split("tp=")[1].split()[0]) > 1:
        tp = int(sharding.split("tp=")[1].split()[0])
        async_tp = {"async_tp": True} if "async_tp" in sharding.split() else {}
        return _experts(row, (PlanModel(**common, tensor_parallel=True), {**options, "tp_size": tp, **async_tp}))
    return _experts(row, (PlanModel(**common), options))


def _megatron_fsdp_layout(sharding: str) -> tuple[PlanModel, dict]:
    """Megatron-FSDP as Megatron-Bridge's performance recipes run it (`use_megatron_fsdp`, its default
    `data_parallel_sharding_strategy='optim_grads_params'`): Megatron's layers and tensor parallel, the
    parameters, gradients and optimizer state sharded over the data-parallel GPUs, each layer's
    parameters gathered for its forward and again for its backward, the gradients reduce-scattered
    on every micro-step (megatron/core/distributed/fsdp); its units and buffers as memory/buffers.py
    says (MEGATRON_FSDP)."""
    model, options = megatron_layout(sharding)
    options = {**options, "distributed_optimizer": False, "sync_each_micro_step": True, MEGATRON_FSDP_UNITS: True}
    return replace(model, stage=3, reshard_after_forward=True), options


def _experts(row: dict[str, str], layout: tuple[PlanModel, dict] | str) -> tuple[PlanModel, dict] | str:
    """A mixture of experts' layout with its expert parallel (bench/moe_rows.py); a dense row's with its
    step replayed from one CUDA graph where the row says so."""
    if isinstance(layout, str):
        return layout
    try:
        if moe_head(row) is None:
            return layout[0], {**layout[1], **graph_options(row)}
        return with_experts(row, *layout)
    except MoERowError as exc:
        raise PublishedError(str(exc)) from None


def _hybrid_zero_layout(sharding: str) -> tuple[PlanModel, dict]:
    """InternEvo's layout: Megatron-style tensor parallelism beside its HybridZeroOptimizer, whose
    ZeRO-1 group is `zero_group=` GPUs (InternLM's zero1=N: the optimizer state sharded within it and
    replicated across) or every data-parallel rank (comm.py's HYBRID_ZERO prices its collectives)."""
    model, options = megatron_layout(sharding, overlap_dp=False)
    group = re.search(r"\bzero_group=(\d+)", sharding)
    if group is None:
        return model, {**options, HYBRID_ZERO: True}
    return replace(model, hybrid_shard=True), {**options, HYBRID_ZERO: True, "shard_size": int(group.group(1))}


def strategy_of(row: dict[str, str]) -> str:
    """The parabench strategy a row's layout amounts to (the name the plan would give it)."""
    sharding = row["sharding"].lower()
    if sharding.startswith("megatron"):
        return "zero1-tp" if "distributed_optimizer" in _megatron_sharding(sharding) else "ddp-tp"
    if "zero" in sharding:
        return "zero" + next((c for c in sharding.split("zero")[1] if c in "123"), "3")
    if sharding.startswith("ddp"):
        return "ddp"
    if "tp=" in sharding:
        return "fsdp-tp"
    if "hybrid" in sharding:
        return "hsdp"
    return "fsdp"


def _attention(row: dict[str, str]) -> str:
    """The attention kernel the row's `attention=` token names (the source's configs at the cited
    commit: bench/data/README.md); without one, the unfused softmax on a V100 (no flash kernel runs
    there), llm-foundry's Triton kernel for its rows, SDPA's flash for the others. llm-foundry's
    benchmark script defaulted to its Triton kernel (Tri Dao's, on triton-pre-mlir) when the tables
    were made. Its >=128-GPU sweep (sweep.py at 5e85bd62d) asked for flash, with flash-attn 2.4.2,
    for 1b, 3b and 7b; those rows are planned with the Triton kernel all the same (FlashAttention-2's
    figures would plan them 22% to 49% fast): on 8 to 64 GPUs with the Triton kernel the same models
    ran within 4% of those rows' rate per GPU at 128 GPUs, which a kernel twice as fast would not
    allow."""
    named = _token_value(row, ATTENTION_TOKEN)
    if named is not None:
        if named not in ATTENTION_KERNELS:
            raise PublishedError(
                f"{row['model']}: attention={named}: give one of {', '.join(ATTENTION_KERNELS)} (bench/data/README.md)"
            )
        return named
    if gpu_spec(row["gpu"]).generation == "volta":
        return "math"
    if not row["source"].startswith("mosaicml"):
        return "flash"
    return KERNEL_FOR_MPT


def _fused_elementwise(row: dict[str, str]) -> bool:
    """Whether each chain of elementwise work between two matmuls runs as one kernel: torch.compile's
    (the row's compile), or TransformerEngine's modules under Megatron-core (`transformer_engine`:
    LayerNormLinear and LayerNormMLP, the norm, the activation and the fp8 casts fused into the
    kernels around the matmuls; Megatron-LM's fused bias-dropout-add and rotary embedding), planned
    as compiled."""
    return row["compile"].strip().lower() in ("true", "yes", "1") or _transformer_engine(row)


def _fused_norm(row: dict[str, str]) -> bool:
    """torchtitan's Triton RMSNorm where its config chose it, a row's `fused_norm` token (TransformerEngine's
    RMSNorm beside otherwise unfused blocks); Megatron-LM's norms are always fused kernels
    (TransformerEngine's, or Apex's FusedLayerNorm without it), saving the input and its statistics only."""
    return (
        "norm_type fused_rmsnorm" in row["notes"]
        or FUSED_NORM in _plan_tokens(row)
        or row["sharding"].lower().startswith("megatron")
    )


def _precision(row: dict[str, str]) -> str:
    """The plan's precision for the row, or why it has none: float8 (torchao's) and fp8
    (Transformer Engine's) runs are planned as tensorwise-scaled fp8 projections."""
    precision = row["precision"].strip().lower()
    if precision == "mxfp8":  # moe_runs.csv names MXFP8 in its precision column
        blackwell = gpu_spec(row["gpu"]).generation == "blackwell"
        return "fp8" if blackwell else "MXFP8 before Blackwell: not modelled"
    if precision == "nvfp4":
        return "fp4"
    if precision in ("fp8", "float8"):
        if "rowwise" in row["notes"]:
            return "float8 with rowwise scaling: only tensorwise scaling is modelled"
        if "MXFP8" in row["notes"] and gpu_spec(row["gpu"]).generation == "blackwell":
            return "fp8"  # Blackwell's tensor cores apply the block scales at the fp8 rate (recipe_of_row)
        if any(words in row["notes"] for words in ("MXFP8", "block scaling", "blockwise scaling")):
            return "fp8 with block scaling (MXFP8 before Blackwell, blockwise): not modelled"
        return "fp8"
    if precision not in PLAN_PRECISIONS:
        return f"precision {row['precision']}: not one the planner knows"
    return precision


# torchtitan commits whose training loop compiles the loss with the model (torchtitan/components/
# loss.py: `if job_config.training.compile: loss_fn = torch.compile(loss_fn)`); at 9dec370 and
# before, train.py leaves that commented out.
TORCHTITAN_COMPILED_LOSS = ("e7c0cae",)


def _fused_loss(row: dict[str, str]) -> bool:
    """A fused cross-entropy where the row's `fused_loss` token says its source ran one (Megatron-core's
    cross_entropy_loss_fusion, flash-attn's CrossEntropyLoss); llm-foundry's default loss is its fused
    cross-entropy; torchtitan's is compiled with the model where its code at the cited commit does so."""
    if FUSED_LOSS in _plan_tokens(row) or row["source"].startswith("mosaicml"):
        return True
    compiled = row["compile"].strip().lower() in ("true", "yes", "1")
    return (
        row["source"].startswith("pytorch/torchtitan")
        and compiled
        and any(c in row["notes"] for c in TORCHTITAN_COMPILED_LOSS)
    )


def _transformer_engine(row: dict[str, str]) -> bool:
    """Whether the row's blocks are TransformerEngine's modules (its `transformer_engine` token)."""
    return TRANSFORMER_ENGINE in _plan_tokens(row)


def recipe_of_row(row: dict[str, str]) -> Recipe:
    """What the source says its run did beyond the layout: the whole model cast to bf16 with its
    optimizer state (VectorLM: `model.bfloat16()`), Megatron's low-precision parameters beside an
    fp32 master (its Float16Module, NeMo's megatron_amp_O2) with fp32 gradients where it reduces
    them in fp32, torchao's fp8 all-gathers, TransformerEngine's fp8 (its casts, its fp8 saved inputs),
    the head tied or not as the row says, its dropout where its configs draw one."""
    megatron = row["sharding"].lower().startswith("megatron") and "fp32 main parameters" in row["mp_mode"]
    dropout = float(_token_value(row, DROPOUT_TOKEN) or 0)
    return Recipe(
        pure_bf16="model.bfloat16()" in row["notes"] or row["source"].startswith("VectorInstitute"),
        megatron_mixed_precision=megatron,
        fp32_grad_accum=megatron and "fp32 main parameters and gradient reduction" in row["mp_mode"],
        fp8_all_gather="enable_fsdp_float8_all_gather" in row["notes"] or FP8_PARAM_GATHER in _plan_tokens(row),
        fp8_saved_inputs=(_precision(row) == "fp8" and _transformer_engine(row))
        or (_precision(row) == "fp4" and ("NVFP4" in row["notes"] or row["precision"] == "nvfp4")),
        te_fp8=_precision(row) == "fp8" and _transformer_engine(row),
        fp8_block_scaling=_precision(row) == "fp8" and ("MXFP8" in row["notes"] or row["precision"] == "mxfp8"),
        fp8_attention=FP8_ATTENTION in _plan_tokens(row),
        tied_embeddings=_tied_embeddings(row),
        qk_norm=qk_norm(row),
        recompute_modules=recompute_modules(row) or (),
        activation_offload_layers=int(_token_value(row, OFFLOAD_TOKEN) or 0),
        loss_in_place=LOSS_IN_PLACE in _plan_tokens(row),
        fused_linear_loss=FUSED_LINEAR_LOSS in _plan_tokens(row),
        activation_offload=ACTIVATION_OFFLOAD in _plan_tokens(row),
        attention_dropout=dropout,
        hidden_dropout=dropout,
    )


def shape_of_row(row: dict[str, str]) -> ModelShape:
    """The model a row describes. Megatron-LM splits the embedding (VocabParallelEmbedding), the
    head (a ColumnParallelLinear) and the loss (vocab-parallel cross-entropy) over its
    tensor-parallel GPUs, as Llama's plans do and parabench's GPT plan does not. The head is tied
    or not as the row's tied_embeddings= says, else as its arch is."""
    described = moe_shape_of_row(row) if moe_head(row) is not None else _described(row)
    shape = with_tied_embeddings(described, _tied_embeddings(row))
    if row["sharding"].lower().startswith("megatron") and shape.dims is not None:
        return replace(shape, dims=replace(shape.dims, tp_splits_head=True))
    return shape


def _described(row: dict[str, str]) -> ModelShape:
    return shape_of_description(
        params=None,
        layers=int(row["n_layers"]),
        width=int(row["d_model"]),
        heads=int(row["n_heads"]),
        vocab=int(row["vocab"]),
        seq_len=int(row["seq_len"]),
        kv_heads=int(row["kv_heads"]) if row["kv_heads"] else None,
        ffn=int(row["ffn"]) if row["ffn"] else None,
        arch="llama" if row["arch"] == "llama" else "gpt",
        biases=BIASES in _plan_tokens(row),
    )


def question(
    row: dict[str, str], host_us_per_kernel: float | None = None
) -> tuple[Question, StrategyPlan | None, str | None]:
    """The plan of one published row, as it ran; `host_us_per_kernel`: an x86 host's eager pace in place of
    the default's (a Grace host's at the same ratio to it), for bench/host_pace.py."""
    gpu = _card(row)
    why_not = gpu if isinstance(gpu, str) else _not_modelled(row)
    if why_not is not None:
        return None, None, why_not  # type: ignore[return-value]
    if host_us_per_kernel is not None:
        gpu = replace(gpu, host_us_per_kernel=host_us_per_kernel * host_slowdown(gpu))
    precision = _precision(row)
    if precision not in PLAN_PRECISIONS:
        return None, None, precision  # type: ignore[return-value]
    layout = _layout(row)
    if isinstance(layout, str):
        return None, None, layout  # type: ignore[return-value]
    model, options = layout
    tokens = _plan_tokens(row)
    options = {**options, **{flag: True for flag in BACKEND_FLAGS if flag in tokens}}
    if NANOTRON in tokens:
        if not row["sharding"].lower().startswith("megatron"):
            raise PublishedError(
                f"{row['model']}: nanotron: give it beside a `megatron tp=...` layout (its layers' split)"
            )
        options = {**options, NANOTRON_ENGINE: True}  # nanotron_step.py: its loss and fp32 gradient accumulator
    try:
        check_precision(gpu, precision)
    except PlanError as exc:
        return None, None, str(exc).split(": use")[0]  # type: ignore[return-value]
    seq = int(row["seq_len"])
    micro_batch, grad_accum = int(row["micro_batch"]), int(row["grad_accum"] or 1)
    if model.pipeline_engine:  # Megatron-LM's accumulation is its pipeline's micro-batches: one schedule a step
        options = {**options, "microbatches": grad_accum}
        micro_batch, grad_accum = micro_batch * grad_accum, 1
    shape = shape_of_row(row)
    gpus, nodes = int(row["gpus"]), int(row["nodes"] or 1)
    # Megatron-LM's `selective` recomputes the core attention alone (core_attention_recompute.py).
    checkpointing = _checkpointing(row["activation_checkpointing"])
    selective = checkpointing == "selective"
    modules = recompute_modules(row)
    core_recompute = selective and modules is None and row["sharding"].lower().startswith("megatron")
    topology = topology_of(gpu, gpus, nodes, _fabric(row, gpu))
    q = Question(
        shape=shape,
        topology=topology,
        capacity_bytes=gpu.capacity_bytes,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        seq_len=seq,
        precision=precision,
        gpu=gpu,
        factors=for_card(default_factors(), gpu.name),
        # Megatron-core's recompute_modules stand for its selective recomputation (recipe_of_row, the
        # experts' own core_attn); else Megatron's selective is the core attention alone.
        checkpointing="none"
        if modules is not None or core_recompute
        else _checkpointing(row["activation_checkpointing"]),
        core_attention_recompute=core_recompute,
        fused_loss=_fused_loss(row),
        fused_norm=_fused_norm(row),
        complex_rope=row["source"].startswith("pytorch/torchtitan"),  # its apply_rotary_emb: view_as_complex
        attention=_attention(row),
        compiled=_fused_elementwise(row),
        eager_launches=_fused_elementwise(row) and row["compile"].strip().lower() not in ("true", "yes", "1"),
        recipe=recipe_of_row(row),
    )
    backend = filled_in(
        backend_of(model, _layout_sharding(row), options), shape, storage_precision(precision), gpus, options
    )
    return q, plan_backend(backend, q), None


def plan_rows(rows: list[dict[str, str]], host_us_per_kernel: float | None = None) -> list[Outcome]:
    out = []
    for row in rows:
        try:
            _, plan, skipped = question(row, host_us_per_kernel)
        except PlanError as exc:
            plan, skipped = None, f"the planner refused it: {exc}"
        except ValueError as exc:  # a size or count that is not a number
            plan, skipped = None, f"a column that is not a number ({exc})"
        out.append(Outcome(row, plan, skipped))
    return out


def _bucket_seq(seq: int) -> str:
    return "<= 2048" if seq <= 2048 else ("4096-8192" if seq <= 8192 else ">= 16384")


def _summary(errors: list[float]) -> str:
    within = sum(abs(e) <= WITHIN for e in errors) / len(errors)
    return (
        f"{len(errors)} runs: median error {statistics.median(errors):+.1%}, median |error| "
        f"{statistics.median(abs(e) for e in errors):.1%}, {within:.0%} within {WITHIN:.0%}"
    )


def _bias(outcomes: list[Outcome], key, title: str) -> list[str]:
    groups: dict[str, list[float]] = {}
    for o in outcomes:
        if o.error is not None:
            groups.setdefault(key(o.row), []).append(o.error)
    lines = [
        f"| {title} | runs | median predicted / published | median abs error | within 15% |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in sorted(groups, key=str):
        e = groups[name]
        lines.append(
            f"| {name} | {len(e)} | {1 + statistics.median(e):.3f} | {statistics.median(abs(x) for x in e):.1%} | "
            f"{sum(abs(x) <= WITHIN for x in e) / len(e):.0%} |"
        )
    return lines


def report(name: str, outcomes: list[Outcome], with_rows: bool) -> list[str]:
    planned = [o for o in outcomes if o.error is not None]
    lines = [f"### {name}", ""]
    if not planned:
        return lines + ["No row could be planned.", ""]
    lines += [f"Tokens/s per GPU: {_summary([o.error for o in planned])}.", ""]
    misses = [o for o in outcomes if o.plan is not None and o.plan.fits is False]
    lines.append(
        f"Fits: {len(outcomes) - len(misses) - sum(o.plan is None for o in outcomes)} of "
        f"{sum(o.plan is not None for o in outcomes)} planned runs planned to fit; every one of them ran."
    )
    for o in misses:
        lines.append(
            f"- fit miss: {o.row['model']} on {o.row['gpus']} {o.row['gpu']}, seq {o.row['seq_len']}, micro-batch "
            f"{o.row['micro_batch']}, {o.row['activation_checkpointing']} AC: {o.plan.reserved_bytes / GIB:.1f} GiB "
            f"predicted, {o.plan.headroom.usable / GIB:.1f} usable"
        )
    memory = [o for o in outcomes if o.memory_error is not None]
    if memory:
        errors = [o.memory_error for o in memory]
        lines.append(
            f"Memory (predicted max reserved against the published max reserved, {len(memory)} runs): median error "
            f"{statistics.median(errors):+.1%}, largest {max(errors, key=abs):+.1%}."
        )
    lines += ["", *_bias(planned, lambda r: r["gpu"], "GPU"), ""]
    lines += [*_bias(planned, lambda r: int(r["nodes"] or 1), "nodes"), ""]
    lines += [*_bias(planned, lambda r: _bucket_seq(int(r["seq_len"])), "sequence length"), ""]
    if len({_precision(o.row) for o in planned}) > 1:
        lines += [*_bias(planned, _precision, "precision"), ""]
    sources = {o.row["source"].split(":")[0] for o in planned}
    if len(sources) > 1:
        lines += [*_bias(planned, lambda r: r["source"].split(":")[0], "source"), ""]
    skipped = [o for o in outcomes if o.skipped]
    if skipped:
        reasons: dict[str, int] = {}
        for o in skipped:
            reasons[o.skipped] = reasons.get(o.skipped, 0) + 1
        lines.append("Not planned: " + "; ".join(f"{n} x {why}" for why, n in reasons.items()) + ".")
        lines.append("")
    if with_rows:
        lines += [
            "| model | GPUs | GPU | seq | micro-batch | AC | compile | sharding | published tok/s/GPU | predicted "
            "| error | "
            "published GiB | predicted reserved GiB | fits |",
            "|---|---:|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for o in outcomes:
            r = o.row
            if o.plan is None:
                continue
            lines.append(
                f"| {r['model']} | {r['gpus']} | {r['gpu']} | {r['seq_len']} | {r['micro_batch']} | "
                f"{r['activation_checkpointing']} | {r['compile']} | {r['sharding']} | {o.published:,.0f} | "
                f"{o.predicted:,.0f} | {o.error:+.1%} | {r['published_mem_gib'] or '-'} | "
                f"{o.plan.reserved_bytes / GIB:.1f} | {'yes' if o.plan.fits else 'NO'} |"
            )
        lines.append("")
    return lines


def publication(row: dict[str, str]) -> str:
    """The document a row was published in (its source up to the commit): one set of runs, made
    with one version of the software."""
    return row["source"].split("@")[0]


def jobs_of(outcomes: list[Outcome]) -> dict[tuple, list[Outcome]]:
    """One job's published settings: rows of one publication and table, model (its shape), card, GPU count,
    sequence and precision that differ in layout (strategy, micro-batch, accumulation,
    checkpointing), each planned, by job. The same setting published by two documents (torchtitan's
    70B float8 2D runs of December 2024 and of June 2025: another torch, 829 and 809.8 tokens/s) is
    two jobs, not a choice between identical layouts; so are two tables of one document (each of
    Megatron-Bridge's summary sections is another container release), and two shapes under one name
    (BigScience's trials publish 64, 96 and 128 heads of one width as "182B" in one table: another
    model, not another layout)."""
    jobs: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        if o.error is None:
            continue
        r = o.row
        # The vocabulary is left out: Megatron pads it to a multiple of 128 x tp, another size a layout.
        shape = tuple(r[c] for c in ("n_layers", "d_model", "n_heads", "ffn", "kv_heads"))
        key = (publication(r), r["model"], r["gpu"], r["gpus"], r["seq_len"], r["precision"], r["table"], shape)
        jobs.setdefault(key, []).append(o)
    return {
        key: rows
        for key, rows in jobs.items()
        if len(
            {
                (o.row["sharding"], o.row["micro_batch"], o.row["grad_accum"], o.row["activation_checkpointing"])
                for o in rows
            }
        )
        > 1
    }


def picks_of(outcomes: list[Outcome]) -> list[Pick]:
    """For each job (jobs_of): the plan's pick among the rows planned to fit, the fastest as published."""
    out = []
    for key, rows in jobs_of(outcomes).items():
        fitting = [o for o in rows if o.plan.fits is not False] or rows
        out.append(Pick(key, max(fitting, key=lambda o: o.predicted), max(rows, key=lambda o: o.published), rows))
    return out


def choices(outcomes: list[Outcome]) -> list[tuple[tuple, Outcome, Outcome]]:
    """For each job (jobs_of): its key, the plan's pick among the rows planned to fit, the fastest as published."""
    return [(p.key, p.pick, p.best) for p in picks_of(outcomes)]


def choice_lines(outcomes: list[Outcome]) -> list[str]:
    """Each job's settings, fastest published first, with the plan's tokens/s and its order."""
    jobs = jobs_of(outcomes)
    if not jobs:
        return []
    lines = [
        "### Choosing among one job's published settings",
        "",
        "| model | GPUs | GPU | seq | precision | setting | published tok/s/GPU | planned | planned order |",
        "|---|---:|---|---:|---|---|---:|---:|---:|",
    ]
    for (_, model, gpu, gpus, seq, precision, _, _), rows in jobs.items():
        order = {id(o): rank for rank, o in enumerate(sorted(rows, key=lambda o: -o.predicted), 1)}
        for o in sorted(rows, key=lambda o: -o.published):
            lines.append(
                f"| {model} | {gpus} | {gpu} | {seq} | {precision} | {_setting(o.row)} | {o.published:,.1f} | "
                f"{o.predicted:,.1f} | {order[id(o)]} |"
            )
    return lines + [""]


def accuracy_lines(outcomes: list[Outcome]) -> list[str]:
    """Every CSV together: tokens/s per GPU by layout kind, scale, card and strategy, what share of
    the runs with a stated layout the plan can plan, and how well it chooses among one job's
    published settings."""
    lines = breakdown_lines(outcomes, strategy_of)
    stated = [o for o in outcomes if o.row["sharding"].strip()]
    can = [o for o in stated if o.plan is not None]

    def share(groups: tuple[str, ...], of) -> str:
        return ", ".join(f"{g} {sum(of(o.row, g) for o in can)} of {sum(of(o.row, g) for o in stated)}" for g in groups)

    lines.append(
        f"Coverage: {len(can)} of {len(stated)} runs with a stated layout planned "
        f"({len(can) / max(len(stated), 1):.0%}); by scale: {share(SCALES, lambda r, g: scale_of(r) == g)}; "
        f"by layout kind: {share(KINDS, lambda r, g: g in kinds_of(r))}."
    )
    picks = picks_of(outcomes)
    if picks:
        worst = max(picks, key=lambda p: p.regret)
        key = worst.key
        example = (
            f" ({key[1]} on {key[3]} {key[2]}, seq {key[4]}: picked {_setting(worst.pick.row)}, fastest "
            f"{_setting(worst.best.row)})"
            if worst.regret > 0
            else ""
        )
        regrets = [p.regret for p in picks]
        lines += [
            "",
            f"Choosing among one job's published settings ({len(picks)} jobs: one publication and table, model "
            "(its shape), card, GPU count, sequence and precision, two or more layouts; each listed below): the plan's "
            "pick is the "
            f"fastest published in {sum(r <= 0 for r in regrets) / len(regrets):.0%}; regret (published tokens/s of "
            f"the fastest / of the pick - 1) median {statistics.median(regrets):.1%}, "
            f"worst {worst.regret:.1%}{example}.",
            "",
            *choice_by_kind_lines(picks),
        ]
    return lines + [""]


def _setting(row: dict[str, str]) -> str:
    return (
        f"{_layout_sharding(row)} micro-batch {row['micro_batch']} x {row['grad_accum'] or 1} "
        f"{_checkpointing(row['activation_checkpointing'])} AC"
    )


def _how_tp_runs(row: dict[str, str]) -> str:
    if "async_tp" in row["sharding"].split():
        return "async TP: the collectives Inductor fuses pipelined with their matmuls, the rest in the critical path"
    return "vanilla TP: every tensor-parallel collective in the critical path"


def two_d_lines(outcomes: list[Outcome]) -> list[str]:
    """Each published run of FSDP beside tensor parallelism (torchtitan's 2D figures)."""
    rows = [o for o in outcomes if o.error is not None and strategy_of(o.row) == "fsdp-tp"]
    if not rows:
        return []
    lines = ["### FSDP x tensor parallel (torchtitan's 2D figures)", ""]
    for o in rows:
        r = o.row
        lines.append(
            f"- {r['model']} on {r['gpus']} {r['gpu']}, {r['precision']}, {r['sharding']}, local batch "
            f"{r['micro_batch']}, seq {r['seq_len']}, {r['activation_checkpointing']} AC: published "
            f"{o.published:,.1f} tokens/s per GPU, "
            f"planned {o.predicted:,.1f} ({o.error:+.1%}; {_how_tp_runs(r)})"
        )
    return lines + [""]


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares y = c + a·x: (c, a, the largest |residual| over y)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    a = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    c = my - a * mx
    return c, a, max(abs(y - c - a * x) / y for x, y in points)


def per_token_lines(outcomes: list[Outcome]) -> list[str]:
    """Where llm-foundry's single-node residual lies. At a fixed model and card its tables vary
    the sequence at about constant tokens per micro-step, and the time per token is then a line
    in the sequence length: what does not grow with the sequence (matmuls, elementwise work, the
    loss, and each kernel's fixed cost per row of attention) plus attention's part, which grows
    with it. Fitting that line to the published and to the planned times tells the two apart;
    a per-step or per-kernel fixed cost would instead grow as micro-steps shrink."""
    groups: dict[tuple[str, str, str], list[Outcome]] = {}
    for o in outcomes:
        r = o.row
        if o.error is None or not r["source"].startswith("mosaicml") or r["gpus"] != "8" or _precision(r) != "bf16":
            continue
        groups.setdefault((r["model"], r["gpu"], _checkpointing(r["activation_checkpointing"])), []).append(o)
    rows = []
    for (model, gpu, ac), group in sorted(groups.items()):
        if len({o.row["seq_len"] for o in group}) < 4:
            continue
        published = line_fit([(int(o.row["seq_len"]), 1e6 / o.published) for o in group])
        planned = line_fit([(int(o.row["seq_len"]), 1e6 / o.predicted) for o in group])
        rows.append(
            f"| {model} | {gpu} | {ac} | {len(group)} | {published[0]:.2f} | {planned[0]:.2f} | "
            f"{planned[0] / published[0]:.2f} | {1e3 * published[1]:.3f} | {1e3 * planned[1]:.3f} | "
            f"{planned[1] / published[1]:.2f} | {published[2]:.1%} |"
        )
    if not rows:
        return []
    planned = [o for group in groups.values() for o in group]
    launches = max(
        kernel_launches(shape_of_row(o.row), _checkpointing(o.row["activation_checkpointing"]))
        * int(o.row["grad_accum"] or 1)
        * HOST_S_PER_LAUNCH
        / o.plan.time.step_s
        for o in planned
    )
    return [
        "### llm-foundry on 8 GPUs: time per token as a line in the sequence length",
        "",
        "Per GPU, published and planned µs per token = c + a x sequence length, fitted over each model's "
        "rows (`per_token_lines` says why). c: what does not grow with the sequence; a: attention's part, "
        "ns per token per position. A fixed cost per kernel cannot make up c's shortfall: every kernel of "
        f"these micro-steps at {HOST_S_PER_LAUNCH * 1e6:.0f} µs, one after another, would be at most "
        f"{launches:.1%} of a planned step.",
        "",
        "| model | GPU | AC | runs | published c | planned c | planned / published | published a | planned a "
        "| planned / published | largest residual of the published line |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]


def fit_lines(ran: list[Outcome], ran_out: list[Outcome]) -> list[str]:
    """Will it fit? Runs that ran planned not to fit (goal: at most 3%), runs that ran out of memory
    planned not to fit (goal: at least 90%), and the planned peak against the published one."""
    planned = [o for o in ran if o.plan is not None and o.plan.fits is not None]
    wrong = [o for o in planned if not o.plan.fits]
    caught = [o for o in ran_out if o.plan is not None and o.plan.fits is False]
    lines = [
        "### Will it fit?",
        "",
        f"- Runs that ran: {len(wrong)} of {len(planned)} planned not to fit "
        f"({len(wrong) / max(len(planned), 1):.1%}).",
        f"- Runs that ran out of memory: {len(caught)} of {len(ran_out)} planned not to fit "
        f"({len(caught) / max(len(ran_out), 1):.0%}).",
    ]
    lines += [
        f"  - ran, planned not to fit: {o.row['model']} on {o.row['gpus']} {o.row['gpu']}, micro-batch "
        f"{o.row['micro_batch']}, {o.row['activation_checkpointing']} AC: {o.plan.reserved_bytes / GIB:.1f} GiB "
        f"planned, {o.plan.headroom.usable / GIB:.1f} usable"
        for o in wrong
    ]
    memory = [o for o in ran if o.memory_error is not None]
    if memory:
        errors = [o.memory_error for o in memory]
        lines += [
            f"- Peak memory, {len(memory)} runs: median |error| {statistics.median(abs(e) for e in errors):.1%}, "
            f"median error {statistics.median(errors):+.1%}. Every published figure here is torch's max reserved "
            "(torchtitan's `memory:` log line, torch.cuda.max_memory_reserved, the most loaded GPU), so each is "
            "held against the plan's reserved: its peak allocated with the caching allocator's reserve.",
            "",
            "| model | GPUs | GPU | micro-batch | AC | precision | sharding | published reserved GiB | planned "
            "| error |",
            "|---|---:|---|---:|---|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| {o.row['model']} | {o.row['gpus']} | {o.row['gpu']} | {o.row['micro_batch']} | "
            f"{o.row['activation_checkpointing']} | {o.row['precision']} | {o.row['sharding']} | "
            f"{float(o.row['published_mem_gib']):.1f} | {o.plan.reserved_bytes / GIB:.1f} | {o.memory_error:+.1%} |"
            for o in memory
        ]
    return lines + [""]


def oom_lines(outcomes: list[Outcome]) -> list[str]:
    """Each configuration a source reports out of memory must be planned not to fit."""
    lines = ["### Published out-of-memory configurations", ""]
    for o in outcomes:
        r = o.row
        verdict = "planned not to fit: right" if o.plan and o.plan.fits is False else "planned to fit: WRONG"
        usage = (
            f" ({o.plan.reserved_bytes / GIB:.1f} GiB predicted, {o.plan.headroom.usable / GIB:.1f} usable)"
            if o.plan
            else ""
        )
        lines.append(
            f"- {r['model']} on {r['gpus']} {r['gpu']}, seq {r['seq_len']}, local batch {r['micro_batch']}, "
            f"{r['activation_checkpointing']} AC: {verdict}{usage}"
        )
    return lines + [""]


def ci_baseline_lines(outcomes: list[Outcome]) -> list[str]:
    """The CI baselines' section: how far the plan is from them, by card and by work per GPU per op."""
    planned = [o for o in outcomes if o.error is not None]
    if not planned:
        return []
    return [
        "### CI baselines, outside the goals",
        "",
        f"{CI_BASELINES.relative_to(ROOT)}: Megatron-LM's functional tests' iteration times (bench/data/README.md "
        "says why they are not held to the goals). Tokens/s per GPU: "
        f"{_summary([o.error for o in planned])}.",
        "",
        *_bias(planned, lambda r: r["gpu"], "GPU"),
        "",
        *_bias(planned, work_bucket, "work per GPU per layer op"),
        "",
    ]


def _degree(name: str):
    return lambda row: f"{name} {getattr(degrees(row['sharding']), name):>2}"


def _nodes(row: dict[str, str]) -> str:
    nodes = int(row["nodes"])
    return f"{nodes:>2} node{'s' if nodes > 1 else ''}"


def sweep_goal_row(outcomes: list[Outcome]) -> str:
    """The goals table's line for the sweep: its median error, held to the same target, reported apart."""
    errors = [o.error for o in outcomes if o.error is not None]
    median = statistics.median(abs(e) for e in errors)
    return (
        f"| median abs error of tokens/s per GPU on the Ultra-Scale Playbook's sweep (its own section) | <= 10% | "
        f"{median:.1%} of {len(errors)} | {'yes' if median <= 0.10 else 'NO'} |"
    )


# The network the sweep's cluster measured itself (harness/plan/network/fabric.py), for the what-if line.
SWEEP_MEASURED_NETWORK = "p5-playbook"


def sweep_on_its_measured_network(rows: list[dict[str, str]]) -> list[Outcome]:
    """The sweep planned again with its cluster's own all-reduce in place of the p5 nccl-tests figures."""
    return plan_rows([{**row, "network": SWEEP_MEASURED_NETWORK} for row in rows])


def _by_sweep_kind(outcomes: list[Outcome]) -> dict[str, list[Outcome]]:
    """The sweep's runs by what crosses their nodes, each once: its pipeline, else its tensor
    parallelism beyond a node, else data parallelism beside tensor parallelism inside one."""
    kinds: dict[str, list[Outcome]] = {}
    for o in outcomes:
        kinds.setdefault(leading_kind(kinds_of(o.row)), []).append(o)
    return kinds


def sweep_kind_figures(outcomes: list[Outcome]) -> dict[str, dict]:
    """The sweep's figures by kind: what a recommendation quotes beside the goals' buckets."""
    return figures_of(_by_sweep_kind(outcomes))


def _kinds_on_both(planned: list[Outcome], on_measured: list[Outcome]) -> list[str]:
    """Each layout kind's error on the p5 network the runs state and on the cluster's measured one."""

    def by_kind(outcomes: list[Outcome]) -> dict[str, list[float]]:
        return {kind: [o.error for o in rows] for kind, rows in _by_sweep_kind(outcomes).items()}

    stated, measured = by_kind(planned), by_kind(on_measured)
    lines = [
        f"| layout | runs | on p5: median predicted / published | median abs error | on {SWEEP_MEASURED_NETWORK}: "
        "median predicted / published | median abs error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in (DATA_PARALLEL, TP_INSIDE, TP_ACROSS, PIPELINE):
        a, b = stated.get(kind, []), measured.get(kind, [])
        if a and b:
            lines.append(
                f"| {kind} | {len(a)} | {1 + statistics.median(a):.3f} | {statistics.median(abs(e) for e in a):.1%} | "
                f"{1 + statistics.median(b):.3f} | {statistics.median(abs(e) for e in b):.1%} |"
            )
    return lines


def sweep_lines(outcomes: list[Outcome], measured: list[Outcome]) -> list[str]:
    """The sweep's section: its error by nodes, layout kind (on the network the runs state and on the
    one their cluster measured), tensor and pipeline degree and model, and its picks."""
    planned = [o for o in outcomes if o.error is not None]
    if not planned:
        return []
    on_measured = [o for o in measured if o.error is not None]
    picks = picks_of(planned)
    fastest = sum(p.pick is p.best for p in picks) / len(picks)
    worst = max(picks, key=lambda p: p.regret)
    return [
        "### The Ultra-Scale Playbook's sweep, apart from the goals' buckets",
        "",
        f"{SWEEP.relative_to(ROOT)}: nanotron on 1-64 nodes of 8 H100 (bench/data/README.md: one step of each "
        "run, on a shared cluster its authors describe as misbehaving during the sweep). Tokens/s per GPU: "
        f"{_summary([o.error for o in planned])}; {len(outcomes) - len(planned)} not planned.",
        "",
        f"Choosing the layout of each model and node count ({len(picks)} jobs): the plan's pick is the fastest "
        f"published in {fastest:.0%}; regret median {statistics.median(p.regret for p in picks):.1%}, worst "
        f"{worst.regret:.1%} ({worst.key[1]} on {worst.key[3]} GPUs).",
        "",
        *_bias(planned, _nodes, "nodes"),
        "",
        f"By layout, on the p5 network the runs state and on `inter_node={SWEEP_MEASURED_NETWORK}` (the cluster's "
        "own all-reduce at 256 MB, the Playbook's medians on 2-64 nodes):",
        "",
        *_kinds_on_both(planned, on_measured),
        "",
        *_bias(planned, _degree("tp"), "tensor parallel"),
        "",
        *_bias(planned, _degree("pp"), "pipeline stages"),
        "",
        *_bias(planned, lambda r: r["model"], "model"),
        "",
        *layer_time_lines(planned),
        "",
        *flat_time_lines(planned),
        "",
    ]


def goal_runs(sections: list[tuple[Path, list[Outcome]]]) -> list[Outcome]:
    """Every CSV's runs together, as the goals count them: a run two CSVs hold (model_parallel_nvidia.csv's
    MoE rows, moe_runs.csv's with their shape) once."""
    repeated = moe_runs_held([o.row for path, outcomes in sections if path.name == MOE_CSV for o in outcomes])
    return [o for _, outcomes in sections for o in outcomes if not repeated(o.row)]


# How a recommendation names the sweep beside the goals' figures (harness/plan/published_accuracy.py).
SWEEP_NAMED = "the Ultra-Scale Playbook's sweep on one EFA cluster, reported apart"


def write_accuracy(figures: dict[str, dict], sweep_kinds: dict, command: str, path: Path = ACCURACY_FILE) -> None:
    """published_accuracy.json: the figures by layout kind, scale and card family, the sweep's by kind,
    with the command that wrote them."""
    doc = {
        "written_by": command,
        "report": "bench/results/plan_vs_published.md",
        **figures,
        "sweep": {"what": SWEEP_NAMED, "kinds": sweep_kinds},
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="*", type=Path, help="published-runs CSVs (default: every one in bench/data)")
    p.add_argument("--rows", action="store_true", help="list every row's prediction")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_vs_published.md"), help="'-': print only")
    p.add_argument(
        "--accuracy",
        default=str(ACCURACY_FILE),
        help="where the figures a recommendation quotes go (written with --out, from every CSV); '-': not written",
    )
    args = p.parse_args(argv)
    try:
        paths = args.csv or runs_csvs()
        sections = [(path, plan_rows(read_rows(path))) for path in paths]
        ran_out = [] if args.csv else plan_rows(read_rows(OOM_CSV))
        every = goal_runs(sections)
        lines = goal_lines(every, picks_of(every))
        sweep_rows = [] if args.csv else read_rows(SWEEP)
        sweep = plan_rows(sweep_rows)
        if sweep:  # the goals table ends with a blank line: the sweep's goal goes above it
            lines.insert(len(lines) - 1, sweep_goal_row(sweep))
        lines += accuracy_lines(every)
        lines += fit_lines([o for _, outcomes in sections for o in outcomes], ran_out)
        for path, outcomes in sections:
            lines += report(path.name, outcomes, args.rows)
        lines += choice_lines([o for _, outcomes in sections for o in outcomes])
        lines += two_d_lines([o for _, outcomes in sections for o in outcomes])
        lines += per_token_lines([o for _, outcomes in sections for o in outcomes])
        if ran_out:
            lines += oom_lines(ran_out)
        if not args.csv:
            lines += sweep_lines(sweep, sweep_on_its_measured_network(sweep_rows))
            lines += ci_baseline_lines(plan_rows(read_rows(CI_BASELINES)))
    except PublishedError as exc:
        print(f"plan_vs_published: error: {exc}", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = shlex.join(["python", "bench/plan_vs_published.py", *argv])
    text = "\n".join([f"## {now}", "", f"Command: `{command}`", "", *lines])
    print(text)
    if args.out != "-":
        if not args.csv and args.accuracy != "-":  # what a recommendation quotes: every CSV's figures
            write_accuracy(accuracy_figures(every), sweep_kind_figures(sweep), command, Path(args.accuracy))
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            "# The plan against published training runs\n\n"
            "Written by `bench/plan_vs_published.py` from the CSVs in `bench/data/` (sources in its README). The plan "
            "uses its default factors (fitted to the reference runs shipped with parabench) for every row. No constant "
            "of the planner was fitted to these runs: each comes from a cited measurement of a kernel, a link or a "
            "card, or from parabench's own H100 and H200 measurements (docs/planner.md lists them). The model's "
            "form was revised while its errors on these runs were in view (which terms count: contention beside a "
            "collective, the power limit on dense matmuls only, each card's sustained share of it, the wait "
            "for the slowest GPU on the compute alone), so they are not a blind test: runs not in these "
            "files are. Which kernel and model each row ran is read from its source's configs at the cited "
            "commit (bench/data/README.md); one choice is argued from the published rows themselves: llm-foundry's "
            ">=128-GPU rows of 1b, 3b and 7b are planned with its Triton attention although its sweep asked for "
            "flash (`_attention` says why and what FlashAttention-2 would give). What each run did beyond its "
            "layout is read from its source too (`recipe_of_row`, `_fused_loss`): VectorLM's model and AdamW state "
            "in bf16, Megatron-LM's and NeMo's bf16 (fp16) parameters beside an fp32 master in the optimizer "
            "(with fp32 gradients where they reduce in fp32), torchtitan's fp8 all-gathers, its async tensor "
            "parallelism where a run names it and, from the commit that compiles it, its compiled loss; "
            "nanotron's fp32 cast of the logits, its cross-entropy and its fp32 gradient accumulator.\n\n" + text + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
