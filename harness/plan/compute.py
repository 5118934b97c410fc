"""What one micro-step costs a GPU in compute, in ideal seconds: the matmuls at their peak rate
and the memory-bound work at the memory's bandwidth. The speed model (speed.py) scales the sum
by a compute scale, calibrated on a machine (calibration.py), and adds what each backend costs.

A fixed MFU cannot carry from one model size to another: on an H100 in bf16 eager gpt2-124m
reached 27% MFU and gpt2-350m 36% at the same micro-batch, because part of the step is memory-
bound work that does not grow with the width as the matmuls do, and the loss over a 50k
vocabulary does not grow with the model at all. So the step is counted in parts:

  matmuls        6N + 12·L·H·Q·T flops per token (PaLM's count, the one MFU uses) at
                 MATMUL_EFFICIENCY of the peak: large bf16 GEMMs reach about three quarters;
  elementwise    norms, activation functions, residual adds, casts and attention's reshapes:
                 ELEMENTWISE_PASSES reads or writes of a width-h vector per token and block,
                 forward and backward, of 4 bytes in fp32, 3 under autocast (an fp32 residual
                 stream, bf16 matmul inputs), 2 where the backend computes in bf16; a compiled
                 model fuses most of them;
  loss           the cross-entropy over the vocabulary: the logits cast to fp32, log-softmax,
                 its gradient and the cast back, LOSS_BYTES_PER_LOGIT per token and vocabulary
                 entry eager, fused to a few when compiled;
  optimizer      AdamW over every parameter: weights, gradients and both moments read,
                 three written, and autocast's weight casts: OPTIMIZER_BYTES_PER_PARAM;

the memory-bound parts at HBM_EFFICIENCY of the bandwidth. With these constants one scale fitted
to `single` on gpt2-124m (1.03) gives gpt2-350m's step within 3% on the H100 of 2026-11-23 —
the constants were chosen with both measurements in view, so that is consistency, not proof;
tests/plan/test_calibration.py and bench/README.md's calibration check measure it anew.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.plan.model_shape import ModelShape

MATMUL_EFFICIENCY = 0.75
HBM_EFFICIENCY = 0.6
ELEMENTWISE_PASSES = {False: 60, True: 20}  # by compiled
LOSS_BYTES_PER_LOGIT = {False: 40, True: 12}  # by compiled
OPTIMIZER_BYTES_PER_PARAM = 34
CHECKPOINTING_FORWARD = 1 / 3  # share of a block's work that activation checkpointing runs again


@dataclass(frozen=True)
class ComputeWork:
    """Ideal seconds of one micro-step's compute (and the step's optimizer) on one GPU."""

    matmul_s: float
    elementwise_s: float
    loss_s: float
    optimizer_s: float  # once per step, not per micro-step

    @property
    def micro_step_s(self) -> float:
        return self.matmul_s + self.elementwise_s + self.loss_s


def elementwise_bytes(precision: str, mixed_precision: str) -> int:
    """Bytes a vector element of the residual stream costs per pass."""
    if precision == "fp32":
        return 4
    return 3 if mixed_precision == "autocast" else 2


def compute_work(
    shape: ModelShape,
    *,
    tokens: int,
    seq_len: int,
    precision: str,
    mixed_precision: str,
    compiled: bool,
    checkpointing: bool,
    peak_flops: float,
    hbm_bytes_per_s: float,
) -> ComputeWork:
    """The parts of one micro-step of `tokens` tokens on one GPU; a model without transformer
    sizes costs its matmuls and optimizer only (its elementwise work is unknown)."""
    again = 1 + CHECKPOINTING_FORWARD if checkpointing else 1.0
    bandwidth = hbm_bytes_per_s * HBM_EFFICIENCY
    matmul = shape.flops_per_token(seq_len) * tokens * again / (peak_flops * MATMUL_EFFICIENCY)
    elementwise = loss = 0.0
    if shape.dims is not None:
        per_token = ELEMENTWISE_PASSES[compiled] * shape.dims.width * shape.dims.layers
        elementwise = per_token * elementwise_bytes(precision, mixed_precision) * tokens * again / bandwidth
        loss = LOSS_BYTES_PER_LOGIT[compiled] * shape.dims.vocab * tokens / bandwidth
    optimizer = OPTIMIZER_BYTES_PER_PARAM * shape.params / bandwidth
    return ComputeWork(matmul, elementwise, loss, optimizer)
