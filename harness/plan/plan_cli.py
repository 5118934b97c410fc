"""`runner.py plan`: predict memory, communication and speed of every strategy for a model
and a GPU count not yet run, and recommend one.

    python runner.py plan model=gpt2-1.5b gpus=8 gpu_mem_gb=80 micro_batch=4
    python runner.py plan params=7.5e9 gpus=64 nodes=8 interconnect=nvlink inter_node=infiniband
    python runner.py plan model=hf:LlamaConfig model_kwargs.num_hidden_layers=32 gpus=16 format=json
    python runner.py plan layers=48 width=6144 gpus=256 nodes=32 activation_checkpointing=true plot=true
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from configs.schema import PRECISIONS, load_config
from harness.common.hardware import GPUS, gpu_spec
from harness.common.units import GB
from harness.plan.backends import known_backends
from harness.plan.calibration import calibrate_from, default_factors
from harness.plan.comm import INTER_NODE, INTERCONNECTS, Topology, parse_link
from harness.plan.compute import HBM_EFFICIENCY, MATMUL_EFFICIENCY
from harness.plan.engines import engine_differences
from harness.plan.model_shape import ModelShape, PlanError, shape_of_description, shape_of_spec
from harness.plan.model_states import zero_paper_bytes_per_gpu
from harness.plan.predict import Question, StrategyPlan, plan_all
from harness.plan.recommendation import Recommendation, recommend
from harness.plan.speed import SpeedFactors

FORMATS = ("table", "json")


@dataclass
class PlanConfig:
    # The model: a zoo name, pkg.mod:fn, hf:ConfigClass (sizes in model_kwargs), or a description.
    model: Optional[str] = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    model_blocks: Optional[list[str]] = None  # class names of the blocks, as for train; None: found
    params: Optional[float] = None
    layers: Optional[int] = None
    width: Optional[int] = None
    heads: Optional[int] = None
    vocab: Optional[int] = None
    # The machines.
    gpus: int = 8
    nodes: int = 1
    gpu: str = "H100"
    gpu_mem_gb: Optional[float] = None  # default: the card's
    peak_tflops: Optional[float] = None  # default: the card's dense peak at this precision
    hbm_tb_s: Optional[float] = None  # default: the card's memory bandwidth, TB/s
    # Speed: the compute model with factors measured by `calibrate=<compare or train out_dir>` on
    # this machine, or, without it, those of the reference H100 run shipped with parabench.
    calibrate: Optional[str] = None
    mfu: Optional[float] = None  # set: compute at this fixed MFU instead of the compute model
    compile: bool = False  # plan for compile=true runs (most elementwise work fused)
    interconnect: str = "nvlink"  # inside a node: nvlink | pcie | infiniband | GB/s
    inter_node: str = "infiniband"  # between nodes: infiniband | ethernet | GB/s
    # The run.
    micro_batch: int = 1  # sequences per GPU per micro-step
    batch_size: Optional[int] = None  # global, in sequences; default micro_batch x gpus (no accumulation)
    seq_len: int = 1024
    precision: str = "bf16"
    activation_checkpointing: bool = False
    strategies: list[str] = field(default_factory=list)  # default: every strategy the planner knows
    strategy_options: dict[str, Any] = field(default_factory=dict)
    # Output.
    format: str = "table"
    plot: bool = False
    out_dir: str = "runs/plan"


def _positive(cfg: PlanConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise PlanError(f"{name}={value} must be a positive number")


def _grad_accum(cfg: PlanConfig) -> int:
    if cfg.batch_size is None:
        return 1
    per_gpu, rem = divmod(cfg.batch_size, cfg.gpus)
    if rem:
        raise PlanError(
            f"batch_size={cfg.batch_size} does not divide over gpus={cfg.gpus}: "
            f"choose a batch_size that is a multiple of {cfg.gpus}"
        )
    accum, rem = divmod(per_gpu, cfg.micro_batch)
    if rem or accum == 0:
        raise PlanError(
            f"micro_batch={cfg.micro_batch} does not divide the per-GPU batch {per_gpu} "
            f"(batch_size={cfg.batch_size} / gpus={cfg.gpus})"
        )
    return accum


def _gpu_facts(cfg: PlanConfig) -> tuple[float, float, float]:
    """(memory bytes, peak flop/s, memory bandwidth bytes/s) per GPU."""
    spec = gpu_spec(cfg.gpu)
    if spec is None and None in (cfg.gpu_mem_gb, cfg.peak_tflops, cfg.hbm_tb_s):
        raise PlanError(
            f"unknown gpu {cfg.gpu!r}: use one of {', '.join(GPUS)}, "
            "or give gpu_mem_gb=, peak_tflops= and hbm_tb_s= for another card"
        )
    memory = cfg.gpu_mem_gb if cfg.gpu_mem_gb is not None else spec.memory_gb
    flops = cfg.peak_tflops * 1e12 if cfg.peak_tflops is not None else spec.peak_flops[cfg.precision]
    bandwidth = cfg.hbm_tb_s * 1e12 if cfg.hbm_tb_s is not None else spec.hbm_bytes_per_s
    return memory * GB, flops, bandwidth


def speed_factors(cfg: PlanConfig) -> SpeedFactors:
    """Measured on this machine (calibrate=), else the reference run's; mfu= fixes the compute instead."""
    factors = calibrate_from(Path(cfg.calibrate))[0] if cfg.calibrate else default_factors()
    return replace(factors, fixed_mfu=cfg.mfu) if cfg.mfu is not None else factors


def _shape(cfg: PlanConfig) -> ModelShape:
    described = any(v is not None for v in (cfg.params, cfg.layers, cfg.width, cfg.heads, cfg.vocab))
    if cfg.model and described:
        raise PlanError("give either model= or a description (params=, layers=, width=, heads=, vocab=), not both")
    if cfg.model:
        return shape_of_spec(cfg.model, cfg.model_kwargs, cfg.model_blocks)
    return shape_of_description(
        params=cfg.params, layers=cfg.layers, width=cfg.width, heads=cfg.heads, vocab=cfg.vocab, seq_len=cfg.seq_len
    )


def strategy_names(cfg: PlanConfig) -> list[str]:
    """The strategies to plan: the registry's names the planner models, or those asked for."""
    from strategies.registry import default_registry

    known = known_backends()
    if cfg.strategies:
        unknown = [s for s in cfg.strategies if s not in known]
        if unknown:
            raise PlanError(f"unknown strategy {', '.join(unknown)}: the planner knows {', '.join(known)}")
        names = list(cfg.strategies)
    else:
        names = [n for n in default_registry().names() if n in known]
    if cfg.gpus > 1:
        if cfg.strategies and "single" in names:
            raise PlanError(f"strategy single runs on one GPU but gpus={cfg.gpus}: drop it or set gpus=1")
        names = [n for n in names if n != "single"]
    return names


def question(cfg: PlanConfig) -> Question:
    """Check the options and turn them into a planning question (one-line errors)."""
    _positive(
        cfg,
        "params",
        "layers",
        "width",
        "heads",
        "vocab",
        "gpus",
        "nodes",
        "gpu_mem_gb",
        "peak_tflops",
        "hbm_tb_s",
        "micro_batch",
        "batch_size",
        "seq_len",
    )
    if cfg.mfu is not None and not 0 < cfg.mfu <= 1:
        raise PlanError(f"mfu={cfg.mfu} must be in (0, 1]: the share of the peak flops the compute reaches")
    if cfg.gpus % cfg.nodes:
        raise PlanError(f"gpus={cfg.gpus} does not split over nodes={cfg.nodes}: give a multiple of {cfg.nodes}")
    if cfg.precision not in PRECISIONS:
        raise PlanError(f"precision={cfg.precision!r} is not one of {', '.join(PRECISIONS)}")
    if cfg.format not in FORMATS:
        raise PlanError(f"format={cfg.format!r} is not one of {', '.join(FORMATS)}")
    topology = Topology(
        cfg.gpus,
        cfg.nodes,
        parse_link(cfg.interconnect, INTERCONNECTS, "interconnect"),
        parse_link(cfg.inter_node, INTER_NODE, "inter_node link"),
    )
    grad_accum = _grad_accum(cfg)
    memory, flops, bandwidth = _gpu_facts(cfg)
    return Question(
        shape=_shape(cfg),
        gpus=cfg.gpus,
        nodes=cfg.nodes,
        gpu_mem_bytes=memory,
        micro_batch=cfg.micro_batch,
        grad_accum=grad_accum,
        seq_len=cfg.seq_len,
        precision=cfg.precision,
        checkpointing=cfg.activation_checkpointing,
        topology=topology,
        peak_flops=flops,
        hbm_bytes_per_s=bandwidth,
        factors=speed_factors(cfg),
        strategy_options=dict(cfg.strategy_options),
        compiled=cfg.compile,
    )


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GB:.2f}"


def _table(plans: list[StrategyPlan]) -> list[str]:
    header = (
        "strategy",
        "params",
        "grads",
        "optim",
        "activ",
        "buffers",
        "peak",
        "fits",
        "cpu",
        "wire/step",
        "exposed",
        "step",
        "tokens/s",
        "eff",
    )
    rows = [header]
    for p in plans:
        gpu = p.states_on("cuda")
        cpu = sum(p.states_on("cpu").values())
        buffers = sum(p.buffers.backward.values()) + sum(p.buffers.hooks.values())
        t = p.time
        rows.append(
            (
                p.name,
                _gb(gpu["params"]),
                _gb(gpu["grads"]),
                _gb(gpu["optimizer"]),
                _gb(p.activations.total if p.activations else None),
                _gb(buffers),
                _gb(p.peak_bytes),
                {True: "yes", False: "NO", None: "?"}[p.fits],
                _gb(cpu) if cpu else "-",
                _gb(t.wire_bytes) if t else "-",
                f"{t.exposed_comm_s * 1e3:.0f} ms" if t else "-",
                f"{t.step_s * 1e3:.0f} ms" if t else "-",
                f"{t.tokens_per_s:,.0f}" if t else "-",
                f"{t.efficiency:.0%}" if t else "-",
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    return [
        "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]


def _heading(cfg: PlanConfig, q: Question) -> list[str]:
    s = q.shape
    dims = s.dims
    shape = f"{s.params / 1e9:.3g}B params" if s.params >= 1e9 else f"{s.params / 1e6:.3g}M params"
    if dims:
        shape += f", {dims.layers} layers, width {dims.width}, {dims.heads} heads, vocab {dims.vocab}"
    lines = [
        f"parabench plan | {s.name} ({shape})",
        f"  {q.topology.describe()} | {cfg.gpu} {q.gpu_mem_bytes / GB:.0f} GB | {q.precision} | micro-batch "
        f"{q.micro_batch} x {q.seq_len} tokens x {q.grad_accum} accumulation | checkpointing "
        f"{'on' if q.checkpointing else 'off'}" + (" | compiled" if q.compiled else ""),
        *(f"  {line}" for line in basis_lines(q)),
    ]
    if s.note:
        lines.append(f"  note: {s.note}")
    lines.append("  GB = 1e9 bytes, per GPU; peak = predicted peak allocated; fits = peak within 90% of the card")
    return lines


def basis_lines(q: Question) -> list[str]:
    """Which of the plan's figures rest on a measurement of this machine, and which are assumed."""
    f = q.factors
    where = "measured" if f.measured else "assumed"
    if f.fixed_mfu is not None:
        compute = f"compute at {f.fixed_mfu:.0%} MFU of {(q.peak_flops or 0) / 1e12:.0f} TFLOP/s (mfu=, as given)"
    else:
        compute = (
            f"compute: matmuls at {MATMUL_EFFICIENCY:.0%} of {(q.peak_flops or 0) / 1e12:.0f} TFLOP/s and "
            f"memory-bound work at {HBM_EFFICIENCY:.0%} of {(q.hbm_bytes_per_s or 0) / 1e12:.2g} TB/s, "
            f"x {f.compute_scale:.2f} ({where})"
        )
    link = q.topology.link
    lines = [
        f"speed: {compute}",
        f"backend overheads and offload host steps {where} from {f.basis}",
        f"communication assumed: {link.name} at {link.gb_per_s:g} GB/s per GPU"
        + ("" if q.topology.nodes == 1 else f" ({q.topology.intra.name} inside a node)"),
    ]
    if f.memory_per_param:
        lines.append("memory: the model's, plus what the calibration run measured beyond it, scaled by parameters")
    if not f.measured:
        lines.append("calibrate=<out_dir of a compare on this machine> replaces the assumed figures with measured ones")
    return lines


def unmodelled(plans: list[StrategyPlan], q: Question) -> list[str]:
    """What the memory model is known to leave out, where no calibration has measured it."""
    return [
        f"{p.name}: DeepSpeed's GPU staging of offloaded parameters is not modelled (an H100 measured 4% above "
        "this kind of peak at gpt2-124m, micro-batch 4); calibrate= adds what your compare measures."
        for p in plans
        if p.backend.engine == "deepspeed" and p.backend.offload_params and p.name not in q.factors.memory_per_param
    ]


PAPER_STAGES = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}


def zero_paper_view(q: Question) -> dict[str, float]:
    """Model states per GPU in the ZeRO paper's accounting (mixed-precision Adam, K=12)."""
    return {name: zero_paper_bytes_per_gpu(q.shape.params, stage, q.gpus) for name, stage in PAPER_STAGES.items()}


def as_json(cfg: PlanConfig, q: Question, plans: list[StrategyPlan], rec: Recommendation) -> dict[str, Any]:
    s = q.shape
    return {
        "question": asdict(cfg)
        | {
            "grad_accum": q.grad_accum,
            "gpu_mem_bytes": q.gpu_mem_bytes,
            "peak_flops": q.peak_flops,
            "link": asdict(q.topology.link),
        },
        "model": {
            "name": s.name,
            "params": s.params,
            "flops_params": s.flops_params,
            "flops_per_token": s.flops_per_token(q.seq_len),
            "dims": asdict(s.dims) if s.dims else None,
            "note": s.note,
        },
        "strategies": [p.as_dict() for p in plans],
        "zero_paper_model_states_bytes": zero_paper_view(q),
        "recommendation": rec.as_dict(),
        "same_engine": engine_differences(plans, q),
    }


def main(args: list[str]) -> int:
    cfg: PlanConfig = load_config(args, schema=PlanConfig)
    q = question(cfg)
    names = strategy_names(cfg)
    plans = plan_all(names, q)
    rec = recommend(plans, q)
    plots: list[Path] = []
    if cfg.plot:
        from harness.plan.plots import write_plots  # matplotlib only when asked

        plots = write_plots(q, names, Path(cfg.out_dir))
    if cfg.format == "json":
        print(json.dumps(as_json(cfg, q, plans, rec) | {"plots": [str(p) for p in plots]}, indent=2))
    else:
        paper = ", ".join(f"{name} {b / GB:.1f} GB" for name, b in zero_paper_view(q).items())
        lines = (
            _heading(cfg, q)
            + [""]
            + _table(plans)
            + [
                f"ZeRO paper's accounting (mixed-precision Adam, K=12), model states per GPU: {paper}.",
                "The columns are what each backend as installed holds: DeepSpeed's ZeRO-1 reduces gradients into "
                "its partition during the last micro-step's backward, so it keeps ZeRO-2's gradients at rest.",
                *engine_differences(plans, q),
                *unmodelled(plans, q),
                "",
            ]
            + rec.lines
        )
        print("\n".join(lines + [f"wrote {p}" for p in plots]))
    return 0
