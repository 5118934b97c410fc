"""`runner.py compare plan=<search json> top=3`: measure the best layouts of a `plan search=true`
on this machine, beside `single`, on the plan's model, seq_len and global batch.

Each layout runs as its strategy with its settings (strategy options such as tp_size or
shard_size, micro-batch, accumulation, activation checkpointing: none, full or selective),
labelled by its strategy and its place in the plan (`ddp-tp#1`), so two layouts of one strategy
are two runs. A layout planned on more GPUs than this compare has processes runs on fewer, keeping
its tp, its micro-batch and the global batch (the accumulation grows by as much as the
data-parallel ranks shrink); one this machine cannot run as planned (tp wider than its processes,
a setting the strategy refuses) is refused with the reason, and the others run.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from configs.schema import ConfigError, RunConfig
from harness.common.numbers import is_whole
from strategies.mesh_layout import MeshError
from strategies.registry import StrategyError, default_registry

if TYPE_CHECKING:
    from harness.compare.compare_config import CompareConfig
    from harness.compare.fit_here import Fit

DEFAULT_TOP = 3
REFERENCE = "single"  # what each layout is measured beside
# Settings a plan compare takes from the plan: given beside plan= they would measure something else.
FROM_PLAN = (
    "model",
    "model_kwargs",
    "model_blocks",
    "seq_len",
    "batch_size",
    "micro_batch",
    "grad_accum",
    "activation_checkpointing",
    "selective_checkpointing",
)
SEARCH_COMMAND = "runner.py plan search=true model=... gpus=... global_batch_tokens=... format=json > plan.json"
KEEPING = " format=json"  # where a top= to keep more layouts goes in SEARCH_COMMAND
# fp32 weights, gradients and two Adam moments in one process: what `single` holds at the least.
STATE_BYTES_PER_PARAM = 16


@dataclass(frozen=True)
class PlannedLayout:
    """One layout of the plan as it runs here."""

    label: str  # its label and run folder: `<strategy>#<place in the plan>`
    strategy: str
    strategy_options: dict[str, Any]
    micro_batch: int
    grad_accum: int  # here: the plan's, times the data-parallel ranks it lost
    checkpointing: str  # none | selective | full, as planned
    nproc: int  # the processes it runs on here
    planned: dict[str, Any]  # the plan's figures: rank, gpus, tp, data_parallel, micro-batch, tokens/s, peak
    scaled: str | None = None  # how it runs otherwise than planned, in words
    refused: str | None = None  # why it cannot run here

    @property
    def folder(self) -> str:
        from harness.compare.run_names import safe_name

        return safe_name(self.label)

    def run_settings(self) -> dict[str, Any]:
        """The RunConfig settings this layout's run adds to the compare's shared ones."""
        return {
            "strategy_options": dict(self.strategy_options),
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "activation_checkpointing": self.checkpointing != "none",
            "selective_checkpointing": self.checkpointing == "selective",
        }

    def train_args(self) -> list[str]:
        """run_settings as `train` arguments (JSON values read back as the same YAML scalars)."""
        settings = self.run_settings()
        options = settings.pop("strategy_options")
        return [
            *(f"strategy_options.{key}={json.dumps(value)}" for key, value in options.items()),
            *(f"{key}={json.dumps(value)}" for key, value in settings.items()),
        ]

    def describe(self) -> str:
        options = "".join(f", {key} {value}" for key, value in self.strategy_options.items())
        return (
            f"{self.strategy}{options}, micro-batch {self.micro_batch} x accumulation {self.grad_accum}, "
            f"checkpointing {self.checkpointing}: #{self.planned['rank']} of the plan"
        )


def check_plan_args(cfg: CompareConfig, args: list[str]) -> None:
    """One line for a setting that plan= decides, or top= without a plan."""
    given = {arg.partition("=")[0].split(".")[0] for arg in args}
    if cfg.plan is None:
        if cfg.top is not None:
            raise ConfigError("top= picks the best layouts of a plan: give plan=<the JSON of plan search=true> too")
        return
    clash = [key for key in (*FROM_PLAN, "strategies", "strategy_options") if key in given]
    if clash:
        raise ConfigError(
            f"plan= sets {', '.join(clash)} from the plan's layouts: drop {', '.join(f'{k}=' for k in clash)} "
            "(or run a compare without plan=)"
        )
    if cfg.batch_search:
        raise ConfigError("batch_search= finds a strategy's micro-batch, and a plan's layouts fix theirs: drop one")
    if cfg.launcher != "local":
        raise ConfigError("plan= measures layouts on this machine: use launcher=local")


SEARCH_SIZES = ("gpus", "seq_len", "global_batch_sequences")  # a search's question: whole numbers
LAYOUT_SIZES = ("tp", "pp", "cp", "data_parallel", "micro_batch", "grad_accum")  # a layout's whole numbers
LAYOUT_DEFAULTED = ("pp", "cp")  # absent from a layout: 1 (layouts_of reads them so)


def read_search(path: str, top: int) -> dict[str, Any]:
    """The search result in `path`, holding at least `top` layouts."""
    if top < 1:
        raise ConfigError(f"top={top} must be 1 or more: the number of the plan's best layouts to measure")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"plan={path}: no such file: give the JSON that `{SEARCH_COMMAND}` writes")
    try:
        search = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"plan={path} is not JSON ({exc}): give the JSON that `{SEARCH_COMMAND}` writes") from None
    if not isinstance(search, dict) or not isinstance(search.get("layouts"), list) or "question" not in search:
        raise ConfigError(
            f"plan={path} is not a search result (no layouts): give the JSON that `{SEARCH_COMMAND}` writes"
        )
    found = len(search["layouts"])
    if found == 0:
        raise ConfigError(f"plan={path} holds no layout that fits: search a larger cluster or a smaller model")
    if found < top:
        raise ConfigError(_too_few(path, search, top))
    question = search["question"]
    if isinstance(question, dict) and not question.get("model") and question.get("layers"):
        raise ConfigError(
            f"plan={path} plans a model described by its sizes (layers=, width=, ...), which train cannot build: "
            "search a model it builds (model=<a zoo preset>, hf:<ConfigClass> with model_kwargs.*, or pkg.mod:fn)"
        )
    wrong = _wrong_question(search["question"]) or next(
        (
            f"layout {rank} {why}"
            for rank, layout in enumerate(search["layouts"][:top], 1)
            if (why := _wrong_layout(layout))
        ),
        None,
    )
    if wrong:
        raise ConfigError(f"plan={path} is not a search result ({wrong}): give the JSON that `{SEARCH_COMMAND}` writes")
    return search


def _too_few(path: str, search: dict[str, Any], top: int) -> str:
    """Why the file holds fewer layouts than `top`: the search kept only its top ones (more fit: search
    again keeping more), or no more fit (search a cluster where more do)."""
    found, fit, kept = len(search["layouts"]), search.get("fit"), search.get("top", len(search["layouts"]))
    layouts = f"{found} layout{'s' if found != 1 else ''}"
    if is_whole(fit) and is_whole(kept) and fit > found >= kept:  # fewer than kept: the rest plan alike
        again = SEARCH_COMMAND.replace(KEEPING, f" top={top}{KEEPING}")
        return (
            f"plan={path} keeps the search's top {layouts} of the {fit:,} that fit: give top={found} or fewer, or "
            f"search again keeping {top} (`{again}`)"
        )
    return f"plan={path} holds {layouts} that fit: give top={found} or fewer, or search a cluster where more fit"


def _wrong_question(q: Any) -> str | None:
    """What in a search's question is not what `plan search=true` writes (a hand-edited file)."""
    if not isinstance(q, dict):
        return "its question is not an object"
    if not isinstance(q.get("model"), str) or not q["model"]:
        return "its question names no model"
    if not isinstance(q.get("model_kwargs") or {}, dict):
        return f"its question's model_kwargs is {q['model_kwargs']!r}"
    return next((f"its question's {key} is {q.get(key)!r}" for key in SEARCH_SIZES if not is_whole(q.get(key))), None)


def _wrong_layout(layout: Any) -> str | None:
    from harness.plan import CHECKPOINTING  # the planner's own values, read where a plan is

    if not isinstance(layout, dict):
        return "is not an object"
    if not isinstance(layout.get("strategy"), str) or not layout["strategy"]:
        return "names no strategy"
    for key in LAYOUT_SIZES:
        if (key in layout or key not in LAYOUT_DEFAULTED) and not is_whole(layout.get(key)):
            return f"has {key}={layout.get(key)!r}"
    if not isinstance(layout.get("strategy_options", {}), dict):
        return "has strategy_options that are not an object"
    if layout.get("activation_checkpointing") not in CHECKPOINTING:
        return f"has activation_checkpointing={layout.get('activation_checkpointing')!r}"
    for key in ("tokens_per_s_per_gpu", "peak_allocated_bytes", "peak_reserved_bytes"):
        if isinstance(layout.get(key), bool) or not isinstance(layout.get(key), (int, float)):
            return f"has {key}={layout.get(key)!r}"
    return None


def plan_settings(search: dict[str, Any]) -> dict[str, Any]:
    """The compare settings every run shares, from the plan: its model (with the model_kwargs and
    model_blocks that size it: `hf:LlamaConfig` alone is another model), seq_len and global batch."""
    q = search["question"]
    model = {"model": q["model"], "model_kwargs": dict(q.get("model_kwargs") or {})}
    if q.get("model_blocks"):
        model["model_blocks"] = list(q["model_blocks"])
    return {**model, "seq_len": q["seq_len"], "batch_size": q["global_batch_sequences"]}


def check_fits_here(search: dict[str, Any]) -> None:
    """A model whose states alone outgrow this machine's memory in the one process of `single`."""
    params = (search.get("model") or {}).get("params") or 0
    needed = params * STATE_BYTES_PER_PARAM
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > memory:
        raise ConfigError(
            f"the plan's model {search['question']['model']} ({params / 1e9:.3g}B parameters) needs "
            f"{needed / 2**30:,.0f} GiB of weights, gradients and Adam states in `single`, more than this machine's "
            f"{memory / 2**30:,.0f} GiB: search a model that fits here to measure the plan's layouts"
        )


def layouts_of(search: dict[str, Any], top: int, nproc: int) -> list[PlannedLayout]:
    """The plan's `top` best layouts as they run on at most `nproc` processes here."""
    gpus = search["question"]["gpus"]
    return [_here(rank, layout, gpus, nproc) for rank, layout in enumerate(search["layouts"][:top], start=1)]


def _here(rank: int, layout: dict[str, Any], gpus: int, nproc: int) -> PlannedLayout:
    strategy, tp = layout["strategy"], layout["tp"]
    pp, cp = layout.get("pp", 1), layout.get("cp", 1)
    split = tp * pp * cp  # the ranks that share one micro-batch: kept, the data-parallel ranks scaled
    micro, accum = layout["micro_batch"], layout["grad_accum"]
    planned = {
        "rank": rank,
        "gpus": gpus,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "ep": layout.get("ep") or 1,
        "data_parallel": layout["data_parallel"],
        "micro_batch": micro,
        "grad_accum": accum,
        "checkpointing": layout["activation_checkpointing"],
        "tokens_per_s_per_gpu": layout["tokens_per_s_per_gpu"],
        "peak_allocated_bytes": layout["peak_allocated_bytes"],
        "peak_reserved_bytes": layout["peak_reserved_bytes"],
    }
    entry = PlannedLayout(
        label=f"{strategy}#{rank}",
        strategy=strategy,
        strategy_options=_pinned(strategy, layout),
        micro_batch=micro,
        grad_accum=accum,
        checkpointing=layout["activation_checkpointing"],
        nproc=gpus,
        planned=planned,
    )
    if _one_process(strategy):  # one process drives every GPU
        return replace(entry, nproc=1)
    if gpus <= nproc:
        return entry
    # Expert parallel takes ep of the data-parallel ranks, hybrid sharding shard groups of them, hpZ its
    # partitions (train refuses a size that does not divide them): fewer processes must still hold whole
    # groups, or the layout would run other groups than planned, or be refused by train after all.
    groups = (
        ("ep", layout.get("ep") or 1),
        ("shard", entry.strategy_options.get("shard_size") or 1),
        ("hpz", entry.strategy_options.get("zero_hpz_partition_size") or 1),
    )
    group = math.lcm(*(size for _, size in groups))
    fewer = [d for d in range(nproc, 0, -1) if gpus % d == 0 and d % split == 0 and (d // split) % group == 0]
    kept = " x ".join(f"{name} {size}" for name, size in (("tp", tp), ("pp", pp), ("cp", cp)) if size > 1) or "tp 1"
    if not fewer:
        sizes = (("tp", tp), ("pp", pp), ("cp", cp), *groups)
        needs, least = " x ".join(f"{name} {size}" for name, size in sizes if size > 1) or "tp 1", split * group
        return replace(
            entry,
            nproc=nproc,
            refused=f"{needs} needs {least} processes and this compare has {nproc}: give nproc={least} or more",
        )
    here = fewer[0]
    data_parallel = gpus // split
    here_data_parallel = here // split
    accum_here = accum * data_parallel // here_data_parallel
    return replace(
        entry,
        nproc=here,
        grad_accum=accum_here,
        scaled=(
            f"planned on {gpus} GPUs ({kept} x data parallel {_data_parallel_words(data_parallel, groups)}), runs on "
            f"{here} processes ({kept} x {_data_parallel_words(here_data_parallel, groups)}) with micro-batch {micro} "
            f"x accumulation {accum_here} (planned {micro} x {accum}): the same micro-batch and global batch"
        ),
    )


def _data_parallel_words(ranks: int, groups: tuple[tuple[str, int], ...]) -> str:
    """`ranks` data-parallel ranks with the groups they hold: a hybrid shard's replicas are what fewer
    processes drop (shard 4 x 2 replicas on 8, x 1 on 4), the groups themselves kept whole."""
    held = []
    for name, size in groups:
        if size > 1:
            replicas = ranks // size
            plural = "replica" if replicas == 1 else "replicas"
            held.append(f"shard {size} x {replicas} {plural}" if name == "shard" else f"{name} {size}")
    return f"{ranks}: {', '.join(held)}" if held else str(ranks)


def _pinned(strategy: str, layout: dict[str, Any]) -> dict[str, Any]:
    """The layout's strategy options with its planned tp, pp and cp set where the strategy takes
    them: a size left to its default would default to this machine's nodes and GPUs, not the plan's."""
    options = dict(layout.get("strategy_options") or {})
    try:
        takes = default_registry().get(strategy).user_options()
    except StrategyError:
        return options
    for option, dim in (("tp_size", "tp"), ("pp_size", "pp"), ("cp_size", "cp")):
        if option in takes and option not in options and dim in layout:
            options[option] = layout[dim]
    return options


def fitted_here(
    cfg: CompareConfig, layouts: list[PlannedLayout], device_type: str, usable: float | None
) -> tuple[CompareConfig, list[PlannedLayout], str | None]:
    """The compare and its layouts at micro-batches that fit this machine (fit_here.py): a layout
    whose planned micro-batch does not fit runs the largest that does, with more accumulation (in
    its `scaled` words), one that fits at none is refused; the reference (one process, the whole
    global batch) likewise, through the compare's micro_batch. Also the reference's change in words."""
    from harness.compare.compare_config import train_options
    from harness.compare.fit_here import described, largest_fitting

    if usable is None:
        return cfg, layouts, None
    shared = train_options(cfg, [])
    fitted = []
    for layout in layouts:
        if layout.refused is not None:
            fitted.append(layout)
            continue
        settings = {**shared, **layout.run_settings()}
        fit = largest_fitting(settings, layout.strategy, layout.nproc, device_type, usable)
        if not fit.fits:
            layout = replace(layout, refused=_does_not_fit(fit, layout.nproc))
        elif fit.micro_batch < layout.micro_batch:
            words = described(fit, layout.micro_batch, layout.nproc, device_type)
            scaled = "; ".join(filter(None, [layout.scaled, words]))
            layout = replace(layout, micro_batch=fit.micro_batch, grad_accum=fit.grad_accum, scaled=scaled)
        fitted.append(layout)
    reference = {**shared, "micro_batch": cfg.batch_size, "grad_accum": 1}
    fit = largest_fitting(reference, REFERENCE, 1, device_type, usable)
    if not fit.fits or fit.micro_batch == cfg.batch_size:
        return cfg, fitted, None
    note = f"{REFERENCE}: {described(fit, cfg.batch_size, 1, device_type)}"
    return replace(cfg, micro_batch=fit.micro_batch), fitted, note


def _does_not_fit(fit: Fit, processes: int) -> str:
    return (
        f"does not fit here even at micro-batch {fit.micro_batch} ({fit.needed_bytes / 2**30:.1f} GiB on {processes} "
        f"process{'es' if processes > 1 else ''} by the planner's memory model, {fit.usable_bytes / 2**30:.1f} GiB "
        "usable): measure it where more memory is"
    )


def _one_process(strategy: str) -> bool:
    try:
        return default_registry().get(strategy).one_process
    except StrategyError:
        return False


def refusal(layout: PlannedLayout, shared: dict[str, Any]) -> str | None:
    """Why `train` would refuse the layout's run here (its preflight's one line); None: it runs."""
    from harness.train import preflight

    if layout.refused is not None:
        return layout.refused
    try:
        default_registry().get(layout.strategy)
        preflight(RunConfig(**{**shared, **layout.run_settings()}, strategy=layout.strategy), layout.nproc)
    except (ConfigError, StrategyError, MeshError) as exc:
        return str(exc)
    return None


def plan_facts(path: str, search: dict[str, Any], layouts: list[PlannedLayout]) -> dict[str, Any]:
    """What compare.json records of the plan: the file, the question it answered, each layout."""
    q = search["question"]
    return {
        "file": str(Path(path).resolve()),
        "model": q["model"],
        "gpus": q["gpus"],
        "gpu": q.get("gpu"),
        "topology": q.get("topology"),
        "precision": q.get("precision"),
        "global_batch": q["global_batch_sequences"],
        "seq_len": q["seq_len"],
        "reference_fitted": search.get("reference_fitted"),
        "layouts": [asdict(layout) | {"folder": layout.folder} for layout in layouts],
    }
