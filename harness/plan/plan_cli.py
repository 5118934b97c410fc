"""`runner.py plan`: predict memory, communication and speed of every strategy for a model
and a GPU count not yet run, and recommend one.

    python runner.py plan model=gpt2-1.5b gpus=8 micro_batch=4
    python runner.py plan model=hf:LlamaConfig model_kwargs.num_hidden_layers=32 gpus=16 format=json
    python runner.py plan layers=32 width=4096 heads=32 kv_heads=8 ffn=14336 vocab=128256 arch=llama \\
        seq_len=8192 micro_batch=2 activation_checkpointing=selective gpus=[8,64,512] inter_node=8x400gbps
    python runner.py plan model=[gpt2-350m,gpt2-1.5b] gpus=[1,8,64] plot=true

One model on one GPU count prints the full table and the recommendation; model=[...] or
gpus=[...] prints one table over every point (and plot=true one chart).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from configs.schema import load_config
from harness.common.hardware import GPUS
from harness.common.units import GB, GIB
from harness.plan.memory.batch_limit import fitting_micro_batch, micro_batch_limit
from harness.plan.memory.model_states import zero_paper_bytes_per_gpu
from harness.plan.memory.recipe_plan import fp8_gathers
from harness.plan.model.model_shape import PlanError
from harness.plan.model.moe_shape import total_params
from harness.plan.network.collective_ramp import measured_share, ring_kind
from harness.plan.network.fabric import Group
from harness.plan.parallel.backends import known_backends, model_of, planned_as
from harness.plan.parallel.batch_split import BatchSplitError
from harness.plan.parallel.engines import engine_differences
from harness.plan.parallel.layout import LayoutError, heads_tp, sizes_tp_itself
from harness.plan.parallel.pipeline_default import pipeline_line
from harness.plan.parallel.planned_options import routed_options, what_if_lines
from harness.plan.plan_options import (
    PlanConfig,
    check,
    gpu_counts,
    models_asked,
    plot_dir,
    question,
    shape_for,
    too_few_sequences,
)
from harness.plan.precision_what_if import precision_lines
from harness.plan.predict import (
    Question,
    StrategyPlan,
    plan_all,
    plan_default,
    storage_precision,
    tries_accumulation,
)
from harness.plan.recommendation import Recommendation, recommend
from harness.plan.speed.gemm import REFERENCE_CARD, sustained_share
from harness.plan.speed.host_issue import host_slowdown, issue_rates
from harness.plan.speed.step_time import SpeedFactors
from harness.plan.speed.stragglers import SPREAD, straggler_share
from harness.plan.what_if import skipped, skipped_lines
from strategies.accelerate.fsdp_tp_mode import accelerate_tp_reason
from strategies.parallel_dims import MAX_DEFAULT_TP

__all__ = ["PlanConfig", "main", "question", "strategy_names"]


def strategy_names(cfg: PlanConfig, gpus: int | None = None) -> list[str]:
    """The strategies to plan: the registry's names the planner models, or those asked for."""
    from strategies.registry import default_registry

    count = gpus if gpus is not None else gpu_counts(cfg)[0]
    known = known_backends()
    if cfg.strategies:
        unknown = [s for s in cfg.strategies if s not in known and model_of(s) is None]
        unmodelled = [s for s in unknown if s in default_registry().names()]
        if unmodelled:
            raise PlanError(
                f"strategy {', '.join(unmodelled)} is registered but the planner has no model of it yet: "
                f"plan one of {', '.join(known)}"
            )
        if unknown:
            raise PlanError(f"unknown strategy {', '.join(unknown)}: the planner knows {', '.join(known)}")
        names = list(cfg.strategies)
    else:
        names = [n for n in default_registry().names() if n in known]
    if count > 1:
        alone = [n for n in names if model_of(n).one_process]
        if cfg.strategies and alone:
            raise PlanError(f"strategy {alone[0]} runs on one GPU but gpus={count}: drop it or set gpus=1")
        names = [n for n in names if n not in alone]
    return names


def _config_files(names: list[str]) -> list[str]:
    """A line for each config file given as a strategy: the built-in it is planned as."""
    return [f"{name} is planned as {planned_as(name)}, the built-in it runs as." for name in names if planned_as(name)]


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


TABLE_HEADER = (
    "strategy",
    "params",
    "grads",
    "optim",
    "activ",
    "buffers",
    "peak",
    "fits",
    "max mb",
    "cpu",
    "wire/step",
    "exposed",
    "step",
    "tok/s/GPU",
    "MFU",
    "eff",
)


def _mfu_peak(q: Question) -> float:
    """The peak MFU is reported against: the run's precision, bf16's for an fp8 run (as torchtitan
    reports its float8 runs), so that fp8 and bf16 runs compare."""
    assert q.gpu is not None
    return q.gpu.peak_flops[storage_precision(q.precision)]


def _max_micro_batch(p: StrategyPlan, q: Question) -> int | None:
    """The table's max mb: the largest micro-batch per data-parallel rank that fits; where the global
    batch was split for the plan and no micro-batch that divides it fits beside the accumulation it
    then needs (plan_default tried each, batch_limit.accumulated), 0, not a micro-batch that fits
    only in a step of its own."""
    largest = fitting_micro_batch(p, q)
    return 0 if largest and tries_accumulation(p, q) else largest


def _row(p: StrategyPlan, q: Question) -> tuple[str, ...]:
    gpu = p.states_on("cuda")
    cpu = sum(p.states_on("cpu").values())
    buffers = sum(p.buffers.backward.values()) + sum(p.buffers.hooks.values())
    t = p.time
    per_gpu = t.tokens_per_s / q.gpus if t else None
    largest = _max_micro_batch(p, q)
    mfu = per_gpu * q.shape.flops_per_token(q.seq_len) / _mfu_peak(q) if t and q.gpu else None
    return (
        p.name,
        _gb(gpu["params"]),
        _gb(gpu["grads"]),
        _gb(gpu["optimizer"]),
        _gb(p.activations.total if p.activations else None),
        _gb(buffers),
        _gb(p.peak_bytes),
        _fit_word(p),
        "-" if largest is None else micro_batch_limit(largest),
        _gb(cpu) if cpu else "-",
        _gb(t.wire_bytes) if t else "-",
        f"{t.exposed_comm_s * 1e3:.0f} ms" if t else "-",
        f"{t.step_s * 1e3:.0f} ms" if t else "-",
        f"{per_gpu:,.0f}" if per_gpu is not None else "-",
        f"{mfu:.0%}" if mfu is not None else "-",
        f"{t.efficiency:.0%}" if t else "-",
    )


def _fit_word(p: StrategyPlan) -> str:
    """The fits column: "host" where the card holds the plan but its host does not hold what it offloads."""
    if p.fits is False and p.gpu_fits is not False and p.host_fits is False:
        return "host"
    return {True: "yes", False: "NO", None: "?"}[p.fits]


def host_lines(q: Question, given: bool = False) -> list[str]:
    """What the host's memory is checked against, where it is (offload keeps its state there);
    `given`: host_mem_gb= set it, in place of the card's reference host."""
    if q.host is None:
        return []
    if given:
        source = f" (host_mem_gb=, in place of the {q.gpu.name}'s reference host)" if q.gpu else " (host_mem_gb=)"
    elif q.gpu and q.hosts_per_node > 1:
        source = (
            f" ({q.gpu.name}'s reference host of {q.host_memory_gpus} GPUs, as much per GPU: x {q.hosts_per_node:g}; "
            "host_mem_gb= for another)"
        )
    else:
        source = f" ({q.gpu.name}'s reference host; host_mem_gb= for another)" if q.gpu else ""
    return [f"  host: {q.host.describe()}{source}; a layout whose host memory exceeds it does not fit"]


def aligned(rows: list[tuple[str, ...]], left: int = 1) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]


def _count(n: float) -> str:
    if n >= 1e12:
        return f"{n / 1e12:.3g}T"
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def heading(q: Question) -> list[str]:
    s = q.shape
    dims = s.dims
    total = total_params(s)
    shape = f"{_count(total)} params"
    if dims and dims.moe:
        shape += f", {_count(s.flops_params)} active"
    if dims:
        shape += f", {dims.layers} layers, width {dims.width}, {dims.heads} heads"
        if dims.kv_heads != dims.heads:
            shape += f" ({dims.kv_heads} kv)"
        shape += f", ffn {dims.ffn_width}" if dims.moe is None else f", {dims.moe.describe()}"
        shape += f", vocab {dims.vocab}"
    gpu = q.gpu.name if q.gpu else "an unknown card"
    lines = [
        f"parabench plan | {s.name} ({shape})",
        f"  {q.topology.describe()} | {gpu} | {q.precision} | {_batch(q)} | checkpointing {q.checkpointing}"
        + (" | fused loss" if q.fused_loss else "")
        + (" | fused norm" if q.fused_norm else "")
        + (" | complex rotary" if q.complex_rope else "")
        + (" | compiled" if q.compiled else "")
        + ("" if q.attention == "flash" else f" | attention {q.attention}")
        + "".join(f" | {choice}" for choice in q.recipe.describe()),
        *(f"  {line}" for line in basis_lines(q)),
    ]
    if s.note:
        lines.append(f"  note: {s.note}")
    lines.append(
        "  GiB per GPU; peak = predicted peak allocated; max mb = the largest micro-batch per data-parallel rank "
        "that fits (a pipeline's: the sequences of its step, whole rounds of its micro-batches; 0: none that splits "
        "the batch asked and fits beside its accumulation); tok/s/GPU and MFU "
        "(6N + 12LHQT) per GPU"
    )
    return lines


def _batch(q: Question) -> str:
    if q.global_batch is None:
        return f"micro-batch {q.micro_batch} x {q.seq_len} tokens x {q.grad_accum} accumulation"
    micro = (
        " (each rank's share at once, or the largest micro-batch of it that fits)"
        if q.split_global_batch
        else f" in micro-batches of {q.micro_batch}"
    )
    return f"batch {q.global_batch} x {q.seq_len} tokens over each layout's data-parallel ranks{micro}"


def batch_splits(q: Question, plans: list[StrategyPlan]) -> dict[str, dict[str, int]]:
    """How each layout splits the global batch: its data-parallel ranks, micro-batch and accumulation."""
    if q.global_batch is None:
        return {}
    out = {}
    for p in plans:
        out[p.name] = {"ranks": p.layout.data_parallel, "micro_batch": p.micro_batch, "grad_accum": p.grad_accum}
    return out


def narrowed_tp_lines(q: Question, plans: list[StrategyPlan]) -> list[str]:
    """The tensor-parallel strategies the model's heads held below a node's GPUs where no tp_size was
    given, with the tp they are planned at and why: their runs size it so (strategies/parallel_dims.py), and
    a "Use fsdp-tp" at tp 1 is plain FSDP's layout, which the table alone does not say."""
    dims, per_node = q.shape.dims, min(q.topology.per_node, q.gpus)
    if dims is None:
        return []
    cap = min(MAX_DEFAULT_TP, per_node)
    by_tp: dict[int, list[str]] = {}
    below_shards: list[str] = []
    for p in plans:
        if sizes_tp_itself(p.backend) and not p.backend.size_given("tp_size") and p.layout.tp < cap:
            if p.backend.via_accelerate and p.layout.tp < heads_tp(q.shape, q.topology):
                below_shards.append(f"{p.name} at tp {p.layout.tp}: {accelerate_tp_reason(p.layout.tp, q.gpus)}")
            else:
                by_tp.setdefault(p.layout.tp, []).append(p.name)
    heads = f"{dims.heads} heads" + (f" and {dims.kv_heads} key/value heads" if dims.kv_heads != dims.heads else "")
    return [
        f"{', '.join(names)} at tp {tp}: the largest tp up to {cap} that splits the model's {heads} and divides "
        f"a node's {per_node} GPUs, as {'their runs size' if len(names) > 1 else 'its run sizes'} it; "
        "strategy_options.tp_size= sets another."
        for tp, names in by_tp.items()
    ] + below_shards


def _split_lines(q: Question, plans: list[StrategyPlan]) -> list[str]:
    groups: dict[tuple[int, int, int], list[str]] = {}
    for name, s in batch_splits(q, plans).items():
        groups.setdefault((s["ranks"], s["micro_batch"], s["grad_accum"]), []).append(name)
    return [
        f"Batch {q.global_batch} over {ranks} data-parallel rank{'s' if ranks > 1 else ''}: micro-batch {micro} x "
        f"{accumulation} accumulation ({', '.join(names)})."
        for (ranks, micro, accumulation), names in groups.items()
    ]


def option_lines(cfg: PlanConfig, names: list[str]) -> list[str]:
    """The strategy options checked over the planned strategies `names` (planned_options.py: as train
    and compare take them), as lines: which strategies each compare-wide option reaches, and the
    planner's what-ifs. An option none takes, or one the plan cannot price, is a one-line error."""
    routed = routed_options(names, cfg.strategy_options)
    reaches = [] if len(names) == 1 else [f"{line}." for line in routed.reaches()]
    return reaches + what_if_lines(routed)


# Refusals of an option for the layout it meets, which another question may not meet.
LAYOUT_REFUSALS = ("does not divide", "does not price")


def nothing_planned(cfg: PlanConfig, q: Question, names: list[str], not_planned: dict[str, str]) -> str:
    """Why no strategy could lay the question out: a batch too few for every layout's data-parallel ranks
    says the fewest a layout takes, in the option given; else each reason once, with the strategies it
    stopped."""
    fewest = _fewest_sequences(names, q)
    if fewest is not None and q.global_batch is not None and q.global_batch < fewest:
        return too_few_sequences(cfg, q.global_batch, q.seq_len, fewest)
    stopped: dict[str, list[str]] = {}
    for name, why in not_planned.items():
        stopped.setdefault(why, []).append(name)
    return "no strategy can lay it out: " + "; ".join(f"{', '.join(n)}: {why}" for why, n in stopped.items())


def _fewest_sequences(names: list[str], q: Question) -> int | None:
    """The fewest sequences a strategy stopped by the batch alone would split (its data-parallel ranks);
    None where the batch stopped none. Each is planned again: only where nothing could be planned."""
    ranks = []
    for name in names:
        try:
            plan_default(name, q)
        except BatchSplitError as exc:
            ranks.append(exc.ranks)
        except LayoutError:
            continue
    return min(ranks, default=None)


def planned(cfg: PlanConfig, q: Question) -> tuple[list[StrategyPlan], dict[str, str]]:
    """The plans of the strategies asked (or all), and why any could not be laid out; where none
    can be, a one-line error with the reasons."""
    names = strategy_names(cfg, q.gpus)
    routed = routed_options(names, cfg.strategy_options)
    plans, not_planned = plan_all(names, q, asked=bool(cfg.strategies))
    if not plans:
        raise PlanError(f"{q.shape.name} on {q.gpus} GPUs: {nothing_planned(cfg, q, names, not_planned)}")
    # An option that no strategy given it could be planned with, refused for its value (not for a
    # layout it does not divide, nor one the planner does not price), is bad input: one line.
    takers = {name: given for name, given in routed.by_strategy.items() if given}
    if takers and not takers.keys() & {p.name for p in plans}:
        refusals = [
            why
            for name, given in takers.items()
            if (why := not_planned.get(name, ""))
            and any(f"{key}=" in why for key in given)
            and not any(layout in why for layout in LAYOUT_REFUSALS)
        ]
        if refusals:
            raise PlanError(max(refusals, key=refusals.count))
    return plans, not_planned


def _scale_basis(f: SpeedFactors, card: str, where: str) -> str:
    """The compute scale a plan takes, or why it takes none: the one measured is another card's."""
    if f.card is not None and f.card != card:
        return f"unscaled (the compute scale measured is the {f.card}'s, not this card's)"
    return f"x {f.compute_scale:.2f} ({where})"


def basis_lines(q: Question) -> list[str]:
    """Which of the plan's figures rest on a measurement of this machine, and which are assumed."""
    f = q.factors
    where = "measured" if f.measured else "assumed"
    gpu = q.gpu
    if gpu is None:
        return ["no speed: the card is unknown"]
    if f.fixed_mfu is not None:
        compute = f"compute at {f.fixed_mfu:.0%} MFU of {_mfu_peak(q) / 1e12:.0f} TFLOP/s (mfu=, as given)"
    else:
        efficiency = {"fp8": gpu.fp8_efficiency, "fp4": gpu.fp4_efficiency}.get(q.precision)
        sixteen_bit = storage_precision(q.precision)
        own = sustained_share(gpu, q.precision)  # fp4's measured rate takes its own share (gemm.sustained_share)
        fp8 = (
            f" (the blocks' projections in {q.precision}: up to {efficiency:.0%} of "
            f"{gpu.peak_flops[q.precision] / 1e12:.0f}"
            + (f", {own:.0%} of that sustained" if own != sustained_share(gpu, sixteen_bit) else "")
            + ")"
            if efficiency
            else ""
        )
        settled = (
            "" if gpu.long_run_matmul else f" (the {GPUS[REFERENCE_CARD].name}'s: no long run measured on this card)"
        )
        slowest = (
            f"; the slowest of {q.gpus} GPUs +{straggler_share(q.gpus):.1%} (stragglers: each GPU's speed "
            f"{SPREAD:.1%} about the median's)"
            if q.gpus > 1
            else ""
        )
        compute = (
            f"compute by shape: matmuls up to {gpu.matmul_efficiency:.0%} of {_mfu_peak(q) / 1e12:.0f} TFLOP/s"
            f"{fp8}, {sustained_share(gpu, sixteen_bit):.0%} of that sustained under load{settled}, attention "
            f"({q.attention}) by its published rate, memory-bound work at {gpu.hbm_bytes_per_s / 1e12:.2g} TB/s"
            f"{slowest}; {_scale_basis(f, gpu.name, where)}"
        )
    t = q.topology
    inside = "the NVLink domain" if t.per_domain > t.per_node else "a node"
    library = "RCCL" if t.library == "rccl" else "NCCL"
    network = (
        f"network: rings inside {inside} at {t.busbw(Group(t.per_domain, 1), 'all-gather') / 1e9:.0f} GB/s bus "
        f"bandwidth ({library})"
    )
    ring_half = measured_share(ring_kind(t.tuning_generation), 64.0) if t.intra.name == "nvlink" else None
    if ring_half is not None and t.library != "rccl":
        network += (
            f", mid-sized ones at the share of it a published {t.tuning_generation} node's sweeps reached "
            f"({ring_half:.0%} where the bytes take 64 us at it)"
        )
    if t.domains > 1:
        network += (
            f"; across {'domains' if t.per_domain > t.per_node else 'nodes'} "
            f"{t.busbw(t.world(), 'all-gather') / 1e9:.0f} GB/s ({t.fabric.describe()} at "
            f"{t.fabric.efficiency:.0%}, {library}'s rings over the rails)"
        )
        half = measured_share(t.fabric.kind, 256.0) if t.library != "rccl" else None
        if half is not None:
            network += (
                f", mid-sized collectives at the share of it published {t.fabric.kind} sweeps reached "
                f"({half:.0%} where the bytes take 256 us at it)"
            )
    slower = 1.0 if f.measured else host_slowdown(gpu)
    host = f"; the backends' own host work x {slower:.2f} at this card's host's pace" if slower != 1.0 else ""
    rates, rates_basis = issue_rates(gpu)
    yours = "" if gpu.host_us_per_kernel is not None else "; host_us_per_kernel= gives your host's"
    issue = (
        f"host issue: {rates['eager'] * 1e6:.1f} us of CPU an eager kernel, {rates['compiled'] * 1e6:.1f} a "
        f"compiled one ({rates_basis}){yours}"
    )
    lines = [
        f"speed: {compute}",
        f"backend overheads and offload host steps {where} from {f.basis}{host}",
        issue,
        network,
    ]
    if gpu.sources:
        lines.append(f"card: {gpu.sources}")
    if gpu.attention_assumed:
        lines.append(f"attention: {gpu.attention_assumed}")
    if f.memory:
        lines.append(
            "memory: the model's, plus what the calibration measured beyond it, each kind carried by what it grows "
            "with (fixed bytes, a share of the activations, bytes per parameter held), never below the model states"
        )
    lines += [f"calibration not used: {u}" for u in f.unused]
    if not f.measured:
        lines.append("calibrate=<out_dir of a compare on this machine> replaces the assumed figures with measured ones")
    return lines


PAPER_STAGES = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}


def zero_paper_view(q: Question) -> dict[str, float]:
    """Model states per GPU in the ZeRO paper's accounting (mixed-precision Adam, K=12)."""
    return {
        name: zero_paper_bytes_per_gpu(total_params(q.shape), stage, q.gpus) for name, stage in PAPER_STAGES.items()
    }


def unmodelled(plans: list[StrategyPlan], q: Question) -> list[str]:
    """What the memory model is known to leave out, where no calibration has measured it, and
    the recipe's choices a strategy does not take."""
    lines = [
        f"{p.name}: DeepSpeed's GPU staging of offloaded parameters is not modelled (an H100 measured 4% above "
        "this kind of peak at gpt2-124m, micro-batch 4); calibrate= adds what your compare measures."
        for p in plans
        if p.backend.engine == "deepspeed" and p.backend.offload_params and p.name not in q.factors.memory
    ]
    deepspeed = [p.name for p in plans if p.backend.engine == "deepspeed"]
    if q.recipe.pure_bf16 and deepspeed:
        verb = "keeps" if len(deepspeed) == 1 else "keep"
        lines.append(
            f"pure_bf16: {', '.join(deepspeed)} {verb} DeepSpeed's fp32 master copy and moments (its bf16 mode "
            "has no other), as planned."
        )
    gathering = [p.name for p in plans if fp8_gathers(p.backend, q.recipe)]
    if q.recipe.fp8_all_gather and len(gathering) < len(plans):
        lines.append(
            "fp8_all_gather: only FSDP2's sharding gathers fp8 weights under torchao; "
            + (f"planned for {', '.join(gathering)}." if gathering else "no strategy planned here does.")
        )
    return lines


def as_json(cfg: PlanConfig, q: Question, plans: list[StrategyPlan], rec: Recommendation) -> dict[str, Any]:
    s = q.shape
    return {
        "question": asdict(cfg)
        | {
            "gpus": q.gpus,
            "nodes": q.nodes,
            "seq_len": q.seq_len,  # unset, the model's (with_seq_len)
            "global_batch_sequences": q.global_batch,  # unset, one sequence a GPU (planned_global_batch)
            "grad_accum": q.grad_accum,
            "capacity_bytes": q.capacity_bytes,
            "peak_flops": _mfu_peak(q) if q.gpu else None,  # what MFU is against (bf16's for fp8)
            "topology": q.topology.describe(),
            "batch_per_layout": batch_splits(q, plans),
        },
        "model": {
            "name": s.name,
            "params": total_params(s),
            "flops_params": s.flops_params,
            "flops_per_token": s.flops_per_token(q.seq_len),
            "dims": asdict(s.dims) if s.dims else None,
            "note": s.note,
        },
        "basis": basis_lines(q),
        "headroom": plans[0].headroom.describe() if plans else None,
        "host": q.host.describe() if q.host else None,
        "strategies": [p.as_dict() | {"largest_micro_batch": _max_micro_batch(p, q)} for p in plans],
        "zero_paper_model_states_bytes": zero_paper_view(q),
        "recommendation": rec.as_dict(),
        "same_engine": engine_differences(plans, q),
        "what_ifs_skipped": skipped(plans, q),
    }


def _single(cfg: PlanConfig) -> int:
    q = question(cfg)
    plans, not_planned = planned(cfg, q)
    rec = recommend(plans, q)
    plots: list[Path] = []
    if cfg.plot:
        from harness.plan.plots import write_plots  # matplotlib only when asked

        plots = write_plots(q, [p.name for p in plans], plot_dir(cfg))
    if cfg.format == "json":
        doc = as_json(cfg, q, plans, rec) | {
            "not_planned": not_planned,
            "plots": [str(p) for p in plots],
            "strategy_options_reach": routed_options(strategy_names(cfg, q.gpus), cfg.strategy_options).takers,
        }
        print(json.dumps(doc, indent=2))
        return 0
    paper = ", ".join(f"{name} {b / GB:.1f} GB" for name, b in zero_paper_view(q).items())
    lines = (
        heading(q)
        + [f"  fits: {plans[0].headroom.describe()}" if plans else ""]
        + host_lines(q, given=cfg.host_mem_gb is not None)
        + [""]
        + aligned([TABLE_HEADER] + [_row(p, q) for p in plans])
        + [
            f"ZeRO paper's accounting (mixed-precision Adam, K=12), model states per GPU: {paper}.",
            "The columns are what each backend as installed holds: DeepSpeed's ZeRO-1 reduces gradients into "
            "its partition during the last micro-step's backward, so it keeps ZeRO-2's gradients at rest.",
            *engine_differences(plans, q),
            *unmodelled(plans, q),
            *_split_lines(q, plans),
            *narrowed_tp_lines(q, plans),
            *filter(None, (pipeline_line(p, q) for p in plans)),
            *(f"Not planned: {name}: {why}" for name, why in not_planned.items()),
            *_config_files([p.name for p in plans]),
            *option_lines(cfg, strategy_names(cfg, q.gpus)),
            *precision_lines(q.precision, plans),
            "",
        ]
        + rec.lines
        + skipped_lines(plans, q)
    )
    print("\n".join(lines + [f"wrote {p}" for p in plots]))
    return 0


def _sweep(cfg: PlanConfig) -> int:
    """One table over every model and GPU count asked, a recommendation per point, one plot."""
    points: list[tuple[Question, list[StrategyPlan], Recommendation]] = []
    for model in models_asked(cfg):
        shape = shape_for(cfg, model)
        for gpus in gpu_counts(cfg):
            q = question(replace(cfg, gpus=gpus), model, gpus, shape)
            plans, _ = planned(cfg, q)
            points.append((q, plans, recommend(plans, q)))
    plots: list[Path] = []
    if cfg.plot:
        from harness.plan.plots import sweep_chart

        plots = [sweep_chart(points, plot_dir(cfg) / "plan_sweep.png")]
    if cfg.format == "json":
        doc = {
            "points": [
                as_json(replace(cfg, gpus=q.gpus, model=q.shape.name), q, plans, rec) for q, plans, rec in points
            ],
            "plots": [str(p) for p in plots],
        }
        print(json.dumps(doc, indent=2))
        return 0
    first = points[0][0]
    rows = [("model", "GPUs", "nodes") + TABLE_HEADER]
    for q, plans, _ in points:
        rows += [(q.shape.name, str(q.gpus), str(q.nodes)) + _row(p, q) for p in plans]
    models = ", ".join(dict.fromkeys(q.shape.name for q, _, _ in points))
    counts = ", ".join(str(g) for g in dict.fromkeys(q.gpus for q, _, _ in points))
    lines = [f"parabench plan | {models} on {counts} GPUs", *heading(first)[1:], ""] + aligned(rows, left=4) + [""]
    for q, _, rec in points:
        lines.append(f"{q.shape.name} on {q.gpus} GPUs: {rec.lines[0]}")
    lines += _config_files(list(cfg.strategies or []))
    lines += option_lines(cfg, strategy_names(cfg, first.gpus))
    lines += precision_lines(first.precision, [p for _, plans, _ in points for p in plans])
    print("\n".join(lines + [f"wrote {p}" for p in plots]))
    return 0


def main(args: list[str]) -> int:
    cfg: PlanConfig = load_config(args, schema=PlanConfig)
    check(cfg)
    if cfg.search:
        from harness.plan.search.search_cli import run_search  # imports this module

        return run_search(cfg)
    if len(models_asked(cfg)) > 1 or len(gpu_counts(cfg)) > 1:
        return _sweep(cfg)
    return _single(cfg)
