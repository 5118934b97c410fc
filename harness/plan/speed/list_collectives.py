"""ZeRO-3 as DeepSpeed ran it in 2021 (0.3.12, its first release of stage 3, to 0.5.x): every
parameter's all-gather and every gradient's reduce-scatter went through torch.distributed's
list form, one tensor per rank, and the host waited for the GPU before each module's fetch.

In deepspeed/runtime/zero/partition_parameters.py (deepspeedai/DeepSpeed @ v0.3.13, the same to
v0.5.5) `_allgather_param` splits the gathered buffer into one view per rank in a Python loop
(`flat_tensor.narrow(...)` world-size times) and calls `torch.distributed.all_gather(partitions, ...)`
on that list; `_reduce_scatter_gradient` does the same for each gradient, one parameter at a time,
and calls `torch.distributed.reduce_scatter(input_list[rank], input_list, ...)`. torch's NCCL process
group runs a list collective on a flat copy: after the all-gather it copies each rank's slice out to
its tensor, before the reduce-scatter each rank's tensor into the flat input
(pytorch/pytorch torch/lib/c10d/ProcessGroupNCCL.cpp @ 00f5dfd5: `allgather`'s post hook and
`flatten_for_scatter_gather`), one copy kernel issued from C++ per rank. So each collective costs its
host, for every rank of the group, a torch function called from Python (TORCH_DISPATCH_S) and a
kernel dispatched and launched from C++ (host_issue.py's compiled figure, which is exactly that).

None of it hides: stage3.py's `fetch_sub_module` ends each module's fetch with
`_synchronize_communication()`, whose `torch.cuda.synchronize()` (0.3.12 to 0.5.x; gone in 0.6.0)
drains the GPU before the host issues the next prefetch and the module's kernels, so the GPU waits
while the host splits, launches and copies; and a gradient's reduce-scatter, issued from its hook
before the next module's pre-backward hook, is waited on there with nothing beside it
(comm.py puts it outside the backward's window).
"""

from __future__ import annotations

from harness.plan.network.comm import Collective
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL

# The dispatch of one torch function called from Python (pytorch/pytorch
# benchmarks/overrides_benchmark/README.md @ 17dc58bc: about 2 us), as host_issue.py cites it.
TORCH_DISPATCH_S = 2e-6
HOST_S_PER_RANK = TORCH_DISPATCH_S + HOST_S_PER_KERNEL["compiled"]
LIST_KINDS = ("all-gather", "reduce-scatter")


def list_collectives_host_s(collectives: list[Collective]) -> float:
    """Seconds a micro-step's host spends splitting and copying the list collectives of ZeRO-3,
    every one in the GPU's critical path: each call's group size in views and copies."""
    return sum(
        c.calls * c.group.size * HOST_S_PER_RANK
        for c in collectives
        if c.kind in LIST_KINDS and c.per_micro_step and c.group.size > 1
    )
