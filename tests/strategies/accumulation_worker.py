"""Gradient accumulation through a strategy's verbs, driven as the training loop drives them
(no_sync around every micro-step but the last, backward, then step), with the gradients read
after each micro-step:

    torchrun --nproc_per_node=2 tests/strategies/accumulation_worker.py <out.json> <strategy,...>

Each rank, for each strategy, builds gpt-nano from one seed, runs 2 micro-steps of 2 rows (the
global batch: 2 ranks x 2 x 2 = 8 rows, the same on every rank, each rank taking its own rows)
and writes <out.json>.rank<r>: {"<strategy>": {"after_micro_step": [{...}, {...}]}}, where each
entry holds, where the backend keeps its gradients in the parameters' .grad,
`largest_difference_from` two one-process references, this rank's own micro-steps so far
("own") and the whole global batch ("global"), and `unreduced` (how many parameters hold no
gradient yet); and, where DeepSpeed keeps them in its own buffers, the engine's `global_steps`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.train import distributed  # noqa: E402
from harness.train.optimizer import adamw_factory  # noqa: E402
from models.zoo import build_model  # noqa: E402
from strategies.base import RunContext  # noqa: E402
from strategies.registry import default_registry  # noqa: E402

MICRO_BATCH, GRAD_ACCUM, SEQ_LEN = 2, 2, 16


def _gradient_of(model: torch.nn.Module, rows: torch.Tensor, scale: float) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (model(rows[:, :-1], rows[:, 1:]) * scale).backward()
    return [p.grad.clone() for p in model.parameters()]


def _held_gradients(model: torch.nn.Module) -> list[torch.Tensor | None]:
    """Each parameter's whole gradient as the backend holds it (FSDP2's shards gathered)."""
    from torch.distributed.tensor import DTensor

    return [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]


def _largest_difference(held: list[torch.Tensor | None], want: list[torch.Tensor]) -> float | None:
    if any(g is None for g in held):
        return None
    return max((g.detach().float().cpu() - w).abs().max().item() for g, w in zip(held, want, strict=True))


def probe(name: str, env: distributed.DistEnv) -> dict:
    torch.manual_seed(0)
    model = build_model("gpt-nano")
    reference = copy.deepcopy(model)  # the same weights, never set up
    ctx = RunContext(
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=env.device,
        precision="fp32",
        micro_batch=MICRO_BATCH,
        grad_accum=GRAD_ACCUM,
        grad_clip=0.0,
    )
    batch = torch.randint(
        0,
        model.vocab_size,
        (env.world_size * GRAD_ACCUM * MICRO_BATCH, SEQ_LEN + 1),
        generator=torch.Generator().manual_seed(1),
    )

    def rows(micro: int, rank: int) -> torch.Tensor:
        start = (micro * env.world_size + rank) * MICRO_BATCH
        return batch[start : start + MICRO_BATCH]

    whole_batch = _gradient_of(reference, batch, 1.0)  # the mean loss over all 8 rows
    strategy = default_registry().create(name, ctx)
    try:
        wrapped, _ = strategy.setup(model, adamw_factory(1e-3, (0.9, 0.95), 0.0))
        after = []
        for micro in range(GRAD_ACCUM):
            sync = strategy.no_sync() if micro < GRAD_ACCUM - 1 else contextlib.nullcontext()
            with sync:
                x = rows(micro, env.rank).to(env.device)
                with strategy.autocast():
                    loss = wrapped(x[:, :-1], x[:, 1:])
                strategy.backward(loss)
            own = _gradient_of(reference, torch.cat([rows(m, env.rank) for m in range(micro + 1)]), 1.0)
            # This rank's micro-steps so far, each a mean over its rows, divided by the accumulation.
            own = [g * (micro + 1) / GRAD_ACCUM for g in own]
            engine = getattr(strategy, "model", None)
            if hasattr(engine, "global_steps"):  # DeepSpeed: gradients live in the engine's buffers
                after.append({"global_steps": engine.global_steps})
                continue
            held = _held_gradients(model)
            after.append(
                {
                    "unreduced": sum(g is None for g in held),
                    "largest_difference_from": {
                        "own": _largest_difference(held, own),
                        "global": _largest_difference(held, whole_batch),
                    },
                }
            )
        strategy.step()
        return {"after_micro_step": after}
    finally:
        strategy.teardown()


def main() -> None:
    out, names = sys.argv[1:3]
    env = distributed.init_distributed("cpu", 120)
    results: dict[str, dict] = {}
    try:
        for name in names.split(","):
            try:
                results[name] = probe(name, env)
            except Exception as exc:  # recorded, so the test names the strategy that failed
                results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    finally:
        Path(f"{out}.rank{env.rank}").write_text(json.dumps(results, indent=1))
        distributed.shutdown_distributed()


if __name__ == "__main__":
    main()
