"""What a strategy does, in the planner's terms: what it shards, where it keeps bytes, how it
runs mixed precision and how its replicas talk. A strategy class declares one per registered
name (strategies/base.py `Preset`); `runner.py plan` predicts memory, communication and speed
from it, so a backend added as one file is planned as soon as it is registered.

Plain data: the planner and `runner.py list` read it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("torch", "deepspeed")
MIXED_PRECISION = ("autocast", "low_precision")
REPLICAS = ("processes", "threads")


@dataclass(frozen=True)
class PlanModel:
    """A strategy as the planner models it."""

    # "torch": fp32 parameters, autocast or FSDP's policy; "deepspeed": the model cast to bf16/fp16.
    engine: str
    # What is sharded over the data-parallel ranks, in ZeRO's terms: 0 nothing, 1 optimizer state,
    # 2 + gradients, 3 + parameters.
    stage: int
    # The low-precision forward: "autocast" casts weights per matmul and keeps an fp32 residual
    # stream; "low_precision" runs the whole model in bf16/fp16 (FSDP's policy, DeepSpeed's cast).
    mixed_precision: str = "autocast"
    reshard_after_forward: bool = True  # stage 3 only: False keeps the gathered parameters until backward
    offload_optimizer: bool = False  # optimizer state (and the fp32 master) in host memory
    offload_params: bool = False  # the parameter shards in host memory
    # torch engine under bf16: gradients reduced in fp32 (FSDP's reduce_dtype, DDP's fp32 gradients).
    reduce_in_fp32: bool = True
    via_accelerate: bool = False  # driven through Hugging Face Accelerate
    data_parallel: bool = False  # stage 0 run through DistributedDataParallel
    # "processes": one process per GPU (every launcher-started strategy). "threads": one process
    # drives every GPU (torch.nn.DataParallel): the model is copied from GPU 0 to the others
    # every step, outputs gathered onto GPU 0 and gradients summed there.
    replicas: str = "processes"
    # Layouts over many GPUs; their sizes come from the strategy's options (tp_size, shard_size,
    # zero_hpz_partition_size), by default the GPUs of one node.
    # Tensor parallel inside each group of tp_size GPUs (matmuls split column- and row-wise, their
    # activations split with them), the data-parallel layout across the groups.
    tensor_parallel: bool = False
    # With tensor parallel: the residual stream between the blocks' matmuls split along the sequence
    # (sequence parallelism) rather than whole on every rank of the group. A strategy that takes a
    # `sequence_parallel` option is planned with the option's value instead.
    sequence_parallel: bool = True
    # Hybrid sharding: the stage applies inside groups of shard_size GPUs, which replicate across
    # (FSDP2's HSDP, DeepSpeed's MiCS): gradients reduced inside a group, then all-reduced across.
    hybrid_shard: bool = False
    # ZeRO++ hpZ: a secondary copy of the parameter shards inside each node, which backward
    # gathers from over the node's links instead of across nodes.
    secondary_partition: bool = False
    # ZeRO++ qwZ/qgZ: weights gathered in int8 and gradients reduced in int4 (on GPUs).
    quantized_comm: bool = False
    # A pipeline outside FSDP2: the model cut into pp_size stages by DeepSpeed's PipelineEngine (its
    # one schedule, 1F1B), or by Megatron-LM's schedules in a published run.
    pipeline_engine: bool = False
    # Context parallel outside FSDP2: each sequence split over cp_size GPUs by Megatron-LM's
    # TransformerEngine ring in a published run, gradients reduced over the data- and
    # context-parallel ranks together.
    context_parallel_engine: bool = False
    # Expert parallel (option `ep_size`): a mixture of experts' routed experts sharded over ep_size of
    # the data-parallel GPUs, tokens sent to them and back by all-to-all; the experts' gradients
    # reduced (and under ZeRO their state sharded) over the GPUs that hold the same experts.
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"PlanModel engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"PlanModel stage {self.stage!r} is not a ZeRO stage: use 0, 1, 2 or 3")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(
                f"PlanModel mixed_precision {self.mixed_precision!r} is not one of {', '.join(MIXED_PRECISION)}"
            )
        if self.replicas not in REPLICAS:
            raise ValueError(f"PlanModel replicas {self.replicas!r} is not one of {', '.join(REPLICAS)}")
