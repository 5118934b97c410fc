"""A published mixture-of-experts run (bench/data/moe_runs.csv) in the planner's terms, for
bench/plan_vs_published.py: its shape from the shape columns and the fixed head of its notes
(`moe experts=E top_k=K shared=S expert_ffn=F dense_layers=D capacity=... router=...;`, read by
moe_shape.py's architecture for the row's `arch`, the Hugging Face model type; a DeepSeek-V3-family
row, `attention=mla ...`, by deepseek_shape.py with its groups), its expert layout
from its sharding (`ep=`, `etp=`, checked against the `edp=` it states: edp = GPUs / (ep x etp x pp),
Megatron-core's parallel folding), and the plan tokens of its sharding that say how it ran:
`recompute=<modules joined by +>` (Megatron-core's `--recompute-modules` under selective
recomputation; `none` where the list is empty) and `a2a_overlap` (the dispatch and combine
overlapped with the other micro-batch's compute: Megatron-core's
`--overlap-moe-expert-parallel-comm`, Megatron-Bridge's `moe_a2a_overlap`) and `megatron_moe_layer`
(Megatron-core's MoE layer on another engine: AutoModel's; expert_compute.py); the head's `dispatcher=`
says whether its all-to-all forwards a token once per node (deepep, hybridep, flex) or sends every
copy (alltoall; expert_comm.py); with a `capacity=`, an alltoall row's experts are padded to it (each such
row's notes quote --moe-pad-expert-input-to-capacity or the table's padding), a forwarding dispatcher's
drop what is over it unpadded (Megatron-core's MoEFlexTokenDispatcher refuses
--moe-pad-expert-input-to-capacity: megatron/core/transformer/moe/token_dispatcher.py @ 6a6cd478). Every run is planned
balanced (`moe_imbalance` 1.0): Megatron-Bridge's and AutoModel's benchmarks force balanced routing
(bench/data/README.md); the others do not say. `moe_runs_held` says which shapeless MoE rows of the
other CSVs are runs this one holds, so each run is counted once.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Callable

from harness.plan.model.deepseek_shape import deepseek_shape, is_deepseek
from harness.plan.model.model_shape import ModelShape, PlanError
from harness.plan.model.moe_shape import hf_moe_shape, moe_architecture, refuse_unmodelled
from harness.plan.network.expert_comm import A2A_OVERLAP, DISPATCHER, NODE_FORWARDING
from harness.plan.speed.expert_compute import MEGATRON_MOE_LAYER
from harness.plan.speed.host_issue import FULL_ITERATION_GRAPH, LAYER_GRAPHS
from strategies.plan_model import PlanModel

MOE_HEAD = re.compile(r"^moe ([^;]*);")
# The head's dispatchers that send a token once per node and fan it out over NVLink: DeepEP's,
# HybridEP's, and Megatron-core's flex dispatcher, which runs one of them.
FORWARDING_DISPATCHERS = ("deepep", "hybridep", "flex")
RECOMPUTE_TOKEN = "recompute="
# Megatron-core's CUDA graphs as a row's `cuda_graph=` names them, and the plan option each is
# (host_issue.py): `full_iteration` (cuda_graph_impl='full_iteration') the whole step captured and
# replayed, `layers` (enable_cuda_graph with cuda_graph_scope 'full') each layer's passes.
CUDA_GRAPH_TOKEN = "cuda_graph="
CUDA_GRAPHS_MODELLED = {"full_iteration": FULL_ITERATION_GRAPH, "layers": LAYER_GRAPHS}


class MoERowError(ValueError):
    """A mixture-of-experts row whose head or layout is not what bench/data/README.md says (one line)."""


def moe_head(row: dict[str, str]) -> dict[str, str] | None:
    """The `key=value` words of the notes' MoE head, or None for a dense row."""
    found = MOE_HEAD.match(row["notes"])
    if found is None:
        return None
    return dict(word.split("=", 1) for word in found.group(1).split() if "=" in word)


def _int(head: dict[str, str], key: str, row: dict[str, str]) -> int:
    try:
        return int(head[key])
    except (KeyError, ValueError):
        raise MoERowError(
            f"{row['model']}: the notes' moe head has no whole {key}=: give it (bench/data/README.md)"
        ) from None


def moe_shape_of_row(row: dict[str, str]) -> ModelShape:
    """The row's mixture of experts, read as its Hugging Face architecture reads its config; MLA or
    chunked attention refused in the planner's words."""
    head = moe_head(row)
    assert head is not None
    if head.get("attention") == "mla" or is_deepseek(row["arch"]):
        shape = deepseek_shape(row["model"], _deepseek_fields(row, head))
    else:
        shape = _hf_moe_shape(row, head)
    capacity = head.get("capacity", "dropless")
    if capacity != "dropless":
        assert shape.dims is not None and shape.dims.moe is not None
        padded = head.get("dispatcher") not in FORWARDING_DISPATCHERS
        dims = replace(shape.dims, moe=replace(shape.dims.moe, capacity=float(capacity), padded=padded))
        shape = replace(shape, dims=dims)
    return shape


def _hf_moe_shape(row: dict[str, str], head: dict[str, str]) -> ModelShape:
    refuse_unmodelled(row["model"], row["arch"])
    arch = moe_architecture(row["arch"])
    if arch is None:
        raise PlanError(f"model {row['model']}: arch {row['arch']} is not a mixture of experts the planner reads")
    if _int(head, "shared", row) or _int(head, "dense_layers", row):
        raise PlanError(f"model {row['model']}: shared experts and dense blocks beside {arch.config_class}: not read")
    experts = "num_local_experts" if "num_local_experts" in arch.defaults else "num_experts"
    width = "moe_intermediate_size" if "moe_intermediate_size" in arch.defaults else "intermediate_size"
    fields: dict[str, Any] = {
        "num_hidden_layers": int(row["n_layers"]),
        "hidden_size": int(row["d_model"]),
        "num_attention_heads": int(row["n_heads"]),
        "num_key_value_heads": int(row["kv_heads"] or row["n_heads"]),
        "vocab_size": int(row["vocab"]),
        experts: _int(head, "experts", row),
        "num_experts_per_tok": _int(head, "top_k", row),
        width: _int(head, "expert_ffn", row),
    }
    if "head_dim" in head:
        fields["head_dim"] = int(head["head_dim"])
    return hf_moe_shape(row["model"], arch, fields)


def _deepseek_fields(row: dict[str, str], head: dict[str, str]) -> dict[str, Any]:
    """DeepseekV3Config's fields from the row's shape columns and its head (`attention=mla q_lora=..
    kv_lora=.. qk_nope=.. qk_rope=.. v_head=..`, `groups=.. topk_groups=..`, `mtp_layers=..`)."""
    if head.get("attention") != "mla":
        raise MoERowError(f"{row['model']}: a {row['arch']} row's head gives attention=mla and its sizes")
    names = {
        "q_lora": "q_lora_rank",
        "kv_lora": "kv_lora_rank",
        "qk_nope": "qk_nope_head_dim",
        "qk_rope": "qk_rope_head_dim",
        "v_head": "v_head_dim",
        "experts": "n_routed_experts",
        "top_k": "num_experts_per_tok",
        "expert_ffn": "moe_intermediate_size",
        "shared_ffn": "moe_intermediate_size",
        "dense_ffn": "intermediate_size",
        "dense_layers": "first_k_dense_replace",
        "groups": "n_group",
        "topk_groups": "topk_group",
    }
    fields: dict[str, Any] = {field: _int(head, key, row) for key, field in names.items() if key != "shared_ffn"}
    shared = _int(head, "shared", row)
    if shared and _int(head, "shared_ffn", row) != shared * fields["moe_intermediate_size"]:
        raise MoERowError(f"{row['model']}: shared_ffn is not shared x expert_ffn, as DeepseekV3Config builds it")
    fields.update(
        n_shared_experts=shared,
        num_hidden_layers=int(row["n_layers"]),
        hidden_size=int(row["d_model"]),
        num_attention_heads=int(row["n_heads"]),
        num_key_value_heads=int(row["kv_heads"] or row["n_heads"]),
        vocab_size=int(row["vocab"]),
        scoring_func=head.get("router", "sigmoid"),
        num_nextn_predict_layers=int(head.get("mtp_layers", 0)),
    )
    return fields


def qk_norm(row: dict[str, str]) -> bool:
    head = moe_head(row) or {}
    return head.get("qk_norm") == "true"


def recompute_modules(row: dict[str, str]) -> tuple[str, ...] | None:
    """The modules the row's `recompute=` token names (() for `none`); None where it has no such token."""
    named = [w[len(RECOMPUTE_TOKEN) :] for w in row["sharding"].split() if w.startswith(RECOMPUTE_TOKEN)]
    if not named:
        return None
    return () if named[-1] == "none" else tuple(named[-1].split("+"))


def graph_options(row: dict[str, str]) -> dict[str, Any]:
    """The plan option of the CUDA graphs the row's `cuda_graph=` names: the whole step's, or each layer's."""
    options: dict[str, Any] = {}
    for graph in (w[len(CUDA_GRAPH_TOKEN) :] for w in row["sharding"].split() if w.startswith(CUDA_GRAPH_TOKEN)):
        if graph not in CUDA_GRAPHS_MODELLED:
            raise MoERowError(
                f"{row['model']}: cuda_graph={graph} is not one the planner models: only "
                f"{', '.join(CUDA_GRAPHS_MODELLED)} (bench/data/README.md)"
            )
        options[CUDA_GRAPHS_MODELLED[graph]] = True
    return options


def with_experts(row: dict[str, str], model: PlanModel, options: dict[str, Any]) -> tuple[PlanModel, dict[str, Any]]:
    """The layout with the row's expert parallel (`ep=`, `etp=`), its stated `edp=` checked, its all-to-all
    overlap (`a2a_overlap`), Megatron-core's MoE layer where another engine runs it (`megatron_moe_layer`) and a
    step or its layers replayed from CUDA graphs (`cuda_graph=`)."""
    sizes = {key: int(value) for key, value in re.findall(r"\b(ep|etp|edp|pp)=(\d+)", row["sharding"])}
    ep, etp = sizes.get("ep", 1), sizes.get("etp", 1)
    edp = int(row["gpus"]) // (ep * etp * sizes.get("pp", 1))
    if "edp" in sizes and sizes["edp"] != edp:
        raise MoERowError(
            f"{row['model']}: edp={sizes['edp']} is not GPUs / (ep x etp x pp) = {edp}: give the row's own degrees"
        )
    extra: dict[str, Any] = {"ep_size": ep, "etp_size": etp}
    for flag in (A2A_OVERLAP, MEGATRON_MOE_LAYER):
        if flag in row["sharding"].split():
            extra[flag] = True
    extra.update(graph_options(row))
    if (moe_head(row) or {}).get("dispatcher") in FORWARDING_DISPATCHERS:
        extra[DISPATCHER] = NODE_FORWARDING
    return replace(model, expert_parallel=True), {**options, **extra}


# What names one published run: its repository (the source before its path: Megatron-Bridge's current and archive
# pages carry one container's table each in turn), the card and GPUs, the sequence, the batch sizes and the figure.
# model_parallel_nvidia.csv records Megatron-Bridge's MoE runs without their shape, moe_runs.csv again with it.
SAME_RUN_COLUMNS = ("gpu", "gpus", "seq_len", "micro_batch", "global_batch", "published_tok_s_gpu")


def _repository(row: dict[str, str]) -> str:
    return row["source"].split(":")[0].split("@")[0].strip()


def _run_key(row: dict[str, str]) -> tuple[str, ...]:
    return (_repository(row), *(row[c].strip() for c in SAME_RUN_COLUMNS))


def moe_runs_held(moe_rows: list[dict[str, str]]) -> Callable[[dict[str, str]], bool]:
    """Whether a row, a mixture of experts without its notes' moe head, is a run one of `moe_rows` (moe_runs.csv's,
    with their heads) holds: counted once, there, where runs are counted. `moe_rows`' runs are gathered once, for
    every row a report asks about."""
    held = {_run_key(other) for other in moe_rows if moe_head(other) is not None}
    return lambda row: moe_head(row) is None and _run_key(row) in held
