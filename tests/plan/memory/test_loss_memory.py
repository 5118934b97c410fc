"""The loss's bytes per logit at its peak, measured: the process's peak resident memory over the
backward of torch's cross-entropy, plain and under DTensor's loss_parallel (the vocabulary split
over a one-GPU mesh: the same code runs whatever the mesh's size). Each fp32 tensor of the logits
is 64 MiB, past glibc's largest mmap threshold (32 MiB), so each is its own mapping: resident while
alive, returned when freed, and the kernel's high-water mark (VmHWM) is the peak of live tensors.
Beside them, what the plan holds around the loss: the logits' block the caching allocator keeps
(counted in the reserved figure), and the block a pipeline stage without the head rebuilds.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel

from harness.plan.memory.activations import (
    LOSS_BYTES_PER_LOGIT,
    LOSS_PARALLEL_BYTES_PER_LOGIT,
    activations,
    loss_bytes_per_logit,
)
from harness.plan.model.model_shape import shape_of_description

ROWS, VOCAB = 2048, 8192  # 64 MiB per fp32 tensor of the logits
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int:
    line = next(line for line in STATUS.read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def one_gpu_mesh():
    if not CLEAR_REFS.exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident memory")
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    if started:
        dist.destroy_process_group()


def _backward_peak_per_logit(mesh, vocab_parallel: bool) -> float:
    """Bytes per logit alive at the backward's peak: the saved log-softmax output (fp32, alive at
    its start) and what the backward adds over that start."""
    torch.manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, VOCAB, (ROWS,))
    head = DTensor.from_local(logits, mesh, [Shard(1)]) if vocab_parallel else logits
    with loss_parallel() if vocab_parallel else contextlib.nullcontext():
        pred = head * 1  # the head's output, freed before the backward as torchtitan's `del pred`
        loss = F.cross_entropy(pred.float(), target)
        del pred
        start = _status_bytes("VmRSS")
        CLEAR_REFS.write_text("5")  # the high-water mark starts again from here
        loss.backward()
        added = _status_bytes("VmHWM") - start
    return 4 + added / (ROWS * VOCAB)


@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_the_loss_holds_what_the_plan_counts_at_its_peak(one_gpu_mesh, vocab_parallel):
    measured = _backward_peak_per_logit(one_gpu_mesh, vocab_parallel)
    planned = loss_bytes_per_logit("bf16", fused=False, vocab_parallel=vocab_parallel)
    assert planned == (LOSS_PARALLEL_BYTES_PER_LOGIT if vocab_parallel else LOSS_BYTES_PER_LOGIT)
    # Within a quarter of a byte: a 64 MiB tensor is 4 bytes a logit, so one more or fewer fails.
    assert measured == pytest.approx(planned, abs=0.25)


LLAMA_8B = dict(params=None, layers=32, width=4096, heads=32, vocab=128256, kv_heads=8, ffn=14336, arch="llama")


def _llama_8b_activations(**kwargs):
    shape = shape_of_description(seq_len=8192, **LLAMA_8B)
    asked = dict(micro_batch=2, seq_len=8192, precision="bf16", mixed_precision="low_precision")
    return activations(shape, **(asked | kwargs))


def test_the_allocator_keeps_16_bit_logits_beside_the_loss_only():
    tokens = 2 * 8192
    whole = _llama_8b_activations(checkpointing="full")
    assert whole.logits_cached == tokens * LLAMA_8B["vocab"] * 2
    assert _llama_8b_activations(checkpointing="full", tp=8).logits_cached == whole.logits_cached // 8
    # A fused loss never makes the whole logits; fp32 logits are the loss's input, their block reused.
    assert _llama_8b_activations(checkpointing="full", fused_loss=True).logits_cached == 0
    assert _llama_8b_activations(checkpointing="full", precision="fp32", mixed_precision="autocast").logits_cached == 0


def test_a_stage_without_the_head_rebuilds_its_block_beside_all_it_holds():
    last = _llama_8b_activations(checkpointing="full")
    before_last = _llama_8b_activations(checkpointing="full", with_head=False)
    assert last.head > 0 and last.rebuilt == 0  # the loss's buffers, freed first, outweigh the block
    assert before_last.head == before_last.logits_cached == 0
    assert before_last.blocks == last.blocks
    # The whole block rebuilt: what a block keeps without checkpointing.
    block = _llama_8b_activations(checkpointing="none", with_head=False).blocks // 32
    assert before_last.rebuilt == pytest.approx(block, rel=1e-6)
