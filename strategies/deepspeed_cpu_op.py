"""DeepSpeed's shared-memory communication op on a CPU, left unbuilt.

On a CPU, DeepSpeed's torch backend compiles a small op with g++ the first time a process group
comes up (deepspeed/comm/torch.py, `build_shm_op`): half a minute of two cores, a C++ compiler
needed, and a build lock that torch's extension loader waits on without end where a build was
killed midway. The op serves `inference_all_reduce` alone, which inference's tensor-parallel
layers call; training reduces through torch.distributed (`TorchBackend.all_reduce`), and
`inference_all_reduce` itself falls back to it where the op is missing. So the op is marked
unavailable before DeepSpeed starts: `build_shm_op` checks exactly that mark and returns None.
"""

from __future__ import annotations

SHARED_MEMORY_BUILDER = "ShareMemCommBuilder"


def skip_cpu_comm_op() -> None:
    """Mark DeepSpeed's shared-memory op unavailable in this process, so that DeepSpeed does not build it."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(SHARED_MEMORY_BUILDER)
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
