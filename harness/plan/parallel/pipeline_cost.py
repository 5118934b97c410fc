"""Pipeline parallelism as the planner prices it: the model cut at block boundaries into pp_size
stages, each stage's micro-batches run by a schedule, FSDP2 inside each stage (torchtitan's
composition: `fully_shard` over the stage's data-parallel ranks, parameters kept gathered between
micro-batches).

Per schedule, with p stages, m micro-batches and v virtual stages a GPU:

| schedule | bubble (idle share of the ideal compute) | micro-batches in flight, first stage |
|---|---|---|
| gpipe | (p-1)/m: GPipe (Huang et al. 2019), 2.2 | m: all forwards first |
| 1f1b | (p-1)/m: Megatron-LM (Narayanan et al. 2021), 2.2.1 | min(p, m) |
| interleaved-1f1b | (p-1)/(v m): the same, 2.2.2 | Megatron's warm-up: 2(p-1) + (v-1)p + 1 chunks of 1/v |
| zero-bubble | 0 with m >= p, else (p-1)/m: ZB-H2 (Qi et al. 2023) | min(m, 2p-1): ZB-H2's peak |

Between stages each micro-batch sends its activations forward and their gradients back: micro-batch
x sequence x width elements in the compute dtype, split over the tensor-parallel ranks (sequence
parallel), on NVLink where the two stages share a node and on the network where they do not.
GPipe and the looped schedules send asynchronously, so their steady state hides them; 1F1B waits
on its exchanges every micro-batch (`Pipeline.steady_exchange_wait`); the fill and the drain cross
the p v - 1 boundaries one after another, in the critical path.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace

from harness.plan.model.model_shape import ModelShape, ParamTensor
from harness.plan.parallel.layout import LayoutError
from models.stage_split import blocks_per_stage
from strategies.mesh_layout import MeshError
from strategies.parallel_dims import microbatch_count, pipeline_microbatches

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
# torchtitan's looped schedules run two stages a GPU unless told otherwise.
# torch's ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble, as fsdp-pp runs them, hold two
# stages a GPU.
DEFAULT_VIRTUAL_STAGES = {"interleaved-1f1b": 2, "zero-bubble": 2}
LOOPED = ("interleaved-1f1b", "zero-bubble")


@dataclass(frozen=True)
class Pipeline:
    stages: int  # pp_size: GPUs a micro-batch crosses
    microbatches: int  # m: micro-batches each schedule runs
    schedule: str
    virtual: int = 1  # stages each GPU holds (interleaved)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise LayoutError(
                f"schedule={self.schedule!r} is not a pipeline schedule: use one of {', '.join(SCHEDULES)}"
            )
        if self.schedule in LOOPED and self.virtual > 1 and self.microbatches % self.stages:
            raise LayoutError(
                f"{self.schedule} runs micro-batches in groups of pp_size={self.stages}: microbatches="
                f"{self.microbatches} is not a multiple of it (Megatron-LM's condition)"
            )

    @property
    def bubble(self) -> float:
        """Idle time over the ideal compute of the m micro-batches."""
        p, m = self.stages, self.microbatches
        if p <= 1:
            return 0.0
        if self.schedule == "interleaved-1f1b":
            return (p - 1) / (self.virtual * m)
        if self.schedule == "zero-bubble" and m >= p:
            return 0.0
        return (p - 1) / m

    @property
    def in_flight(self) -> float:
        """Micro-batches whose activations the first stage holds at once, in whole stages' worth."""
        return self.in_flight_at(0)

    def in_flight_at(self, rank: int) -> float:
        """Micro-batches whose activations pipeline rank `rank` holds at once, in whole stages'
        worth: the forwards it runs before its first backward, and the one that backward is of.
        1F1B: p - rank warm-up forwards at most (Megatron-LM's get_forward_backward_func,
        `num_warmup_microbatches = pipeline_parallel_size - rank - 1`, plus the one in steady
        state); interleaved: (p - rank - 1) 2 + (v - 1) p chunks of 1/v, plus one (Megatron-LM's
        interleaved schedule); GPipe: every micro-batch on every rank. ZB-H2's peak of 2p - 1
        is the first rank's; the others are planned at it too, their warm-up not being stated."""
        p, m, v = self.stages, self.microbatches, self.virtual
        if self.schedule == "gpipe":
            return float(m)
        if self.schedule == "interleaved-1f1b":
            return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1) / v
        if self.schedule == "zero-bubble":
            return float(min(m, 2 * p - 1))
        return float(min(p - rank, m))

    @property
    def steady_state_exposed(self) -> bool:
        """Whether each steady-state micro-batch waits on its sends: 1F1B exchanges activations and
        gradients with its neighbours between a forward and a backward and blocks on them
        (Megatron-LM's `send_forward_recv_backward`, which refuses `overlap_p2p_comm` outside the
        interleaved schedule; torch's Schedule1F1B waits on each batched send and receive); GPipe
        and the looped schedules post them asynchronously and run the next chunk beside them
        (Megatron-LM's interleaved schedule with `overlap_p2p_comm`, its default)."""
        return self.stages > 1 and self.schedule == "1f1b"

    def idle_share(self, stage_seconds: tuple[float, float, float] | None) -> float:
        """The share of `bubble` the slowest GPU idles where the stages' work differs (`stage_seconds`:
        a micro-batch's compute on the first GPU, each between and the last). The first micro-batch
        reaches it after the forwards of the GPUs before it and the last leaves after the forwards
        and backwards of those after it and the backwards of those before: the fill and the drain
        are the other GPUs' work of one micro-batch, which `bubble` counts as p - 1 of the slowest's.
        1 where the split is not known."""
        if stage_seconds is None or self.stages <= 1:
            return 1.0
        first, middle, last = stage_seconds
        work = [first, *[middle] * (self.stages - 2), last]
        slowest = max(work)
        return (sum(work) - slowest) / ((self.stages - 1) * slowest) if slowest > 0 else 1.0

    def steady_exchange_wait(self, stage_seconds: tuple[float, float, float] | None, exchange_s: float) -> float:
        """Seconds each steady-state 1F1B micro-batch adds to the slowest stage's compute for its
        exchanges (`steady_state_exposed`), `exchange_s` one send each way between two neighbours.
        Megatron-LM's `send_forward_recv_backward` and `send_backward_recv_forward`
        (megatron/core/pipeline_parallel/p2p_communication.py) each batch a send and a receive with
        one neighbour (`batch_isend_irecv`), opposite ways on a full-duplex link: one exchange. The
        first stage has no previous neighbour and the last no next, so each of them waits on one
        exchange a micro-batch and a GPU between two others on two (torch's Schedule1F1B batches its
        forward sends with its backward receives alike). The steady state moves at the slowest GPU's
        pace, its compute and its exchanges: `stage_seconds` (first, between, last; a micro-batch's
        compute on each) where the split is known, else every GPU as the fullest."""
        exchanges = (1, 2 if self.stages > 2 else 0, 1)
        if stage_seconds is None:
            return max(exchanges) * exchange_s
        paced = max(c + n * exchange_s for c, n in zip(stage_seconds, exchanges, strict=True))
        return paced - max(stage_seconds)

    @property
    def boundaries(self) -> int:
        """Stage boundaries a micro-batch crosses (the virtual stages wrap round the GPUs)."""
        return self.stages * self.virtual - 1


# Whose pipeline a layout runs, where it is one of parabench's strategies: its runtime's rules hold.
TORCH_RUNTIME, DEEPSPEED_RUNTIME = "torch", "deepspeed"


def pipeline_of(options: dict, micro_batch: int, stages: int, runtime: str | None = None) -> Pipeline:
    """A pipeline of `stages` (the layout's pp) as the strategy's options run it (microbatches,
    schedule, virtual_stages). Without microbatches, a published run's: torchtitan's default, as
    many as stages where they divide the local batch, else one sequence each. `runtime`: one of
    parabench's strategies, held to what its runtime runs: as many micro-batches as stages by
    default, which must divide the local batch; under torch's schedules the check `train` runs
    (parallel_dims.pipeline_microbatches: 1F1B at least one a stage, the looped schedules whole
    rounds of them); DeepSpeed's engine (zero1_pp.py) runs fewer."""
    schedule = str(options.get("schedule") or "1f1b").lower()
    given = options.get("microbatches")
    if runtime is not None:  # the very check train runs
        try:
            if runtime == TORCH_RUNTIME and schedule in SCHEDULES:
                microbatches = pipeline_microbatches(stages, schedule, given, micro_batch)
            else:  # DeepSpeed's engine runs fewer than the stages too
                microbatches = microbatch_count(stages, given, micro_batch)
        except MeshError as exc:
            raise LayoutError(str(exc)) from None
    else:
        microbatches = int(given or (stages if micro_batch % stages == 0 else micro_batch))
        if microbatches < 1 or micro_batch % microbatches:
            raise LayoutError(
                f"strategy_options.microbatches={microbatches} does not divide the micro-batch of {micro_batch} "
                "sequences each pipeline step runs: set micro_batch= to a multiple of it"
            )
    virtual = int(options.get("virtual_stages") or DEFAULT_VIRTUAL_STAGES.get(schedule, 1))
    if virtual < 1 or (virtual > 1 and schedule not in LOOPED):
        raise LayoutError(f"virtual_stages={virtual}: only {' and '.join(LOOPED)} run more than one stage a GPU")
    return Pipeline(stages, microbatches, schedule, virtual)


def stage_layers(layers: int, pipe: Pipeline) -> int:
    """Blocks on the fullest stage where the split is not known: the blocks cut as evenly as the
    stages allow, the fullest GPU taking one more on each of its virtual stages."""
    _check_chunks(layers, pipe)
    return math.ceil(layers / (pipe.stages * pipe.virtual)) * pipe.virtual


def _check_chunks(layers: int, pipe: Pipeline) -> None:
    if layers < pipe.stages * pipe.virtual:
        raise LayoutError(
            f"pp_size={pipe.stages} x {pipe.virtual} virtual stages is more stages than the {layers} blocks"
        )


# Megatron-LM's uneven pipeline splits (megatron/core/transformer/transformer_block.py
# get_num_layers_to_build): the embedding and the loss each counted as a layer of the split
# (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split), or the first and
# the last stage given their own number of blocks (--decoder-first-pipeline-num-layers,
# --decoder-last-pipeline-num-layers). The options a published Megatron run's layout sets.
EMBEDDING_IN_SPLIT = "embedding_in_pipeline_split"
LOSS_IN_SPLIT = "loss_in_pipeline_split"
FIRST_STAGE_BLOCKS = "first_pipeline_layers"
LAST_STAGE_BLOCKS = "last_pipeline_layers"
MEGATRON_SPLIT_OPTIONS = (EMBEDDING_IN_SPLIT, LOSS_IN_SPLIT, FIRST_STAGE_BLOCKS, LAST_STAGE_BLOCKS)


@dataclass(frozen=True)
class StageSplit:
    """Blocks each kind of GPU of a pipeline holds over its virtual stages: the first (beside the
    embedding), the fullest of those between (0 with two stages), the last (beside the head and loss)."""

    first: int
    middle: int
    last: int

    @property
    def fullest(self) -> int:
        return max(self.first, self.middle, self.last)

    @classmethod
    def of(cls, per_gpu: list[int]) -> StageSplit:
        return cls(per_gpu[0], max(per_gpu[1:-1], default=0), per_gpu[-1])


def stage_split(
    layers: int, pipe: Pipeline, options: dict, runtime_cut: bool, deepspeed_cut: bool = False
) -> StageSplit:
    """The blocks on each GPU: DeepSpeed's PipelineModule's cut (`deepspeed_cut`: deepspeed_split);
    Megatron-LM's split where the options name one of its uneven splits (MEGATRON_SPLIT_OPTIONS);
    parabench's runtime's (`runtime_cut`: models/stage_split.py's cut of the blocks into pp x v
    stages, rank r holding stages r, r + pp, ...); else, the split not known, every GPU planned as
    the fullest (stage_layers)."""
    if deepspeed_cut:
        return deepspeed_split(layers, pipe, counted=bool(options.get(EMBEDDING_IN_SPLIT)))
    if any(options.get(k) for k in MEGATRON_SPLIT_OPTIONS):
        return megatron_split(layers, pipe, options)
    if runtime_cut:
        _check_chunks(layers, pipe)
        counts = [len(r) for r in blocks_per_stage(layers, pipe.stages * pipe.virtual)]
        return StageSplit.of([sum(counts[rank :: pipe.stages]) for rank in range(pipe.stages)])
    fullest = stage_layers(layers, pipe)
    return StageSplit(fullest, fullest, fullest)


def megatron_split(layers: int, pipe: Pipeline, options: dict) -> StageSplit:
    """Megatron-LM's get_num_layers_to_build, its assertions as one-line errors: with the embedding
    and loss counted, (blocks + 1 + 1) / pp a GPU, each GPU's share cut into v equal virtual stages,
    the first GPU's first virtual stage one block short (the embedding), the last GPU's last one
    block short (the loss); with the first or last stage's blocks given, the rest cut evenly over
    the stages between."""
    p, v = pipe.stages, pipe.virtual
    embedding, loss = bool(options.get(EMBEDDING_IN_SPLIT)), bool(options.get(LOSS_IN_SPLIT))
    first, last = options.get(FIRST_STAGE_BLOCKS), options.get(LAST_STAGE_BLOCKS)
    if first is not None or last is not None:
        if embedding or loss:
            raise LayoutError(
                f"{FIRST_STAGE_BLOCKS}/{LAST_STAGE_BLOCKS} with the embedding or loss in the pipeline split: "
                "Megatron-LM takes one or the other"
            )
        given = [int(n) for n in (first, last) if n is not None]
        rest, between = layers - sum(given), p - len(given)
        if rest < 0 or (between > 0 and rest % between):
            raise LayoutError(
                f"{rest} blocks left by the first and last stages do not divide over the {between} stages between: "
                "Megatron-LM needs them to"
            )
        per_gpu = [rest // between if between > 0 else 0] * p
        if first is not None:
            per_gpu[0] = int(first)
        if last is not None:
            per_gpu[-1] = int(last)
        if v > 1 and any(n % v for n in per_gpu):
            raise LayoutError(f"blocks a GPU {per_gpu} do not divide into {v} virtual stages: Megatron-LM needs it")
        return StageSplit.of(per_gpu)
    units = layers + embedding + loss
    counted = " and ".join(w for w, on in (("the embedding", embedding), ("the loss", loss)) if on)
    if units < p * v or units % p or (units // p) % v:
        raise LayoutError(
            f"{layers} blocks with {counted} counted as layers ({units}) do not divide into pp_size={p} x {v} "
            "virtual stages: Megatron-LM needs them to"
        )
    per_gpu = [units // p] * p
    per_gpu[0] -= embedding
    per_gpu[-1] -= loss
    return StageSplit.of(per_gpu)


BALANCE_EPS = 1e-3  # partition_balanced's default tolerance on the heaviest part's weight


def deepspeed_split(layers: int, pipe: Pipeline, counted: bool) -> StageSplit:
    """DeepSpeed's PipelineModule cut of a Megatron-DeepSpeed GPT (GPTModelPipe's partition_method
    `type:transformer`, deepspeed/runtime/pipe/module.py `_partition_layers` and
    deepspeed/runtime/utils.py `partition_balanced` @ v0.5.10): each block weighs one, the
    embedding and the tied head nothing, or one each where the run counts them (`counted`:
    `--pp-partition-method 'type:transformer|embedding'`, written as the embedding and the loss in
    the split). The smallest heaviest part is searched, then the parts are filled in order up to it,
    the last taking what is left: 78 blocks over 12 stages are eleven of 7 and a last of 1."""
    if pipe.virtual > 1:
        raise LayoutError("DeepSpeed's pipeline engine runs one stage a GPU: no virtual stages")
    _check_chunks(layers, pipe)
    end = float(counted)
    prefix = list(itertools.accumulate([end] + [1.0] * layers + [end]))
    lower, upper = prefix[-1] / pipe.stages, prefix[-1]
    while upper > lower + BALANCE_EPS:
        mid = lower + (upper - lower) / 2
        if _balanced_parts(prefix, pipe.stages, mid)[1]:
            upper = mid
        else:
            lower = mid + BALANCE_EPS
    parts, fits = _balanced_parts(prefix, pipe.stages, upper)
    assert fits
    # unit i (0: the embedding, 1..layers: the blocks, layers + 1: the head) sits on part p where
    # parts[p] <= i < parts[p + 1]
    per_gpu = [sum(1 for i in range(lo, hi) if 1 <= i <= layers) for lo, hi in itertools.pairwise(parts)]
    return StageSplit.of(per_gpu)


def _balanced_parts(prefix: list[float], parts: int, bottleneck: float) -> tuple[list[int], bool]:
    """DeepSpeed's `_lprobe`: the parts' first units filled in order up to `bottleneck` each, and
    whether the last part fits under it too."""
    items, total = len(prefix), prefix[-1]
    bounds = [0] + [items] * parts
    target = bottleneck
    chunk = items // parts
    step = chunk
    for p in range(1, parts):
        while step < items and prefix[step] < target:
            step += chunk
        bounds[p] = bisect.bisect_left(prefix, target, lo=step - chunk, hi=min(step, items))
        if bounds[p] == items:
            return bounds, total - prefix[bounds[p - 1]] < bottleneck
        target = prefix[bounds[p] - 1] + bottleneck
    return bounds, target >= total


_STAGES: dict[tuple[int, int, str], tuple[ModelShape, ModelShape]] = {}
STAGES_KEPT = 64  # stage shapes a process keeps: a search plans a few per pp for each of a few models
POSITIONS = ("first", "middle", "last")


def stage_shape(shape: ModelShape, layers: int, position: str = "") -> ModelShape:
    """_stage_shape (`position` empty) or _held_stage_shape, kept: a search plans each stage for
    every split and checkpointing."""
    key = (id(shape), layers, position)
    if key in _STAGES and _STAGES[key][0] is shape:
        return _STAGES[key][1]
    if len(_STAGES) >= STAGES_KEPT:
        _STAGES.clear()
    stage = _held_stage_shape(shape, layers, position) if position else _stage_shape(shape, layers)
    _STAGES[key] = (shape, stage)
    return stage


def _held_stage_shape(shape: ModelShape, layers: int, position: str) -> ModelShape:
    """What one GPU of a pipeline holds as a model of its own, for its memory: `layers` blocks and,
    on the first GPU, the tensors model.parameters() lists before the first block (the embedding,
    position embeddings), on the last those after the last block (the final norm, the head), with a
    copy of the embedding's table where the head is tied to it (Megatron-LM's
    `shared_embedding_or_output_weight` on the last stage, DeepSpeed's TiedLayerSpec); a GPU
    between holds blocks alone."""
    if position not in POSITIONS:
        raise ValueError(f"pipeline position {position!r}: one of {', '.join(POSITIONS)}")
    stage = _stage_shape(shape, layers)
    assert shape.dims is not None and stage.dims is not None
    table = shape.dims.vocab * shape.dims.width
    tied = tied_head(shape)
    if shape.tensors is None:
        blocks = stage.params - (shape.root_params() - (0 if tied else table))
        root = {"first": table, "middle": 0, "last": shape.root_params() - (0 if tied else table)}[position]
        params, tensors = blocks + root, None
    else:
        placed = [i for i, t in enumerate(shape.tensors) if t.block is not None]
        before, after = (placed[0], placed[-1]) if placed else (len(shape.tensors), -1)
        kept = []
        for i, t in enumerate(shape.tensors):
            if t.block is not None:
                if t.block < layers:
                    kept.append(t)
            elif (position == "first" and i < before) or (position == "last" and i > after):
                kept.append(t)
        if position == "last" and tied:
            kept += [t for t in shape.tensors if t.block is None and t.numel == table]
        tensors = tuple(kept)
        params = sum(t.numel for t in tensors)
    modules = None if shape.param_modules is None else max(1, round(shape.param_modules * params / shape.params))
    return replace(
        stage,
        name=f"{shape.name} ({position} stage of {layers} blocks)",
        params=params,
        flops_params=min(stage.flops_params, params),
        tensors=tensors,
        param_modules=modules,
    )


def _stage_shape(shape: ModelShape, layers: int) -> ModelShape:
    """The fullest stage as a model of its own: its blocks, with the head and loss (last stage) and
    the embedding's lookup (first stage) both on it, so it is the heaviest stage in memory and in
    time. Of an untied embedding and head, whose tables are the same size, it holds one: the first
    stage holds the embedding's, the last the head's, never both (a tied one is a copy on each)."""
    if shape.dims is None:
        raise LayoutError("pipeline parallelism needs a transformer the planner knows the layers of")
    moe = shape.dims.moe.for_blocks(layers) if shape.dims.moe is not None else None
    dims = replace(shape.dims, layers=layers, moe=moe)
    table = shape.dims.vocab * shape.dims.width
    if shape.tensors is None:
        per_block = (shape.params - shape.root_params()) // shape.dims.layers
        untied = shape.root_params() >= 2 * table
        params = shape.root_params() - (table if untied else 0) + layers * per_block
        tensors = None
    else:
        tables = [i for i, t in enumerate(shape.tensors) if t.block is None and t.numel == table]
        embedding = tables[0] if len(tables) >= 2 else None
        kept: tuple[ParamTensor, ...] = tuple(
            t
            for i, t in enumerate(shape.tensors)
            if (t.block is None and i != embedding) or (t.block is not None and t.block < layers)
        )
        tensors = kept
        params = sum(t.numel for t in kept)
        untied = embedding is not None
    skipped = shape.params - shape.flops_params  # position embeddings, on the first stage
    modules = None if shape.param_modules is None else max(1, round(shape.param_modules * params / shape.params))
    return replace(
        shape,
        name=f"{shape.name} (stage of {layers} blocks)",
        params=params,
        # the embedding's 6N share still counted, and the stage's experts a token runs
        flops_params=params - skipped + (table if untied else 0) + (moe.active_routed_params(dims.width) if moe else 0),
        dims=dims,
        tensors=tensors,
        tracer=None,
        param_modules=modules,
    )


def tied_head(shape: ModelShape) -> bool:
    """Whether the head shares the embedding's table: one vocab x width matrix outside the blocks
    (two where they are untied), or, known by its count alone, less than two tables' parameters there."""
    if shape.dims is None:
        return False
    table = shape.dims.vocab * shape.dims.width
    if shape.tensors is None:
        return shape.root_params() < 2 * table
    return sum(1 for t in shape.tensors if t.block is None and t.numel == table) == 1


def boundary_bytes(micro_batch: int, seq_len: int, width: int, tp: int, element_bytes: int) -> float:
    """Bytes one GPU sends across one stage boundary for one micro-batch, one way: the residual
    stream, split over the tensor-parallel ranks."""
    return micro_batch * seq_len * width * element_bytes / tp


def micro_batches(count: int) -> str:
    """'1 micro-batch', '8 micro-batches'."""
    return f"{count} micro-batch" if count == 1 else f"{count} micro-batches"


def idle_words(share: float) -> str:
    """How long the slowest GPU idles in the fill and drain against its own micro-batches' work:
    a share below once that work, a multiple past it (1 micro-batch on 64 even stages idles 63x)."""
    if share < 1:
        return f"{share:.0%} of the slowest GPU's micro-batch work idle"
    return f"idle {share:.1f}x as long as the slowest GPU's micro-batch work"
