"""The pipeline a layout takes in the default plan, as Megatron-LM's authors lay out large models
(Narayanan et al. 2021, arXiv 2104.04473, section 3.3, takeaways 1 and 2): tensor parallel inside a
node, then the fewest pipeline stages with which the model states and activations fit, data
parallel over the rest. A tensor-parallel layout takes one where it does not fit without; a pipeline
strategy (fsdp-pp, zero1-pp) whose stages and micro-batches the user left takes its fewest too.
Only a strategy that takes pp_size (planned_options.takes: what `train` takes) is given stages.

The stages are divisors of the GPUs left by tensor parallelism, at most the model's blocks. The
step's accumulation becomes the pipeline's micro-batches, one schedule a step (Megatron-LM's
`num_microbatches`): each data-parallel rank's micro-batches of `micro_batch` sequences, or where
they are fewer than the stages, one sequence each; where even those are fewer, one sequence for each
stage under torch's schedules, which refuse fewer (DeepSpeed's engine runs fewer), so the pipeline's
step takes more sequences than the question's. Both 1F1B and the interleaved schedule (two
stages a GPU, where the micro-batches are a multiple of the stages) are planned, the faster kept.
A layout the user gave `pp_size` keeps it; one that fits without a pipeline takes none.
"""

from __future__ import annotations

from dataclasses import replace

from harness.plan.parallel.backends import backend_for
from harness.plan.parallel.layout import LayoutError, layout_of, pipelines
from harness.plan.parallel.pipeline_context import runtime_of
from harness.plan.parallel.pipeline_cost import LOOPED, TORCH_RUNTIME, micro_batches
from harness.plan.parallel.planned_options import options_of, takes
from harness.plan.predict import Question, StrategyPlan, batching, plan_backend, storage_precision

SCHEDULES = ("1f1b", "interleaved-1f1b")
VIRTUAL_STAGES = 2


def takes_default_pipeline(plan: StrategyPlan, q: Question) -> bool:
    """Whether the plan chooses `plan`'s stages (the module's account): the strategy takes pp_size
    (what `train` takes: a layout no run could use is not offered), the user left its stages and
    micro-batches, and it is a pipeline strategy or a tensor-parallel layout too large without one."""
    backend = plan.backend
    if not pipelines(backend) or "pp_size" not in takes(plan.name) or _user_staged(plan.name, q):
        return False
    return plan.layout.pp > 1 or (plan.fits is False and backend.tensor_parallel)


def _user_staged(name: str, q: Question) -> bool:
    """Whether the user gave strategy `name` its stages or micro-batches."""
    return bool({"pp_size", "microbatches"} & set(options_of(name, q.strategy_options)))


def _pipelined(name: str, q: Question, stages: int, schedule: str) -> StrategyPlan | None:
    """`name` over `stages` pipeline stages under `schedule`, its accumulation as the micro-batches."""
    options = {**options_of(name, q.strategy_options), "pp_size": stages}
    precision = storage_precision(q.precision)
    backend = backend_for(name, q.shape, precision, q.gpus, options)
    micro_batch, accumulation = batching(q, layout_of(backend, q.shape, q.topology))
    local = micro_batch * accumulation
    microbatches = accumulation if accumulation >= stages else local
    named = "schedule" in takes(name)  # DeepSpeed's engine runs its one schedule, 1F1B, its name fixing it
    if runtime_of(backend) == TORCH_RUNTIME and microbatches < stages:  # torch's schedules refuse fewer
        if q.global_batch is not None:  # the batch given holds: these stages cannot run it
            return None
        microbatches = local = stages
    if schedule in LOOPED and (microbatches % stages or not named):
        return None
    options |= {"microbatches": microbatches} | ({"schedule": schedule} if named else {})
    if schedule in LOOPED:
        options["virtual_stages"] = VIRTUAL_STAGES
    backend = backend_for(name, q.shape, precision, q.gpus, options)
    asked = replace(
        q,
        strategy_options=options,
        micro_batch=local,
        grad_accum=1,
        global_batch=None,
        split_global_batch=False,
        nearest_split=False,
    )
    return plan_backend(backend, asked)


def fewest_stages(plan: StrategyPlan, q: Question) -> StrategyPlan | None:
    """`plan`'s layout over the fewest pipeline stages with which it fits (the module's account),
    the faster schedule of those planned; None where no count of stages makes it fit."""
    return _fewest(plan.name, q, plan.layout.tp)


def staged_instead(name: str, q: Question) -> StrategyPlan | None:
    """A pipeline strategy (fsdp-pp, zero1-pp) whose own default cannot take the question's batch (a
    micro-batch a stage, which must divide it), its stages and micro-batches left to the plan: the
    fewest stages that fit, fed as the module says, or where none fit its own stages so fed (planned,
    not fitting); None where it is not one or cannot be fed."""
    if "pp_size" not in takes(name) or _user_staged(name, q):
        return None
    backend = backend_for(name, q.shape, storage_precision(q.precision), q.gpus, options_of(name, q.strategy_options))
    try:
        layout = layout_of(backend, q.shape, q.topology)
    except LayoutError:
        return None
    if not pipelines(backend) or layout.pp <= 1:
        return None
    fitting = _fewest(name, q, layout.tp)
    if fitting is not None:
        return fitting
    try:
        return _pipelined(name, q, layout.pp, SCHEDULES[0])
    except LayoutError:
        return None


def _fewest(name: str, q: Question, tp: int) -> StrategyPlan | None:
    dims = q.shape.dims
    if dims is None:
        return None
    ranks = q.gpus // tp
    # The memory alone: interleaving holds at least 1F1B's micro-batches in flight (Pipeline.in_flight_at),
    # so it fits only where 1F1B does, and among plans without a time the first planned, 1F1B, is kept.
    schedules = SCHEDULES if q.timed else SCHEDULES[:1]
    for stages in (d for d in range(2, min(ranks, dims.layers) + 1) if ranks % d == 0):
        fitting = []
        for schedule in schedules:
            try:
                p = _pipelined(name, q, stages, schedule)
            except LayoutError:
                continue
            if p is not None and p.fits:
                fitting.append(p)
        if fitting:
            return max(fitting, key=lambda p: p.time.tokens_per_s if p.time else 0.0)
    return None


def pipeline_line(plan: StrategyPlan, q: Question) -> str | None:
    """What the default plan chose for a layout it gave a pipeline, in words; None for the others."""
    options = plan.backend.options
    if plan.layout.pp <= 1 or not options.get("microbatches") or _user_staged(plan.name, q):
        return None
    schedule = options.get("schedule", "1f1b")
    virtual = f" x {options['virtual_stages']} virtual stages" if schedule in LOOPED else ""
    if plan.fits is False:
        why = "no count of stages makes it fit, so it is planned over its own"
    elif plan.backend.tensor_parallel:
        why = "it does not fit without one, and this is the fewest with which it fits"
    else:
        why = "its stages are the fewest with which it fits"
    micro_batch, accumulation = batching(q, plan.layout)
    raised = (
        f" torch's schedules run at least a micro-batch a stage, so it takes {options['microbatches']} sequences a "
        f"data-parallel rank a step where the question gives {micro_batch * accumulation}."
        if options["microbatches"] > micro_batch * accumulation
        else ""
    )
    given = (
        " No global batch given: global_batch_tokens= or batch_size= feeds it the data-parallel rank's whole "
        "share as micro-batches, as pipelines run, and holds every layout to the same batch."
        if q.global_batch is None
        else ""
    )
    return (
        f"{plan.name} as a pipeline of {plan.layout.pp} stages{virtual} ({schedule}, "
        f"{micro_batches(options['microbatches'])} a step): {why} (tensor parallel "
        "inside a node, then pipeline stages until the model fits: Narayanan et al. 2021, takeaways 1 and 2); "
        f"strategy_options.pp_size= and microbatches= set them.{raised}{given}"
    )
