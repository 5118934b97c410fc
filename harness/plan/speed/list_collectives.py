"""ZeRO-3 as DeepSpeed ran it in 2021 (0.3.12, its first release of stage 3, to 0.5.x): every
parameter's all-gather and every gradient's reduce-scatter went through torch.distributed's
list form, one tensor per rank, and the host waited for the GPU before each module's fetch.

In deepspeed/runtime/zero/partition_parameters.py (deepspeedai/DeepSpeed @ v0.3.13, the same to
v0.5.5) `_allgather_param` splits the gathered buffer into one view per rank in a Python loop
(`flat_tensor.narrow(...)` world-size times) and calls `torch.distributed.all_gather(partitions, ...)`
on that list; `_reduce_scatter_gradient` does the same for each gradient, one parameter at a time,
making each rank's view with two torch calls (`param.grad.view(-1).narrow(...)`), and calls
`torch.distributed.reduce_scatter(input_list[rank], input_list, ...)`. torch's NCCL process group
runs a list collective on a flat copy: after the all-gather it copies each rank's slice out to its
tensor, before the reduce-scatter each rank's tensor into the flat input
(pytorch/pytorch torch/lib/c10d/ProcessGroupNCCL.cpp @ 00f5dfd5: `allgather`'s post hook and
`flatten_for_scatter_gather`), one copy kernel issued from C++ per rank. So each collective costs its
host, for every rank of the group, a torch function called from Python per view (TORCH_DISPATCH_S)
and a kernel dispatched and launched from C++ (host_issue.py's compiled figure, which is exactly that).

After each step the persistent parameters (those under stage3_param_persistence_threshold, which the
backward's end partitions with the rest) are gathered again by `_allgather_params` (0.3.12 to
0.5.4): one list all-gather, then for each tensor and each rank holding a slice of it, three torch
calls from Python (`partitions[i].narrow`, `replicated_tensor.view(-1).narrow`) and a `copy_` that
issues one asynchronous device copy (host_issue.py's compiled figure again: one torch function's
dispatch and one launch). Tens of thousands of tiny copies a step on a thousand GPUs, issued one by one.

None of it hides: stage3.py's `fetch_sub_module` ends each module's fetch with
`_synchronize_communication()`, whose `torch.cuda.synchronize()` (0.3.12 to 0.5.x; gone in 0.6.0)
drains the GPU before the host issues the next prefetch and the module's kernels, so the GPU waits
while the host splits, launches and copies; a gradient's reduce-scatter, issued from its hook
before the next module's pre-backward hook, is waited on there with nothing beside it
(comm.py puts it outside the backward's window); and the persistent parameters' copies end the
step, after the optimizer, with nothing left to run.
"""

from __future__ import annotations

from harness.plan.network.comm import Collective
from harness.plan.speed.host_issue import HOST_S_PER_KERNEL

# The dispatch of one torch function called from Python (pytorch/pytorch
# benchmarks/overrides_benchmark/README.md @ 17dc58bc: about 2 us), as host_issue.py cites it.
TORCH_DISPATCH_S = 2e-6
# Per rank of a call: its views made in Python, and its copy launched from C++.
VIEWS_PER_RANK = {"all-gather": 1, "reduce-scatter": 2}
HOST_S_PER_RANK = {
    kind: views * TORCH_DISPATCH_S + HOST_S_PER_KERNEL["compiled"] for kind, views in VIEWS_PER_RANK.items()
}
# Per tensor and rank of the persistent parameters' gather: three views and a copy, all from Python.
HOST_S_PER_PERSISTENT_COPY = 3 * TORCH_DISPATCH_S + HOST_S_PER_KERNEL["compiled"]


def list_collectives_host_s(collectives: list[Collective], grad_accum: int = 1) -> float:
    """Seconds a step's host spends splitting and copying list collectives (ZeRO-3's; nanotron's
    ZeRO-1 parameter gather, network/comm.py, likewise), every one in the GPU's critical path: each
    call's group size in views and copies, on every micro-step for the parameters' gathers and the
    gradients' reduce-scatters, and the copies a tensor and rank (`host_copies`) once a step."""
    total = 0.0
    for c in collectives:
        if c.kind not in HOST_S_PER_RANK or c.group.size <= 1:
            continue
        host = c.calls * c.group.size * HOST_S_PER_RANK[c.kind] + c.host_copies * HOST_S_PER_PERSISTENT_COPY
        total += host * (grad_accum if c.per_micro_step else 1)
    return total
