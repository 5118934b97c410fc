"""What each GPU of torch's Schedule1F1B exchanges with its neighbours in the steady state, the
account `Pipeline.steady_exchange_wait` prices:

    torchrun --nproc_per_node=3 tests/plan/parallel/one_f_one_b_exchanges_worker.py <out.json>

Three gloo ranks run one step of a three-stage MLP over six micro-batches. Every batched send and
receive the schedule waits on (`_batch_p2p`) is recorded by its description with the number of
operations in it. Writes <out.json>.rank<r>: {description: [operations of each call, in order]}.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from harness.train import distributed  # noqa: E402

MICRO_BATCHES, WIDTH = 6, 8


def main() -> None:
    out = sys.argv[1]
    env = distributed.init_distributed("cpu", 120)
    calls: dict[str, list[int]] = defaultdict(list)
    batch_p2p = schedules._batch_p2p

    def recorded(p2p_ops, desc=None):
        calls[str(desc)].append(len(p2p_ops))
        return batch_p2p(p2p_ops, desc=desc)

    schedules._batch_p2p = recorded
    try:
        torch.manual_seed(0)
        stage = PipelineStage(
            torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()),
            env.rank,
            env.world_size,
            torch.device("cpu"),
        )
        schedule = schedules.Schedule1F1B(stage, MICRO_BATCHES, loss_fn=lambda y, target: (y - target).pow(2).mean())
        batch = torch.randn(MICRO_BATCHES * 2, WIDTH)
        if env.rank == 0:
            schedule.step(batch)
        elif env.rank == env.world_size - 1:
            schedule.step(target=torch.zeros_like(batch))
        else:
            schedule.step()
        dist.barrier()  # every rank's last sends received before any leaves
    finally:
        schedules._batch_p2p = batch_p2p
        Path(f"{out}.rank{env.rank}").write_text(json.dumps(calls))
        distributed.shutdown_distributed()


if __name__ == "__main__":
    main()
