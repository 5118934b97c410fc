"""The host's work per rank in DeepSpeed's ZeRO-3 of 2021, on this machine, beside the planner's
figures for it (harness/plan/speed/list_collectives.py): the Python loops of
deepspeed/runtime/zero/partition_parameters.py @ v0.3.13, run as they are written, each timed per
rank of a world of WORLD ranks (no collective is run: one GPU plays one rank's host).

* `_allgather_param`'s views: one `narrow` a rank of the gathered buffer;
* `_reduce_scatter_gradient`'s views: `param.grad.view(-1).narrow(...)` a rank;
* `_allgather_params`' copy-out of a persistent tensor (a norm of WIDTH elements): per rank, a
  `narrow` of the gathered slice, `view(-1).narrow(...)` of the tensor and a `copy_` into it.

The C++ copy torch's NCCL process group issues per rank of a list collective is not run here (it
needs the collective); the planner prices it as one dispatch and one launch, as this script's
`copy_` measures from Python.

On a GPU machine: python bench/zero3_host_loops.py --out bench/results/zero3_host_loops_<gpu>.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import best_seconds, gpu_command, write_table  # noqa: E402
from harness.plan.speed.list_collectives import (  # noqa: E402
    HOST_S_PER_PERSISTENT_COPY,
    TORCH_DISPATCH_S,
)

WORLD = 1536
WIDTH = 12288  # the 175B GPT's norms: 8 elements a rank
REPEATS = 5


def per_rank_s(loop, repeats: int = REPEATS) -> float:
    """The shortest of `repeats` runs of `loop` (a pass over every rank), per rank, the GPU drained after."""
    loop()  # warm-up
    return best_seconds(loop, repeats) / WORLD


def main() -> None:
    out = gpu_command(__doc__.splitlines()[0], "zero3_host_loops.py")
    part = -(-WIDTH // WORLD)
    flat = torch.zeros(part * WORLD, device="cuda", dtype=torch.half)
    grad = torch.zeros(part * WORLD, device="cuda", dtype=torch.half)
    tensor = torch.empty(WIDTH, device="cuda", dtype=torch.half)

    def gather_views() -> None:
        [flat.narrow(0, part * i, part) for i in range(WORLD)]

    def scatter_views() -> None:
        [grad.view(-1).narrow(0, part * i, part) for i in range(WORLD)]

    def persistent_copies() -> None:
        for i in range(WORLD):
            if i * part < WIDTH:
                n = min(WIDTH - i * part, part)
                tensor.view(-1).narrow(0, i * part, n).copy_(flat.narrow(0, i * part, n))

    rows = [
        ("`_allgather_param`: a view a rank", per_rank_s(gather_views), TORCH_DISPATCH_S),
        ("`_reduce_scatter_gradient`: two views a rank", per_rank_s(scatter_views), 2 * TORCH_DISPATCH_S),
        (
            "`_allgather_params`: three views and a copy a rank",
            per_rank_s(persistent_copies),
            HOST_S_PER_PERSISTENT_COPY,
        ),
    ]
    lines = [
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {WORLD} ranks; "
        f"command: python bench/zero3_host_loops.py",
        "",
        "| loop | measured us per rank | planned us per rank |",
        "|---|---:|---:|",
    ]
    for what, measured, planned in rows:
        lines.append(f"| {what} | {measured * 1e6:.2f} | {planned * 1e6:.2f} |")
        print(lines[-1])
    write_table(lines, out)


if __name__ == "__main__":
    main()
