"""The pipeline a layout takes in the default plan, as Megatron-LM's authors lay out large models
(Narayanan et al. 2021, arXiv 2104.04473, section 3.3, takeaways 1 and 2): tensor parallel inside a
node, then the fewest pipeline stages with which the model states and activations fit, data
parallel over the rest. A tensor-parallel layout takes one where it does not fit without; a pipeline
strategy (fsdp-pp, zero1-pp) whose stages and micro-batches the user left takes its fewest too.
Only a strategy that takes pp_size (planned_options.takes: what `train` takes) is given stages.

The stages are divisors of the GPUs left by tensor parallelism, at most the model's blocks. The
step's accumulation becomes the pipeline's micro-batches, one schedule a step (Megatron-LM's
`num_microbatches`): each data-parallel rank's micro-batches of `micro_batch` sequences, or where
they are fewer than the stages, one sequence each. Both 1F1B and the interleaved schedule (two
stages a GPU, where the micro-batches are a multiple of the stages) are planned, the faster kept.
A layout the user gave `pp_size` keeps it; one that fits without a pipeline takes none.
"""

from __future__ import annotations

from dataclasses import replace

from harness.plan.parallel.backends import backend_for
from harness.plan.parallel.layout import LayoutError, layout_of, pipelines
from harness.plan.parallel.pipeline_cost import LOOPED, micro_batches
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
    dims = q.shape.dims
    if dims is None:
        return None
    ranks = q.gpus // plan.layout.tp
    for stages in (d for d in range(2, min(ranks, dims.layers) + 1) if ranks % d == 0):
        fitting = []
        for schedule in SCHEDULES:
            try:
                p = _pipelined(plan.name, q, stages, schedule)
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
    why = "it does not fit without one, and this is" if plan.backend.tensor_parallel else "its stages are"
    return (
        f"{plan.name} as a pipeline of {plan.layout.pp} stages{virtual} ({schedule}, "
        f"{micro_batches(options['microbatches'])} a step): {why} the fewest with which it fits (tensor parallel "
        "inside a node, then pipeline stages until the model fits: Narayanan et al. 2021, takeaways 1 and 2); "
        "strategy_options.pp_size= and microbatches= set them."
    )
