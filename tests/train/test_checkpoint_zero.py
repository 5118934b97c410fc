"""DeepSpeed ZeRO checkpoints: exact resume after a SIGKILL, export, a resume under `ddp`,
and a world-size change refused in one line. The resume, export and refusal checks also run for
Accelerate's modes (test_checkpoint_accelerate has the rest of Accelerate's).

Each 2-rank run costs ~10 s on two cores, mostly start-up: one straight 20-step run per
strategy serves every check that needs a checkpoint or a reference curve.
Every resumed curve is held to its own strategy's uninterrupted run bit for bit: the
fp32 master weights, Adam's moments, the generators and the step all come back.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import runner
from harness.train.checkpoint import CheckpointError, CheckpointManager, param_shapes, verify
from models.zoo import build_model
from strategies.base import RunContext
from strategies.deepspeed import DeepSpeedStrategy
from strategies.registry import default_registry
from tests.helpers import made_once
from tests.train.test_checkpoint import SUM_ORDER_RTOL, _loss_on_step, launch, log, losses

_NEEDS_ACCELERATE = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("accelerate", "transformers")),
    reason="needs accelerate and transformers",
)
_EXTENDED = pytest.mark.extended
# Exported on every change: the two checkpoints the kills below train anyway; zero1's, zero2's and
# accelerate-ddp's, each a straight run of its own, under --all.
RESUMABLE = (
    pytest.param("zero1", marks=_EXTENDED),
    pytest.param("zero2", marks=_EXTENDED),
    "zero3",
    pytest.param("accelerate-ddp", marks=[_NEEDS_ACCELERATE, _EXTENDED]),
    pytest.param("accelerate-zero2", marks=_NEEDS_ACCELERATE),
)
# A kill and resume=auto once per checkpoint path: ZeRO-3's partitioned parameters, and ZeRO-1/2's
# optimizer partitions (one class in DeepSpeed, saved and loaded alike) through Accelerate, which
# drives the same engine's save_checkpoint and load_checkpoint. Every name's checkpoint, zero1's,
# zero2's and accelerate-ddp's among them, is still exported and checked below.
KILLED_AND_RESUMED = ["zero3", pytest.param("accelerate-zero2", marks=_NEEDS_ACCELERATE)]
# Room for DeepSpeed's import and engine set-up on a loaded two-core host.
RUN_TIMEOUT = 480

pytestmark = [
    pytest.mark.skipif(
        DeepSpeedStrategy.unavailable_reason() is not None, reason=str(DeepSpeedStrategy.unavailable_reason())
    ),
    pytest.mark.timeout(600),
]


@functools.cache
def straight_run(strategy: str, base: Path) -> Path:
    """20 uninterrupted steps, checkpoints at 10 and 20: trained once per session, shared by
    every check (and with test_checkpoint_accelerate, whichever xdist worker runs it)."""

    def make(out: Path) -> None:
        proc = launch(strategy, out, timeout=RUN_TIMEOUT)
        assert proc.returncode == 0, log(proc)

    return made_once(base, f"straight-{strategy}", make)


def killed_and_resumed(strategy: str, out: Path) -> tuple[list[str], str]:
    """Rank 1 SIGKILLed once step 10 and its checkpoint are done, then `resume=auto` to step 20:
    the checkpoints the kill left behind, and the resumed run's stdout."""
    killed = launch(strategy, out, fault="kill@1:10", timeout=RUN_TIMEOUT)
    assert killed.returncode != 0, log(killed)
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    resumed = launch(strategy, out, "resume=auto", timeout=RUN_TIMEOUT)
    assert resumed.returncode == 0, log(resumed)
    return left, resumed.stdout


@functools.cache
def continued(strategy: str, source: Path, base: Path) -> tuple[Path, str]:
    """`strategy` started from the checkpoint `source` (another format: weights only): its out_dir
    and stdout, once per session."""
    out = base / f"{strategy}-from-{source.parent.parent.name}"
    proc = launch(strategy, out, f"resume={source}", timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, log(proc)
    return out, proc.stdout


@pytest.mark.parametrize("strategy", KILLED_AND_RESUMED)
def test_killed_rank_then_resume_matches_the_uninterrupted_run_bit_for_bit(strategy, tmp_path_factory, tmp_path):
    reference = losses(straight_run(strategy, tmp_path_factory.getbasetemp()))
    left, stdout = killed_and_resumed(strategy, tmp_path / "killed")
    assert left == ["step_10"]
    assert "resumed at step 10" in stdout and "model and optimizer state" in stdout
    assert losses(tmp_path / "killed") == reference


@pytest.mark.parametrize("strategy", RESUMABLE)
def test_export_loads_strictly_and_gives_the_live_models_loss(strategy, tmp_path_factory, tmp_path):
    out = straight_run(strategy, tmp_path_factory.getbasetemp())
    target = tmp_path / f"{strategy}.safetensors"
    assert runner.main(["export", str(out / "checkpoints" / "step_10"), str(target)]) == 0
    weights = load_file(target)
    assert all(t.dtype == torch.float32 for t in weights.values())
    # Tied: the embedding and the head come back as two equal tensors, each under its name.
    assert torch.equal(weights["wte.weight"], weights["lm_head.weight"])
    # Step 11's batch is held out from the step-10 weights; training logged their loss on it.
    assert _loss_on_step(weights, 10) == pytest.approx(losses(out)[11], rel=SUM_ORDER_RTOL)


def test_a_zero3_checkpoint_continues_under_ddp_with_its_weights(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    zero3 = straight_run("zero3", base)
    out, stdout = continued("ddp", zero3 / "checkpoints" / "step_10", base)
    assert "weights only" in stdout and "optimizer starts afresh" in stdout
    continued_losses, reference = losses(out), losses(zero3)
    assert sorted(continued_losses) == list(range(11, 21))
    # Step 11 runs on the carried weights before any optimizer step: the same loss.
    assert continued_losses[11] == pytest.approx(reference[11], rel=SUM_ORDER_RTOL)
    # From step 12 on, Adam restarts from zero moments: the curve departs from zero3's.
    assert continued_losses[12] != pytest.approx(reference[12], rel=1e-4)


def test_a_world_size_change_is_refused_in_one_line(tmp_path_factory):
    """Plain ZeRO checkpoints hold one optimizer partition per rank, and DeepSpeed 0.19.8 loads
    them at their own world size only: refused before anything is loaded, the checkpoint intact."""
    checkpoint = straight_run("zero3", tmp_path_factory.getbasetemp()) / "checkpoints" / "step_10"
    assert refuse_one_rank("zero3", checkpoint) == (
        f"checkpoint {checkpoint} was saved by 2 ranks and zero3 cannot reshard it to 1: resume with nproc=2, or "
        "under a strategy of another checkpoint format to carry the weights over"
    )
    verify(checkpoint)


@_NEEDS_ACCELERATE
def test_a_world_size_change_is_refused_in_one_line_for_the_accelerate_zero_modes(tmp_path_factory):
    checkpoint = straight_run("accelerate-zero2", tmp_path_factory.getbasetemp()) / "checkpoints" / "step_10"
    assert "saved by 2 ranks and accelerate-zero2 cannot reshard it to 1: resume with nproc=2" in refuse_one_rank(
        "accelerate-zero2", checkpoint
    )


def refuse_one_rank(strategy: str, checkpoint: Path) -> str:
    """The error restoring the 2-rank `checkpoint` into `strategy` on one rank gives (in-process:
    the world-size check comes before the backend is set up or anything is read)."""
    ctx = RunContext(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        precision="fp32",
        micro_batch=8,
        grad_accum=1,
        grad_clip=1.0,
    )
    target = default_registry().create(strategy, ctx)
    manager = CheckpointManager(checkpoint.parent, rank=0, world_size=1, keep_last=2)
    shapes = param_shapes(build_model("gpt-nano"))
    with pytest.raises(CheckpointError) as err:
        manager.restore(
            checkpoint, verify(checkpoint), target, shapes, bare_model=lambda: build_model("gpt-nano"), config={}
        )
    return str(err.value)
