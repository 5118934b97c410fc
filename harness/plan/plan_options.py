"""The plan's options (`runner.py plan key=value ...`), checked and turned into planning
questions: one per model and GPU count asked (model=[...] and gpus=[...] sweep)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

from configs.schema import PRECISIONS
from harness.common.hardware import GPUS, GPUSpec, gpu_named, known_gpus
from harness.common.numbers import is_whole
from harness.common.units import GB
from harness.common.writable import FolderError, check_writable
from harness.plan.memory.recipe import Recipe, with_tied_embeddings
from harness.plan.model.mixture_inputs import check_mixture_inputs
from harness.plan.model.mla_shape import check_recomputed
from harness.plan.model.model_shape import ARCHS, ModelShape, PlanError, shape_of_description, shape_of_spec
from harness.plan.network.fabric import Topology, default_fabric, parse_fabric, topology_of
from harness.plan.parallel.batch_split import widest_split
from harness.plan.predict import Question
from harness.plan.search.search_space import parse_tokens, sequences_in
from harness.plan.speed.attention import KERNELS, UNFUSED, kernels_on, sdpa_kernel
from harness.plan.speed.calibration import calibrate_from, default_factors
from harness.plan.speed.compute import CHECKPOINTING
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL
from harness.plan.speed.step_time import SpeedFactors, for_card
from models.gpt_config import beyond_positions

FORMATS = ("table", "json")
# gpus= not given: DEFAULT_GPUS, or where nodes= is given, that many whole hosts (default_gpus).
GPUS_UNSET = "auto"
DEFAULT_GPUS = 8
# fp8: the projections' matmuls in fp8, the rest in bf16, as a run's precision=fp8; fp4: the projections'
# matmuls in NVFP4 or MXFP4, the rest as under fp8 (TransformerEngine's and Megatron-LM's fp4 recipes).
PLAN_PRECISIONS = (*PRECISIONS, "fp4")
# The formats people name, as the options that plan them: fp4 is NVFP4 or MXFP4 (hardware.py's fp4 peak and
# measured rate), MXFP8 block-scaled fp8.
PRECISION_FORMATS = {
    "nvfp4": "precision=fp4 (NVFP4 and MXFP4 are both planned as fp4)",
    "mxfp4": "precision=fp4 (NVFP4 and MXFP4 are both planned as fp4)",
    "mxfp8": "precision=fp8 fp8_block_scaling=true",
}
CHECKPOINTING_WORDS = {True: "full", False: "none", "true": "full", "false": "none"}


@dataclass
class PlanConfig:
    # The model: a zoo name, pkg.mod:fn, hf:ConfigClass (sizes in model_kwargs), or a description;
    # model=[a,b] plans each.
    model: Any = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    model_blocks: Optional[list[str]] = None  # class names of the blocks, as for train; None: found
    params: Optional[float] = None
    layers: Optional[int] = None
    width: Optional[int] = None
    heads: Optional[int] = None
    kv_heads: Optional[int] = None  # grouped-query attention: key/value heads (default: heads)
    ffn: Optional[int] = None  # MLP width (default: 4 x width for gpt, 8/3 x width for llama)
    vocab: Optional[int] = None
    arch: str = "gpt"  # a described model's block: gpt (LayerNorm, GELU) or llama (RMSNorm, SwiGLU, rotary)
    # The machines; gpus=[8,64,512] plans each. Unset: nodes= whole hosts where nodes= is given, else 8.
    gpus: Any = GPUS_UNSET
    nodes: Optional[int] = None  # default: gpus / gpus_per_node
    gpus_per_node: Optional[int] = None  # GPUs per host; default the card's (8; 4 on a GB200/GB300 tray)
    # GPUs on one NVLink domain: a count or nvl72/nvl36 (default the card's: 72 for GB200 and GB300).
    nvlink_domain: Any = None
    gpu: str = "H100"
    gpu_mem_gb: Optional[float] = None  # default: the card's capacity as torch reports it
    # One host's memory, GB (what offload keeps its state in); default: the card's reference system's
    # (a DGX H100's 2 TB, a GB200 tray's two Graces), hardware.py.
    host_mem_gb: Optional[float] = None
    # The CPU time, us, the host takes to issue one eager kernel (the Python, dispatch and launch): your host's
    # where it is slower or faster than the x86 server the default was measured on (speed/host_issue.py:
    # 24 us; 2.75 times that on a Grace CPU); a profile's host time a step over its kernels, or the eager
    # `host_s_per_kernel` that `python bench/kernel_table.py` writes, gives it. Compiled launches and the
    # backends' own host work go at the same pace.
    host_us_per_kernel: Optional[float] = None
    peak_tflops: Optional[float] = None  # default: the card's dense peak at this precision
    hbm_tb_s: Optional[float] = None  # default: the card's memory bandwidth, TB/s
    interconnect: str = "auto"  # inside a node: nvlink | pcie | GB/s per GPU (auto: the card's)
    inter_node: str = "auto"  # between nodes: 8x400gbps, or a named cluster (auto: the card's platform)
    # Speed: the compute model, scaled by `calibrate=<compare or train out_dir>` on this machine,
    # or, without it, by the reference H100 compare shipped with parabench.
    # calibrate=[a,b]: the first fits the speed; the peaks of all split each memory miss by kind.
    calibrate: Any = None
    mfu: Optional[float] = None  # set: compute at this fixed MFU instead of the compute model
    # The run.
    # Sequences per data-parallel rank per micro-step (a tensor-parallel group shares one); unset:
    # batch_size over each layout's ranks (one sequence a GPU where no batch_size is given).
    micro_batch: Optional[int] = None
    batch_size: Optional[int] = None  # global, in sequences; default: micro_batch per data-parallel rank, else 1 a GPU
    # search=true: plan every layout (strategy, tp, shard, micro-batch, accumulation, checkpointing)
    # that makes this global batch, in tokens (4194304 or 4M), and rank those that fit (search.py).
    search: bool = False
    global_batch_tokens: Any = None
    top: Optional[int] = None  # search=true: how many of the fastest layouts it lists and its JSON keeps (default 10)
    seq_len: Optional[int] = None  # unset: DEFAULT_SEQ_LEN, or the model's learned positions where fewer
    precision: str = "bf16"
    # none | full | selective (true/false: full/none); unset: none, and search=true tries all three
    activation_checkpointing: Any = None
    fused_loss: bool = False  # a fused or chunked cross-entropy that never holds the whole fp32 logits
    fused_norm: bool = False  # a fused RMSNorm kernel (torchtitan's Triton one, Apex's, Liger's)
    complex_rope: bool = False  # rotary embedding in complex numbers (torchtitan's): compile runs it eager
    # flash (SDPA's FlashAttention-2) | flash3 | cudnn | flash1 | triton | math | fused_softmax (Megatron's unfused)
    attention: Optional[str] = None  # default: the kernel torch's SDPA runs on the card (attention.sdpa_kernel)
    compile: bool = False  # plan for compile=true runs (elementwise chains fused)
    # How the run trains beyond the strategy (harness/plan/memory/recipe.py says what each changes).
    pure_bf16: bool = False  # bf16 parameters, gradients and AdamW state, no fp32 master (torchtune)
    megatron_mixed_precision: bool = False  # bf16 parameters, fp32 master and moments (Megatron-LM)
    optimizer: str = "adamw"  # adamw | adamw8bit (bitsandbytes, torchao)
    tied_embeddings: Optional[bool] = None  # the head shares the embedding's weight; unset: as the model is
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (OLMo 2, Qwen3)
    fp32_grad_accum: bool = False  # gradients accumulated in fp32 buffers (Megatron-LM's main_grad)
    fp8_all_gather: bool = False  # FSDP2 gathers fp8 weights (torchao), with precision=fp8
    fp8_saved_inputs: bool = False  # the fp8 projections keep fp8 inputs for backward (TransformerEngine)
    te_fp8: bool = False  # the fp8 casts as TransformerEngine runs them: fused, weights cast once a step
    fp8_block_scaling: bool = False  # MXFP8: a scale per 32 elements, on Blackwell's or CDNA4's tensor cores
    fp8_attention: bool = False  # TransformerEngine's fp8 attention (cuDNN's fp8 kernel), with attention=cudnn
    activation_offload: bool = False  # saved activations in host memory (torchtune)
    activation_offload_layers: int = 0  # that many blocks' activations in host memory (Megatron-core)
    loss_in_place: bool = False  # the fused cross-entropy writes the logits' gradient over them (TransformerEngine's)
    fused_linear_loss: bool = False  # the head's matmul and the loss fused in chunks, no whole logits (Liger's)
    attention_dropout: float = 0.0  # dropout on the attention's probabilities (Megatron-LM's default: 0.1)
    hidden_dropout: float = 0.0  # dropout on each block's branch outputs (Megatron-LM's default: 0.1)
    fragmentation: float = 0.0  # share of the activations the caching allocator cannot reuse
    # A mixture of experts: the busiest expert GPU's tokens over the mean (1.0: balanced), and
    # Megatron-core's recomputed modules (core_attn, layernorm, moe_act, moe, mlp).
    moe_imbalance: float = 1.0
    recompute_modules: Any = ()
    strategies: Optional[list[str]] = None  # None: every strategy the planner knows
    strategy_options: dict[str, Any] = field(default_factory=dict)
    # Output.
    format: str = "table"
    plot: bool = False
    out_dir: Optional[str] = None  # where plot=true writes its charts (plot_dir); nothing else is written


def _listed(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def models_asked(cfg: PlanConfig) -> list[str | None]:
    if cfg.model is None:
        return [None]
    models = _listed(cfg.model)
    if not models:  # an empty sweep would plan nothing, and the first model is every question's default
        raise PlanError("model=[] names no model: give model=a or model=[a,b]")
    for m in models:  # model=3 reads as a number, which names no model
        if not isinstance(m, str):
            raise PlanError(
                f"model={m!r} is not a model name: give a zoo name (gpt2-1.5b), a catalogue name, "
                "hf:<config class or config.json>, or pkg.module:fn"
            )
    return models


def check_strategies(cfg: PlanConfig) -> None:
    """strategies=[] names none: refused as compare refuses it, not planned as every strategy (left out)."""
    if cfg.strategies is not None and not cfg.strategies:
        raise PlanError("strategies=[] names no strategy: list some, or leave it out to plan every one")


def default_gpus(cfg: PlanConfig) -> int:
    """The GPUs where gpus= is not given: nodes= alone means whole hosts (nodes=4 of H100s is 32 GPUs, of
    GB200 trays 16), of gpus_per_node= or the card's host; with no nodes= either, DEFAULT_GPUS."""
    if cfg.nodes is None:
        return DEFAULT_GPUS
    card = gpu_named(cfg.gpu) or GPUS["H100"]  # a custom card is planned on the H100's hosts
    return cfg.nodes * (cfg.gpus_per_node or card.gpus_per_host)


def gpu_counts(cfg: PlanConfig) -> list[int]:
    if cfg.gpus == GPUS_UNSET:
        return [default_gpus(cfg)]
    if cfg.gpus is None:  # `gpus=` with nothing after it (an unset shell variable): not a count to print back
        raise PlanError("gpus= is empty: give a GPU count (gpus=8) or a list of them (gpus=[8,64])")
    counts = _listed(cfg.gpus)
    if not counts:  # an empty sweep would plan nothing, and the first count is every question's default
        raise PlanError("gpus=[] names no GPU count: give gpus=8 or gpus=[8,64]")
    for g in counts:
        if not is_whole(g):
            raise PlanError(f"gpus={cfg.gpus} must be a positive whole number, or a list such as gpus=[8,64,512]")
    return counts


# host_us_per_kernel='s sensible span, us: a launch alone takes about 2.5 (host_issue.py's compiled rate) and
# the slowest eager hosts measured 45; a figure outside it is another unit (seconds, milliseconds) or a typo.
HOST_US_PER_KERNEL_RANGE = (1.0, 1000.0)


def _positive(cfg: PlanConfig, *names: str) -> None:
    """Each of `names` unset or a finite number above 0: NaN passes a `<= 0` check (`0 < nan` is
    false, so this refuses it) and infinity is no size, capacity or rate to plan with."""
    for name in names:
        value = getattr(cfg, name)
        if value is not None and not 0 < value < math.inf:
            raise PlanError(f"{name}={value} must be a positive, finite number")


def checkpointing_of(cfg: PlanConfig) -> str:
    value = cfg.activation_checkpointing
    if value is None:
        return "none"
    mode = CHECKPOINTING_WORDS.get(value.lower() if isinstance(value, str) else value, value)
    if mode not in CHECKPOINTING:
        raise PlanError(
            f"activation_checkpointing={value!r} is not one of {', '.join(CHECKPOINTING)} "
            "(true and false mean full and none)"
        )
    return mode


def check(cfg: PlanConfig) -> None:
    """Every option on its own (one-line errors)."""
    _positive(
        cfg,
        "params",
        "layers",
        "width",
        "heads",
        "kv_heads",
        "ffn",
        "vocab",
        "nodes",
        "gpus_per_node",
        "gpu_mem_gb",
        "host_mem_gb",
        "host_us_per_kernel",
        "peak_tflops",
        "hbm_tb_s",
        "micro_batch",
        "batch_size",
        "seq_len",
    )
    models_asked(cfg)
    check_strategies(cfg)
    gpu_counts(cfg)
    checkpointing_of(cfg)
    calibration_paths(cfg)
    check_top(cfg)
    low, high = HOST_US_PER_KERNEL_RANGE
    if cfg.host_us_per_kernel is not None and not low <= cfg.host_us_per_kernel <= high:
        raise PlanError(
            f"host_us_per_kernel={cfg.host_us_per_kernel:g} is microseconds of CPU to issue one eager kernel: give "
            f"{low:g} to {high:g} (the default is {HOST_S_PER_KERNEL['eager'] * 1e6:g})"
        )
    if cfg.mfu is not None and not 0 < cfg.mfu <= 1:
        raise PlanError(f"mfu={cfg.mfu} must be in (0, 1]: the share of the peak flops the compute reaches")
    if cfg.precision not in PLAN_PRECISIONS:
        spelled = str(cfg.precision).strip().lower()
        said = PRECISION_FORMATS.get(spelled) or (f"precision={spelled}" if spelled in PLAN_PRECISIONS else "")
        raise PlanError(
            f"precision={cfg.precision!r} is not one of {', '.join(PLAN_PRECISIONS)}"
            + (f": give {said}" if said else "")
        )
    if cfg.format not in FORMATS:
        raise PlanError(f"format={cfg.format!r} is not one of {', '.join(FORMATS)}")
    if cfg.attention is not None and cfg.attention not in KERNELS:
        raise PlanError(f"attention={cfg.attention!r} is not one of {', '.join(KERNELS)}")
    if cfg.arch not in ARCHS:
        raise PlanError(f"arch={cfg.arch!r} is not one of {', '.join(ARCHS)}")
    recipe_of(cfg).check(cfg.precision)
    if cfg.nodes is not None and len(gpu_counts(cfg)) > 1:
        raise PlanError("nodes= fixes one GPU count's nodes: with gpus=[...] give gpus_per_node= instead")
    if cfg.out_dir is not None and not cfg.plot:  # a plan writes nothing else: out_dir= alone would be ignored
        raise PlanError(
            f"out_dir={cfg.out_dir} is where plot=true writes its charts, and a plan writes nothing else: give "
            "plot=true, or leave out_dir out (format=json prints the plan as JSON, to redirect to a file)"
        )
    if cfg.plot:  # before planning: a folder the charts cannot go to is one line, not a traceback after it
        try:
            check_writable(str(plot_dir(cfg)), f"out_dir={plot_dir(cfg)} (where plot=true writes its charts)")
        except FolderError as exc:
            raise PlanError(str(exc)) from None


PLOT_DIR = "runs/plan"  # where plot=true writes its charts unless out_dir= says


def plot_dir(cfg: PlanConfig) -> Path:
    """The folder plot=true writes its charts to: out_dir=, else PLOT_DIR."""
    return Path(cfg.out_dir if cfg.out_dir is not None else PLOT_DIR)


def check_top(cfg: PlanConfig) -> None:
    """top= is search=true's (how many of the fastest layouts it lists and its JSON keeps, for `compare
    plan=` to run the top of): without search=true it would be ignored, so it is refused."""
    if cfg.top is None:
        return
    if not cfg.search:
        raise PlanError("top= is how many layouts search=true lists and keeps: give search=true, or leave top= out")
    if cfg.top < 1:
        raise PlanError(f"top={cfg.top} must be 1 or more: how many of the fastest layouts the search keeps")


def too_few_sequences(cfg: PlanConfig, global_batch: int, seq_len: int, fewest: int) -> str:
    """A global batch no layout can split, said in the option the user gave it by (global_batch_tokens=
    or batch_size=): fewer sequences than the fewest a layout here takes says that fewest; more that divide
    over no layout's ranks (2048 over 288 GPUs) say the multiples of it nearest to the batch given."""
    tokens = cfg.global_batch_tokens is not None

    def said(sequences: int, of: str = "") -> str:
        plural = "s" if sequences > 1 else ""
        return f"{sequences * seq_len:,} ({sequences} sequence{plural}{of})" if tokens else f"{sequences}"

    option = "global_batch_tokens=" if tokens else "batch_size="
    given = f"{option}{said(global_batch, f' of {seq_len}')}"
    if global_batch < fewest:
        return (
            f"{given} is too few to split over any layout's data-parallel ranks: give {option} of at least "
            f"{said(fewest)}, the fewest a layout here takes, or fewer gpus="
        )
    below = global_batch // fewest * fewest
    return (
        f"{given} does not divide over any layout's data-parallel ranks: give {option} a multiple of "
        f"{said(fewest)}, the fewest a layout here takes, such as {said(below)} or {said(below + fewest)}, or "
        "another gpus="
    )


def recipe_of(cfg: PlanConfig) -> Recipe:
    """The run's recipe as the options give it: each of its fields is an option of the same name."""
    values = {f.name: getattr(cfg, f.name) for f in fields(Recipe)}
    return Recipe(**{**values, "recompute_modules": tuple(_listed(cfg.recompute_modules))})


def gpu_of(cfg: PlanConfig) -> GPUSpec:
    """The card, with any figure the options give in place of the data sheet's."""
    known = gpu_named(cfg.gpu)
    if known is None and None in (cfg.gpu_mem_gb, cfg.peak_tflops, cfg.hbm_tb_s):
        raise PlanError(
            f"unknown gpu {cfg.gpu!r}: use one of {known_gpus()}, "
            "or give gpu_mem_gb=, peak_tflops= and hbm_tb_s= for another card"
        )
    spec = with_given_figures(cfg, known or GPUS["H100"], "custom card" if known else f"custom card {cfg.gpu}")
    if known is None:
        check_custom_card(cfg, spec)
    if cfg.host_mem_gb is not None:  # the host's, not the card's: the card keeps its name
        spec = replace(spec, host_memory_gib=cfg.host_mem_gb * GB / 2**30)
    if cfg.host_us_per_kernel is not None:
        spec = replace(spec, host_us_per_kernel=cfg.host_us_per_kernel)
    check_precision(spec, cfg.precision)
    if cfg.fp8_block_scaling and spec.generation not in BLOCK_SCALED:
        raise PlanError(
            f"fp8_block_scaling=true: the {spec.name}'s tensor cores do not apply MXFP8's block scales: use a "
            "Blackwell or MI350/MI355 card, or leave it out (tensorwise fp8)"
        )
    if cfg.fp8_attention and (cfg.attention or sdpa_kernel(spec)) != "cudnn":
        raise PlanError("fp8_attention=true is cuDNN's fp8 attention kernel: give attention=cudnn as well")
    if spec.generation == "volta" and cfg.attention is not None and cfg.attention not in VOLTA_ATTENTION:
        raise PlanError(
            f"attention={cfg.attention}: FlashAttention and cuDNN's fused attention do not run on the {spec.name} "
            "(Volta): use attention=math (or fused_softmax, Megatron-LM's)"
        )
    if cfg.attention is not None and cfg.attention not in kernels_on(spec):
        raise PlanError(
            f"attention={cfg.attention}: no rates of that kernel on the {spec.name} in the sources (docs/planner.md, "
            f"'The cards'): use one of {', '.join(k for k in kernels_on(spec) if k in KERNELS)}"
        )
    return spec


# The options that give a card's figures, as the custom card's name says each.
GIVEN_FIGURES = {"gpu_mem_gb": "{:g} GB", "peak_tflops": "{:g} TFLOP/s {precision}", "hbm_tb_s": "{:g} TB/s"}


def with_given_figures(cfg: PlanConfig, card: GPUSpec, label: str) -> GPUSpec:
    """`card` with the figures the options give in place of its own: a custom card, named `label` and by
    those figures, as the header and the card line say (its power and sources are no longer `card`'s)."""
    given = {option: getattr(cfg, option) for option in GIVEN_FIGURES if getattr(cfg, option) is not None}
    if not given:
        return card
    figures = ", ".join(GIVEN_FIGURES[option].format(value, precision=cfg.precision) for option, value in given.items())
    return replace(
        _figures_replaced(cfg, card),
        name=f"{label} ({figures}; the {card.name}'s other figures)",
        power_w=None,
        sources=(
            f"{', '.join(f'{option}={value:g}' for option, value in given.items())} as given; the rest (matmul "
            f"efficiency, links, attention rates) the {card.name}'s, whose sources docs/planner.md tabulates"
        ),
    )


def _figures_replaced(cfg: PlanConfig, spec: GPUSpec) -> GPUSpec:
    if cfg.peak_tflops is not None:  # the peak at the run's precision; fp8's is twice bf16's, fp4's four times
        base = cfg.peak_tflops * 1e12 / LOW_PRECISION_SPEEDUP.get(cfg.precision, 1)
        peaks = {key: base * LOW_PRECISION_SPEEDUP.get(key, 1) for key in spec.peak_flops if key != "fp32"}
        spec = replace(spec, peak_flops={**peaks, "fp32": spec.peak_flops["fp32"]})
    if cfg.hbm_tb_s is not None:
        spec = replace(spec, hbm_bytes_per_s=cfg.hbm_tb_s * 1e12)
    if cfg.gpu_mem_gb is not None:
        spec = replace(spec, capacity_gib=cfg.gpu_mem_gb * GB / 2**30)
    return spec


# A card given by its figures is planned with the H100's efficiencies and Hopper's attention tables, but is
# not known to be a Hopper: a kernel built for Hopper's tensor cores (FlashAttention-3's warpgroup matmuls
# and TMA copies) need not run on it, and no fp4 rate was measured on it (fp4's share of the peak is
# measured per card).
HOPPER_KERNELS = ("flash3",)


def check_custom_card(cfg: PlanConfig, spec: GPUSpec) -> None:
    """What a card given by gpu_mem_gb=, peak_tflops= and hbm_tb_s= (`spec`, as it is planned) cannot be
    planned with, in one line."""
    if cfg.precision == "fp4":
        raise PlanError(
            f"precision=fp4: gpu={cfg.gpu}, given by its figures, has no measured fp4 rate to plan with: give "
            "precision=fp8 with peak_tflops= its dense fp8 peak, or a Blackwell card (B200, B300, GB200, GB300)"
        )
    if cfg.attention in HOPPER_KERNELS:
        takes = [k for k in kernels_on(spec) if k in KERNELS and k not in HOPPER_KERNELS]
        raise PlanError(
            f"attention={cfg.attention} is built for Hopper's tensor cores, and gpu={cfg.gpu}, given by its "
            f"figures, is not known to run it: use one of {', '.join(takes)}, or name a card that runs it (gpu=H100)"
        )


BLOCK_SCALED = ("blackwell", "cdna4")  # tensor cores that take MXFP8's block scales at the fp8 rate
VOLTA_ATTENTION = UNFUSED  # the softmax between two batched matmuls (Megatron-LM's on V100)


LOW_PRECISION_SPEEDUP = {"fp8": 2, "fp4": 4}  # over bf16, where the options give one peak


def check_precision(spec: GPUSpec, precision: str) -> None:
    """A precision the card's tensor cores do not run is one line saying what to give."""
    if precision == "fp8" and spec.fp8_efficiency is None:
        raise PlanError(
            f"precision=fp8: the {spec.name} has no fp8 tensor cores: use bf16, or a Hopper, Ada, Blackwell or "
            "AMD Instinct MI300 card or later"
        )
    if precision == "fp4" and spec.fp4_efficiency is None:
        raise PlanError(
            f"precision=fp4: the {spec.name} has no fp4 matmul the planner has a measured rate for: use fp8, or a "
            "Blackwell card (B200, B300, GB200, GB300)"
        )
    if precision == "bf16" and "bf16" not in spec.peak_flops:
        raise PlanError(f"precision=bf16: the {spec.name} has no bf16 tensor cores: use fp16")


def speed_factors(cfg: PlanConfig) -> SpeedFactors:
    """Measured on this machine (calibrate=), else the reference run's; mfu= fixes the compute instead."""
    from dataclasses import replace

    paths = calibration_paths(cfg)
    factors = calibrate_from(*paths)[0] if paths else default_factors()
    return replace(factors, fixed_mfu=cfg.mfu) if cfg.mfu is not None else factors


def calibration_paths(cfg: PlanConfig) -> list[Path]:
    """The folders calibrate= names; none where it is unset. calibrate=[] names none either, but
    reads as asking for a calibration: refused rather than planned with the assumed figures."""
    if cfg.calibrate is None:
        return []
    paths = _listed(cfg.calibrate)
    if not paths or any(not str(p).strip() for p in paths):
        raise PlanError(
            f"calibrate={cfg.calibrate!r} names no folder: give the out_dir of a finished compare, "
            "calibrate=[a,b] for several, or leave it out"
        )
    return [Path(str(p)) for p in paths]


def shape_for(cfg: PlanConfig, model: str | None) -> ModelShape:
    described = any(
        v is not None for v in (cfg.params, cfg.layers, cfg.width, cfg.heads, cfg.vocab, cfg.kv_heads, cfg.ffn)
    )
    if model and described:
        raise PlanError(
            "give either model= or a description (params=, layers=, width=, heads=, kv_heads=, ffn=, vocab=), not both"
        )
    if model:
        return shape_of_spec(model, cfg.model_kwargs, cfg.model_blocks)
    return shape_of_description(
        params=cfg.params,
        layers=cfg.layers,
        width=cfg.width,
        heads=cfg.heads,
        vocab=cfg.vocab,
        seq_len=cfg.seq_len or DEFAULT_SEQ_LEN,
        kv_heads=cfg.kv_heads,
        ffn=cfg.ffn,
        arch=cfg.arch,
    )


DEFAULT_SEQ_LEN = 1024


def with_seq_len(cfg: PlanConfig, shape: ModelShape) -> PlanConfig:
    """`cfg` with the sequence length its question plans: seq_len= as given, where a seq_len beyond the
    model's learned positions is one line, as train says it (the model has no embedding for the tokens
    past them, so no run of it takes such a sequence); unset, DEFAULT_SEQ_LEN, or the model's positions
    where it has fewer."""
    if shape.positions is None:
        return cfg if cfg.seq_len is not None else replace(cfg, seq_len=DEFAULT_SEQ_LEN)
    key, positions = shape.positions
    if cfg.seq_len is None:
        return replace(cfg, seq_len=min(DEFAULT_SEQ_LEN, positions))
    if cfg.seq_len > positions:
        raise PlanError(beyond_positions(shape.name, cfg.seq_len, key, positions))
    return cfg


def global_batch_of(cfg: PlanConfig) -> int | None:
    """The global batch in sequences, where one is given: global_batch_tokens= over seq_len, or batch_size=."""
    if cfg.global_batch_tokens is None:
        return cfg.batch_size
    if cfg.batch_size is not None:
        raise PlanError("give global_batch_tokens= or batch_size= (sequences), not both")
    return sequences_in(parse_tokens(cfg.global_batch_tokens), cfg.seq_len)


# With neither batch_size= nor micro_batch=, the sequences each GPU takes a step.
DEFAULT_BATCH_PER_GPU = 1


def batch_per_gpu(cfg: PlanConfig) -> int | None:
    """DEFAULT_BATCH_PER_GPU where the question gives neither a global batch nor a micro-batch, else None."""
    return DEFAULT_BATCH_PER_GPU if global_batch_of(cfg) is None and cfg.micro_batch is None else None


def planned_global_batch(cfg: PlanConfig, gpus: int) -> int | None:
    """The global batch every layout is held to: the one given; with neither it nor a micro-batch
    given, one sequence a GPU, so that a tensor-parallel group takes its GPUs' share and a pipeline
    runs its share as micro-batches (the same global batch whatever the strategy); with a micro-batch
    alone, none: each layout's data-parallel ranks take that micro-batch."""
    per_gpu = batch_per_gpu(cfg)
    return per_gpu * gpus if per_gpu is not None else global_batch_of(cfg)


def batching(cfg: PlanConfig, gpus: int) -> tuple[int, int]:
    """(micro-batch, accumulation) the question starts from: as asked, or the global batch over
    the most data-parallel ranks it divides over (every GPU where it can); each layout then splits
    it over its own ranks (predict.batching)."""
    sequences = planned_global_batch(cfg, gpus)
    if sequences is None:
        return cfg.micro_batch, 1
    return widest_split(sequences, gpus, cfg.micro_batch)


def topology_for(cfg: PlanConfig, gpus: int, gpu: GPUSpec) -> Topology:
    if cfg.nodes is not None and cfg.gpus_per_node is not None and cfg.nodes * cfg.gpus_per_node != gpus:
        # The nodes split gpus= (8 unless given) and gpus_per_node= would be dropped without a word:
        # nodes=4 gpus_per_node=8 is not four hosts of 2.
        raise PlanError(
            f"nodes={cfg.nodes} of gpus_per_node={cfg.gpus_per_node} is {cfg.nodes * cfg.gpus_per_node} GPUs, not "
            f"gpus={gpus}: give gpus={cfg.nodes * cfg.gpus_per_node}, or only one of nodes= and gpus_per_node="
        )
    if cfg.gpus_per_node is not None and gpus < cfg.gpus_per_node:
        # Planned as one node of `gpus`, and its what-if on more GPUs as nodes of that many: the
        # gpus_per_node given would count for nothing.
        raise PlanError(
            f"gpus={gpus} is less than one node of gpus_per_node={cfg.gpus_per_node}: give gpus= a multiple of "
            f"{cfg.gpus_per_node}, or gpus_per_node={gpus} to plan one node of {gpus}"
        )
    per_host = cfg.gpus_per_node or gpu.gpus_per_host
    if cfg.nodes is None and cfg.gpus_per_node is None and gpus > per_host and gpus % per_host:
        # Beyond one host, whole hosts of the card's size: 12 H100s are not two hosts of 6 with 6 NICs each.
        raise PlanError(
            f"gpus={gpus} is not whole hosts of {per_host} GPUs (the {gpu.name}'s): give gpus= a multiple of "
            f"{per_host}, or gpus_per_node= (or nodes=) for hosts of another size"
        )
    nodes = cfg.nodes if cfg.nodes is not None else max(1, -(-gpus // per_host))
    if gpus % nodes:  # named as the user set them: nodes=, gpus_per_node=, or neither (the card's)
        if cfg.nodes is not None:
            raise PlanError(f"gpus={gpus} does not split over nodes={nodes}: give a multiple of {nodes}")
        given = f"gpus_per_node={per_host}" if cfg.gpus_per_node else f"{per_host} GPUs (the {gpu.name}'s per node)"
        raise PlanError(
            f"gpus={gpus} does not split evenly over {nodes} nodes of {given}: give gpus= a multiple of "
            f"{per_host}, or nodes="
        )
    auto = cfg.inter_node == "auto"
    # A named network of a card per GPU has as many as a whole host has GPUs, a part of one asked too.
    host = gpus // nodes if cfg.nodes is not None else max(gpus // nodes, per_host)
    fabric = default_fabric(gpu, gpus // nodes) if auto else parse_fabric(cfg.inter_node, host)
    return topology_of(gpu, gpus, nodes, fabric, cfg.interconnect, cfg.nvlink_domain)


def question(
    cfg: PlanConfig, model: str | None = None, gpus: int | None = None, shape: ModelShape | None = None
) -> Question:
    """Check the options and turn them into the planning question for one model and GPU count
    (the first asked where not given)."""
    check(cfg)
    gpu = gpu_of(cfg)
    count = gpus if gpus is not None else gpu_counts(cfg)[0]
    topology = topology_for(cfg, count, gpu)
    shape = shape or shape_for(cfg, model if model is not None else models_asked(cfg)[0])
    cfg = with_seq_len(cfg, shape)
    micro_batch, grad_accum = batching(cfg, count)
    recipe = recipe_of(cfg)
    check_recomputed(shape.name, shape.dims, recipe.recompute_modules)
    check_mixture_inputs(shape.name, shape.dims, cfg.strategy_options, recipe.moe_imbalance)
    return Question(
        shape=with_tied_embeddings(shape, cfg.tied_embeddings),
        topology=topology,
        capacity_bytes=gpu.capacity_bytes,
        host_memory_bytes=gpu.host_memory_bytes,
        host_memory_gpus=None if cfg.host_mem_gb is not None else gpu.gpus_per_host,
        host_gpus=None if cfg.nodes is not None else cfg.gpus_per_node or gpu.gpus_per_host,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        seq_len=cfg.seq_len,
        precision=cfg.precision,
        gpu=gpu,
        factors=for_card(speed_factors(cfg), gpu.name),
        checkpointing=checkpointing_of(cfg),
        fused_loss=cfg.fused_loss,
        fused_norm=cfg.fused_norm,
        complex_rope=cfg.complex_rope,
        attention=cfg.attention or sdpa_kernel(gpu),
        compiled=cfg.compile,
        strategy_options=dict(cfg.strategy_options),
        global_batch=planned_global_batch(cfg, count),
        split_global_batch=cfg.micro_batch is None,
        batch_per_gpu=batch_per_gpu(cfg),
        recipe=recipe,
    )
