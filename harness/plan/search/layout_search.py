"""The layout search (`runner.py plan search=true`): every layout the strategies allow for one
model, cluster and global batch (search_space.py), each planned as `runner.py plan` plans it
(predict.plan_backend), ranked by tokens/s among those that fit, each loser with the part of its
step that costs it most against the winner, and the frontier of speed against memory.

Every layout makes the same global batch on the same GPUs, so their step times compare term by
term: the winner's step and a loser's differ by exposed communication, compute slowed by the
collectives beside it, recomputation, the optimizer step, the host's, the backend's own work and
the rest of the compute (its micro-batch and tensor-parallel width).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any

from harness.common.units import GIB, milliseconds
from harness.plan.model.model_shape import PlanError
from harness.plan.network.comm import tensor_parallel_across_nodes
from harness.plan.network.fabric import Topology, span_words
from harness.plan.parallel.backends import Backend, backend_for, model_of
from harness.plan.parallel.layout import Layout, LayoutError, layout_of
from harness.plan.parallel.planned_options import check_priced, options_of, takes
from harness.plan.predict import Question, StrategyPlan, plan_backend, storage_precision
from harness.plan.recommendation import CHECKPOINTING_ORDER
from harness.plan.search.search_space import BatchSplit, batch_splits, layout_options, pipeline_splits
from strategies.plan_model import PlanModel

TOP = 10
SAME = 1e-3  # layouts this close in speed and memory are the same plan


@dataclass(frozen=True)
class Searched:
    """One layout of the search and its plan."""

    options: dict[str, Any]  # the layout's strategy options: the sizes searched (tp_size, ...) and those given
    micro_batch: int
    grad_accum: int
    checkpointing: str
    plan: StrategyPlan
    gpus: int
    peak_flops: float  # what MFU is against (bf16's for an fp8 run)
    flops_per_token: float

    @property
    def strategy(self) -> str:
        return self.plan.name

    @property
    def tokens_per_s_per_gpu(self) -> float:
        assert self.plan.time is not None
        return self.plan.time.tokens_per_s / self.gpus

    @property
    def mfu(self) -> float:
        return self.tokens_per_s_per_gpu * self.flops_per_token / self.peak_flops

    @property
    def peak_bytes(self) -> float:
        return self.plan.peak_bytes or 0.0

    def arguments(self) -> str:
        """The layout as `plan` arguments: pasted in place of search=true, they plan it alone at the same
        global batch (its accumulation follows from that batch and the micro-batch). A pipeline's stages and
        the context-parallel GPUs its strategy chose by default are written out: that default follows the
        nodes and GPUs a run has, so the line trains the planned layout on any machine (`train`, `compare`)."""
        layout = self.plan.layout
        chosen = {"pp_size": layout.pp, "cp_size": layout.cp}
        defaulted = {
            key: size
            for key, size in chosen.items()
            if size > 1 and key not in self.options and key in takes(self.strategy)
        }
        written = {key: _written(value) for key, value in {**self.options, **defaulted}.items()}
        options = "".join(f" strategy_options.{key}={value}" for key, value in written.items())
        return (
            f"strategies=[{self.strategy}]{options} micro_batch={self.micro_batch} "
            f"activation_checkpointing={self.checkpointing}"
        )

    def as_dict(self) -> dict[str, Any]:
        layout = self.plan.layout
        return {
            "strategy": self.strategy,
            "strategy_options": dict(self.options),
            "tp": layout.tp,
            "shard": layout.shard,
            "replicas": layout.replicas,
            "hpz": layout.hpz,
            "pp": layout.pp,
            "cp": layout.cp,
            "ep": layout.experts.ep,
            "data_parallel": layout.data_parallel,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "activation_checkpointing": self.checkpointing,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "step_s": self.plan.time.step_s if self.plan.time else None,
            "peak_allocated_bytes": self.plan.peak_bytes,
            "peak_reserved_bytes": self.plan.reserved_bytes,
            "usable_bytes": self.plan.headroom.usable,
            "fits": self.plan.fits,
        }


def _written(value: Any) -> str:
    """An option's value as a user writes it: true and false as YAML and the docs spell them."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class SearchResult:
    question: Question  # the question every layout shares (its batch split and checkpointing set per layout)
    global_batch: int  # sequences
    ranked: list[Searched]  # every layout that fits, fastest first
    too_large: list[Searched]  # planned, does not fit
    not_laid_out: dict[str, int]  # why a layout could not be planned, how many times
    # A strategy's layout that another strategy searched before it lays out alike (fsdp-pp at pp 1 is
    # fsdp-grad-op's), in words, with the strategy it is listed under: each layout is listed once.
    listed_as: dict[str, str] = field(default_factory=dict)
    # The fewest sequences any layout refused for the batch alone would take; None: none was.
    fewest_sequences: int | None = None

    @property
    def strategies(self) -> list[str]:
        """The strategies planned, in the order searched."""
        return list(dict.fromkeys(s.strategy for s in self.ranked + self.too_large))

    @property
    def planned(self) -> int:
        return len(self.ranked) + len(self.too_large)

    def frontier(self) -> list[Searched]:
        """The layouts no other beats on both speed and memory, leanest first."""
        best: list[Searched] = []
        for s in sorted(self.ranked, key=lambda s: (s.peak_bytes, -s.tokens_per_s_per_gpu)):
            if not best or s.tokens_per_s_per_gpu > (1 + SAME) * best[-1].tokens_per_s_per_gpu:
                best.append(s)
        return best


def layout_question(q: Question, options: dict[str, Any], micro_batch: int, grad_accum: int, mode: str) -> Question:
    """`q` as one layout of the search asks it: its sizes, split and checkpointing, the batch fixed."""
    return replace(
        q,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        checkpointing=mode,
        strategy_options=options,
        global_batch=None,
        split_global_batch=False,
        nearest_split=False,
    )


def search(
    q: Question,
    names: list[str],
    global_batch: int,
    time_fitting_only: bool = False,
    modes: tuple[str, ...] = CHECKPOINTING_ORDER,
) -> SearchResult:
    """Plan every layout of `names` that makes `global_batch` sequences on `q`'s cluster, under each
    checkpointing mode of `modes` (a subsequence of CHECKPOINTING_ORDER: the question asked for one).

    `time_fitting_only`: for a search after what would fit, where most layouts do not (what_fits.py).
    Each layout's memory is planned first and its step time only where it fits, so the layouts in
    `too_large` carry no time. Its batch splits are tried smallest micro-batch first and each split's
    checkpointing modes leanest first; what keeps more than a layout that does not fit is not planned
    (it needs more memory still): the modes after one that does not fit, and the splits after one whose
    leanest mode does not, and an interleaved pipeline whose 1F1B twin fits nowhere (interleaving holds at
    least 1F1B's micro-batches in flight). So `too_large` holds the leanest that does not fit, not every one."""
    if q.gpu is None:
        raise PlanError(
            "search=true ranks layouts by speed: give a known gpu=, or gpu_mem_gb=, peak_tflops= and hbm_tb_s="
        )
    peak_flops = q.gpu.peak_flops[storage_precision(q.precision)]
    flops_per_token = q.shape.flops_per_token(q.seq_len)
    fitting: list[Searched] = []
    too_large: list[Searched] = []
    not_laid_out: Counter[str] = Counter()
    first_of: dict[tuple, str] = {}  # each layout searched (_layout_key) -> the strategy it is listed under
    listed_as: dict[str, str] = {}
    fewest: int | None = None  # the fewest sequences a layout refused for its batch takes
    misfits: set[tuple] = set()  # with time_fitting_only: the 1F1B layouts none of whose splits fits
    experts = q.shape.dims.moe.experts if q.shape.dims and q.shape.dims.moe else None
    for name in names:
        model = model_of(name)
        assert model is not None
        if model.expert_parallel and experts is None:
            continue  # a dense model has no experts to lay out (plan_all leaves them out alike)
        layers = q.shape.dims.layers if q.shape.dims else None
        fixed = options_of(name, q.strategy_options)
        try:
            check_priced(name, fixed)
        except LayoutError as exc:
            not_laid_out[str(exc)] += 1
            continue
        t = q.topology
        laid_out = layout_options(
            model, q.gpus, t.per_node, fixed, layers, q.seq_len, takes(name), experts, per_domain=t.per_domain
        )
        for sizes in laid_out:
            options = {**fixed, **sizes}
            try:
                # Built once per layout: the batch split and checkpointing do not change the backend.
                backend = backend_for(name, q.shape, storage_precision(q.precision), q.gpus, options)
                layout = layout_of(backend, q.shape, q.topology)
            except LayoutError as exc:
                not_laid_out[str(exc)] += 1
                continue
            key = _layout_key(backend, layout, options)
            if first_of.setdefault(key, name) != name:
                listed_as[f"{name} at {_dims(layout)}"] = first_of[key]
                continue
            if time_fitting_only and _one_f_one_b_twin(name, options) in misfits:
                continue  # interleaving holds at least its 1F1B twin's micro-batches in flight: it cannot fit either
            splits = _splits(global_batch, layout, backend, fixed, sizes)
            if not splits:
                least = _fewest_sequences(layout, backend, fixed, sizes)
                if least is not None:
                    fewest = least if fewest is None else min(fewest, least)
                not_laid_out[
                    f"the batch of {global_batch} sequences does not divide over {layout.data_parallel} "
                    "data-parallel ranks" + (f" into micro-batches for {layout.pp} stages" if layout.pp > 1 else "")
                ] += 1
                continue
            if time_fitting_only:  # leanest first: a split whose leanest mode does not fit ends the layout's
                splits.sort(key=lambda split_laid: _sequences_per_micro_batch(*split_laid))
            fits_any = False
            for split, laid in splits:
                split_backend = replace(backend, options={**backend.options, **laid})
                leanest_fits = True
                for mode in reversed(modes) if time_fitting_only else modes:
                    asked = layout_question(q, {**fixed, **laid}, split.micro_batch, split.grad_accum, mode)
                    try:
                        plan = plan_backend(split_backend, replace(asked, timed=False) if time_fitting_only else asked)
                        if time_fitting_only and plan.fits is not False:
                            plan = plan_backend(split_backend, asked)
                    except PlanError as exc:  # a layout's, or a mode the model or recipe refuses (selective
                        not_laid_out[str(exc)] += 1  # without transformer layers): the other modes still rank
                        continue
                    found = Searched(
                        {**options, **laid},
                        split.micro_batch,
                        split.grad_accum,
                        mode,
                        plan,
                        q.gpus,
                        peak_flops,
                        flops_per_token,
                    )
                    (too_large if plan.fits is False else fitting).append(found)
                    fits_any = fits_any or plan.fits is not False
                    if time_fitting_only and plan.fits is False:
                        leanest_fits = mode != modes[-1]
                        break
                if not leanest_fits:
                    break
            if time_fitting_only and not fits_any and options.get("schedule") == "1f1b":
                misfits.add(_one_f_one_b_twin(name, options))
    fitting.sort(key=lambda s: (-s.tokens_per_s_per_gpu, s.peak_bytes))
    return SearchResult(q, global_batch, fitting, too_large, dict(not_laid_out), listed_as, fewest)


def _splits(
    global_batch: int, layout: Layout, backend: Backend, fixed: dict[str, Any], sizes: dict[str, Any]
) -> list[tuple[BatchSplit, dict[str, Any]]]:
    """How `layout` makes `global_batch` sequences, each split with the options it runs under."""
    if layout.pp == 1:
        return [(split, sizes) for split in batch_splits(global_batch, layout.data_parallel)]
    schedule = str(backend.options.get("schedule") or "1f1b")
    pipelined = pipeline_splits(global_batch, layout.data_parallel, layout.pp, schedule, fixed.get("microbatches"))
    return [(split, {**sizes, "microbatches": m}) for split, m in pipelined]


def _one_f_one_b_twin(name: str, options: dict[str, Any]) -> tuple:
    """What names a pipelined layout's 1F1B twin: `name` and its options but the schedule, which for an
    interleaved layout is enumerated after it (search_space._split_sizes)."""
    return name, tuple(sorted((k, repr(v)) for k, v in options.items() if k != "schedule"))


def _sequences_per_micro_batch(split: BatchSplit, laid: dict[str, Any]) -> int:
    """The sequences each forward of `split` takes: its micro-batch, or with a pipeline its share of the
    rank's batch per pipeline micro-batch (what a layout's activations grow with)."""
    return split.micro_batch // int(laid.get("microbatches") or 1)


def _fewest_sequences(layout: Layout, backend: Backend, fixed: dict[str, Any], sizes: dict[str, Any]) -> int | None:
    """The smallest global batch `layout` can split: a multiple of its data-parallel ranks that also makes
    a pipeline's micro-batches (as many as its stages, or the micro-batches given); None where none does."""
    rounds = layout.pp * max(1, int(fixed.get("microbatches") or 1))
    batches = (k * layout.data_parallel for k in range(1, rounds + 1))
    return next((b for b in batches if _splits(b, layout, backend, fixed, sizes)), None)


# The options a Layout's dimensions already say (two strategies reaching one tp by default and by option are alike).
LAYOUT_SIZES = ("tp_size", "pp_size", "cp_size", "shard_size", "zero_hpz_partition_size", "ep_size")


def _layout_key(backend: Backend, layout: Layout, options: dict[str, Any]) -> tuple:
    """What makes two searched layouts one: the planner's model of the strategy (its pipeline or
    context-parallel engine only where that dimension is above 1: fsdp-pp at pp 1 is fsdp-grad-op,
    zero1-pp at pp 1 zero1), the layout's dimensions and the options given beyond them."""
    model = {f.name: getattr(backend, f.name) for f in fields(PlanModel)}
    model["pipeline_engine"] = model["pipeline_engine"] and layout.pp > 1
    model["context_parallel_engine"] = model["context_parallel_engine"] and layout.cp > 1
    dims = (layout.tp, layout.shard, layout.replicas, layout.hpz, layout.pp, layout.cp, layout.experts.ep)
    rest = tuple(sorted((k, repr(v)) for k, v in options.items() if k not in LAYOUT_SIZES))
    return tuple(sorted(model.items())), dims, rest


def _dims(layout: Layout) -> str:
    """A layout's dimensions in words: 'pp 1', 'tp 2 x pp 4'."""
    sizes = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.experts.ep}
    above = [f"{k} {v}" for k, v in sizes.items() if v > 1]
    return " x ".join(above) or "tp 1, pp 1, cp 1"


# The terms of a step, by the short name the table gives them.
TERMS = {
    "exposed comm": "exposed communication",
    "contention": "compute slowed by the collectives beside it",
    "recompute": "recomputation",
    "optimizer": "optimizer step",
    "host step": "host optimizer step and copies",
    "overhead": "backend's own work",
    "host wait": "the GPU waiting on its host to issue kernels",
    "bubble": "the pipeline's bubble",
    "imbalance": "the busiest GPU's expert tokens beyond an even share (moe_imbalance)",
    "stragglers": "waiting on the slowest GPU's compute",
    "compute": "compute",
}


def step_terms(s: Searched, compute_scale: float) -> dict[str, float]:
    """A layout's step, in seconds, by what it spends them on (TERMS)."""
    t = s.plan.time
    assert t is not None
    # A pipeline's work is per pipeline micro-batch: each micro-step runs `microbatches` of them.
    micro_steps = s.grad_accum * (int(s.options.get("microbatches", 1)) if s.plan.layout.pp > 1 else 1)
    recompute = micro_steps * t.work.recompute_s * compute_scale if t.work else 0.0
    optimizer = t.work.optimizer_s * compute_scale if t.work else 0.0
    imbalance = micro_steps * t.work.expert_imbalance_s * compute_scale if t.work else 0.0
    return {
        "exposed comm": t.exposed_comm_s,
        "contention": t.contention_s,
        "recompute": recompute,
        "optimizer": optimizer,
        "host step": t.offload_step_s,
        "overhead": t.overhead_s,
        "host wait": t.host_wait_s,
        "bubble": t.bubble_s,
        "imbalance": imbalance,
        "stragglers": t.straggler_s,
        "compute": t.compute_s - recompute - optimizer - imbalance,
    }


def _slowest_collective(s: Searched, best: Searched, topology: Topology | None) -> str:
    t, b = s.plan.time, best.plan.time
    assert t is not None and b is not None
    every = t.recurring_comm_s - b.recurring_comm_s
    across = tensor_parallel_across_nodes(s.plan.collectives)
    if every > (t.exposed_comm_s - b.exposed_comm_s) / 2:  # mostly what each micro-step waits on
        names = [c.what for c in s.plan.collectives if c.per_micro_step and (c.window is None or "pipeline" in c.what)]
        return (
            f" ({milliseconds(t.recurring_comm_s)} ms in every micro-batch's path: {'; '.join(dict.fromkeys(names))}"
            f"{'; ' + across if across else ''})"
        )
    comms = [c for c in s.plan.collectives if c.kind != "host-copy"]
    if not comms:
        return ""
    c = max(comms, key=lambda c: (c.group.nodes, c.wire_bytes()))
    return f" ({c.what} over {c.group.size} GPUs on {span_words(c.group, topology)}{'; ' + across if across else ''})"


def fastest_tp_across_nodes(ranked: list[Searched], shown: list[Searched]) -> Searched | None:
    """The fastest layout that fits with a tensor-parallel group wider than an NVLink domain, where
    none of those shown has one: what tensor parallelism across nodes would give."""
    if any(s.plan.layout.tp_group.nodes > 1 for s in shown):
        return None
    return next((s for s in ranked if s.plan.layout.tp_group.nodes > 1), None)


def _shape(s: Searched) -> str:
    return f"micro-batch {s.micro_batch} x {s.grad_accum}, tp {s.plan.layout.tp}"


@dataclass(frozen=True)
class Loss:
    """Why a layout is slower than the winner: by how much, and the term of its step that costs it most."""

    slower: float  # how much slower than the winner: the winner's tokens/s over its own, less 1 (may pass 1)
    term: str | None  # a key of TERMS; None: no term costs it more (it does more work per token)
    seconds: float  # what that term costs it per step beyond the winner's
    detail: str = ""

    @property
    def short(self) -> str:
        return f"-{self.slower:.1%} {self.term or 'work'}"

    def describe(self) -> str:
        if self.term is None:
            return f"{self.slower:.1%} slower: more work per token"
        what = "compute at a smaller micro-batch" if self.term == "micro-batch" else TERMS[self.term]
        return f"{self.slower:.1%} slower: +{milliseconds(self.seconds)} ms of {what} per step{self.detail}"


def why_slower(s: Searched, best: Searched, compute_scale: float, topology: Topology | None = None) -> Loss:
    """How much slower `s` is than `best`, and the term of its step that costs it most (the network's
    units in `topology`'s words: nodes, or NVLink domains where one holds several hosts)."""
    mine, theirs = step_terms(s, compute_scale), step_terms(best, compute_scale)
    extra = {term: mine[term] - theirs[term] for term in mine}
    term = max(extra, key=lambda k: extra[k])
    slower = max(0.0, best.tokens_per_s_per_gpu / s.tokens_per_s_per_gpu - 1)
    if extra[term] <= 0:
        return Loss(slower, None, 0.0)
    detail = ""
    if term == "exposed comm":
        detail = _slowest_collective(s, best, topology)
    elif term == "overhead" and s.plan.time and s.plan.time.overhead_what:
        detail = f" ({s.plan.time.overhead_what})"
    elif term == "bubble" and s.plan.time:
        detail = f" ({s.plan.time.bubble_what})"
    elif term == "recompute":
        detail = f" (checkpointing {s.checkpointing} against {best.checkpointing})"
    elif term == "compute":
        detail = f" ({_shape(s)} against {_shape(best)})"
        # The slowest stage's excess beyond #1's: a part of the extra compute, never more than the whole.
        uneven = s.plan.time.imbalance_s - best.plan.time.imbalance_s if s.plan.time and best.plan.time else 0.0
        if uneven > extra[term] / 4:
            detail = (
                f" ({milliseconds(min(uneven, extra[term]))} ms of it the slowest pipeline stage's beyond an even "
                "share: the head and loss, uneven blocks)"
            )
        if s.micro_batch < best.micro_batch and s.plan.layout.tp == best.plan.layout.tp:
            return Loss(slower, "micro-batch", extra[term], detail)
    return Loss(slower, term, extra[term], detail)


def _same_layout(a: Searched, b: Searched) -> bool:
    """Two strategies that plan one layout alike (accelerate-zero3 and zero3): within 0.1% in speed and memory."""
    la, lb = a.plan.layout, b.plan.layout
    return (
        (la.tp, la.shard, la.hpz, la.pp, la.cp, la.experts.ep, a.micro_batch, a.grad_accum, a.checkpointing)
        == (lb.tp, lb.shard, lb.hpz, lb.pp, lb.cp, lb.experts.ep, b.micro_batch, b.grad_accum, b.checkpointing)
        and abs(a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1) < SAME
        and abs(a.peak_bytes - b.peak_bytes) <= SAME * max(a.peak_bytes, b.peak_bytes)
    )


def distinct(ranked: list[Searched], count: int) -> list[tuple[Searched, list[str]]]:
    """The first `count` layouts of `ranked`, each with the strategies that plan it alike folded into it."""
    shown: list[tuple[Searched, list[str]]] = []
    for s in ranked:
        twin = next((names for first, names in shown if _same_layout(first, s)), None)
        if twin is not None:
            twin.append(s.strategy)
        elif len(shown) < count:
            shown.append((s, []))
    return shown


def largest_part(s: Searched) -> tuple[str, float]:
    """The largest thing a layout holds on each GPU at its peak."""
    parts = {{"optimizer": "optimizer state"}.get(c, c): b for c, b in s.plan.states_on().items()}
    if s.plan.activations:
        parts["activations"] = s.plan.activations.total
    name = max(parts, key=lambda k: parts[k])
    return name, parts[name]


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"
