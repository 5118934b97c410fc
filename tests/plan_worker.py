"""Measure what every strategy holds, inside ONE torchrun job: for each strategy and
precision, build the model, set the strategy up, run a full step and a backward (so the
gradients are held and the optimizer state exists, as the training loop measures it),
take `memory_breakdown`, finish the step and tear down.

    torchrun --nproc_per_node=N tests/plan_worker.py <out.json> <model> <model_kwargs json> \
        <strategies,comma,separated> <precisions,comma,separated>

A strategy may carry options as `<name>@<key>=<value>@...` (`ddp-tp@pp_size=2`: a combination of
the torch mesh, skipped on one rank), each value a whole number.

Each rank writes <out.json>.world<N>.rank<r> (one launch at each world size may share the
arguments): {"<strategy>/<precision>": {"params": {...}, ...} or {"skipped": reason} or
{"error": message}}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.train import distributed  # noqa: E402
from harness.train.optimizer import adamw_factory  # noqa: E402
from models.zoo import build_model  # noqa: E402
from strategies.base import ModelUnsupported, RunContext  # noqa: E402
from strategies.registry import default_registry  # noqa: E402

MICRO_BATCH, SEQ_LEN = 2, 16


def measure(name: str, precision: str, model_spec: str, model_kwargs: dict, env: distributed.DistEnv) -> dict:
    name, *pairs = name.split("@")
    options = {key: int(value) for key, value in (pair.split("=") for pair in pairs)}
    entry = default_registry().get(name)
    reason = entry.unavailable_reason or entry.unsupported_reason(env.device.type)
    if reason:
        return {"skipped": reason}
    if name == "single" and env.world_size > 1:
        return {"skipped": "single runs in one process"}
    if options and env.world_size == 1:
        return {"skipped": "a combination of the mesh lays out two ranks or more"}
    torch.manual_seed(0)
    model = build_model(model_spec, model_kwargs)
    ctx = RunContext(
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=env.device,
        precision=precision,
        micro_batch=MICRO_BATCH,
        grad_accum=1,
        grad_clip=1.0,
    )
    strategy = default_registry().create(name, ctx, **options)
    try:
        strategy.check_model(model)  # as the run's preflight does
    except ModelUnsupported as exc:
        return {"skipped": str(exc)}
    try:
        wrapped, _ = strategy.setup(model, adamw_factory(1e-3, (0.9, 0.95), 0.1))
        generator = torch.Generator().manual_seed(1 + env.rank)
        for step in range(2):
            rows = torch.randint(0, model.vocab_size, (MICRO_BATCH, SEQ_LEN + 1), generator=generator)
            with strategy.autocast():
                loss = wrapped(rows[:, :-1].to(env.device), rows[:, 1:].to(env.device))
            strategy.backward(loss)
            if step == 1:
                held = strategy.memory_breakdown().as_dict()
            strategy.step()
        return held
    finally:
        strategy.teardown()


def main() -> None:
    out, model_spec, model_kwargs, names, precisions = sys.argv[1:6]
    env = distributed.init_distributed("cpu", 120)
    results: dict[str, dict] = {}
    try:
        for name in names.split(","):
            for precision in precisions.split(","):
                try:
                    results[f"{name}/{precision}"] = measure(name, precision, model_spec, json.loads(model_kwargs), env)
                except Exception as exc:  # recorded, so the test names the strategy that failed
                    results[f"{name}/{precision}"] = {
                        "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()[-2000:],
                    }
    finally:
        Path(f"{out}.world{env.world_size}.rank{env.rank}").write_text(json.dumps(results, indent=1))
        distributed.shutdown_distributed()


if __name__ == "__main__":
    main()
