"""DeepSpeed's PipelineEngine as it runs a pipeline: parabench's zero1-pp (DeepSpeed 0.19.8) and the
published Megatron-DeepSpeed runs whose `deepspeed_pipeline` token says its engine ran their model
(BigScience's BLOOM runs on DeepSpeed 0.5-0.6). What differs from Megatron-LM's 1F1B, each read from
deepspeedai/DeepSpeed `deepspeed/runtime/pipe/` at v0.5.10 (3293cf72, January 2022) and unchanged in
0.19.8:

- `schedule.py` TrainSchedule: every step of a stage is a forward or a backward, and its exchange
  runs before it, one transfer after the other: a forward step receives its activation
  (RecvActivation) and then sends the previous backward's gradient (SendGrad), a backward step sends
  the previous forward's activation (SendActivation) and then receives its gradient (RecvGrad).
  Neighbours run opposite steps (`_step_to_micro_batch`: a forward where the step and the stage
  have the same parity), so a GPU between two others exchanges with one neighbour on every step and
  the pipeline moves at its pace: four transfers a micro-batch in the steady state, each in the
  critical path, where Megatron-LM's 1F1B pairs a send with a receive (`send_forward_recv_backward`):
  two. With two stages each GPU exchanges every other step only (its forward step has no previous
  stage, its partner's backward step no next one): two transfers a micro-batch.
- `p2p.py` send and recv are `dist.send` and `dist.recv`, which return only once NCCL's transfer is
  queued on the compute stream (`async_op` is refused): nothing of a stage's compute runs beside
  them.
- `engine.py` with tensor parallelism (`is_pipe_partitioned`, `is_grad_partitioned`, on whenever
  the model-parallel group has more than one GPU): each tensor-parallel rank sends its 1/tp of the
  boundary activation (`PartitionedTensor`) with a LongTensor of its layout, and the receiver makes
  it whole again with an all-gather over the group (`PartitionedTensor.full`): the forward's input,
  and in the backward the stage's own output (restored to rebuild its graph) and the gradient it
  received, three all-gathers of the whole boundary activation a micro-batch, each in the critical
  path. The layout's `tolist()` and `.to(device)` stop the host until the GPU has drained, so no
  transfer or gather can run ahead of the compute either.
- `_exec_reduce_tied_grads` then `_exec_reduce_grads` after the last micro-batch (the engine turns
  `enable_backward_allreduce` off): the tied embedding's gradient all-reduced between the first
  and the last stage, then the data-parallel reduction, neither beside any compute.
"""

from __future__ import annotations

from harness.plan.parallel.backends import Backend

# A plan option: the pipeline runs on DeepSpeed's PipelineEngine (set for a published row's
# `deepspeed_pipeline` token; a backend of the deepspeed engine with a pipeline runs it anyway).
DEEPSPEED_PIPELINE = "deepspeed_pipeline"
SENDS_PER_MICRO_BATCH = 4  # TrainSchedule: RecvActivation, SendGrad; SendActivation, RecvGrad
GATHERS_PER_MICRO_BATCH = 3  # PartitionedTensor.full(): the input, the restored output, the received gradient


def transfers_per_micro_batch(stages: int) -> int:
    """Transfers a micro-batch waits on in TrainSchedule's steady state, one after the other (the
    module's account): four with a GPU between two others, two with two stages."""
    return SENDS_PER_MICRO_BATCH if stages > 2 else SENDS_PER_MICRO_BATCH // 2


def runs_deepspeed_pipeline(backend: Backend) -> bool:
    """Whether the layout's pipeline is DeepSpeed's PipelineEngine: zero1-pp's (the deepspeed engine
    with a pipeline), or a published run's that names it."""
    return backend.pipeline_engine and (backend.engine == "deepspeed" or bool(backend.options.get(DEEPSPEED_PIPELINE)))
