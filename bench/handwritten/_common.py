"""What every hand-written loop shares, and nothing that decides speed.

Each loop in this folder is written the way one would write it for that backend
alone: it imports only the model (models/gpt.py) and the data (models/data.py)
from parabench (and the step profiler, harness/train/profiling.py, so that both sides are
measured alike), never its strategies or its training harness. This module holds the parts
that are the same in every loop and cost nothing in the hot loop: arguments, the
seeded model, the batches (same samples in the same order as `runner.py train`),
the learning-rate schedule, the timer and the one JSON line each loop prints.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from harness.train.profiling import StepProfiler  # noqa: E402
from models.data import MarkovData  # noqa: E402
from models.gpt import GPT, PRESETS  # noqa: E402

# Dense bf16 peak FLOP/s (vendor data sheets); most specific names first.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=40, help="optimizer steps in all")
    p.add_argument("--warmup", type=int, default=8, help="first steps left out of the timing")
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--data-samples", type=int, default=1024, help="sequences in the synthetic data set")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--lr-warmup", type=int, default=2, help="linear learning-rate warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in backward")
    p.add_argument(
        "--profile-steps",
        default="",
        help="consecutive steps, numbered from 1, to run under "
        "torch.profiler, e.g. 6,7,8 (bench/profile_step.py); they run slower",
    )
    p.add_argument("--profile-dir", default="profile", help="where each rank writes rank<r>.trace.json")
    if extra:
        extra(p)
    args = p.parse_args()
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup={args.warmup} must be at least 0 and below --steps={args.steps}")
    args.profile_steps = [int(n) for n in args.profile_steps.split(",") if n.strip()]
    if args.profile_steps and (
        args.profile_steps != list(range(args.profile_steps[0], args.profile_steps[-1] + 1))
        or args.profile_steps[0] < 1
        or args.profile_steps[-1] > args.steps
    ):
        p.error(f"--profile-steps={args.profile_steps} must be consecutive steps between 1 and --steps={args.steps}")
    return args


def local_device(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def build_model(args: argparse.Namespace) -> GPT:
    """The same weights as `runner.py train`: seeded, built on the CPU before anything else.

    The parameter count and flops per token are taken here, before any wrapper: ZeRO-3
    leaves partitioned parameters with no elements.
    """
    torch.manual_seed(args.seed)
    model = GPT(PRESETS[args.model])
    model.activation_checkpointing = args.activation_checkpointing
    args.num_params = model.num_params()
    args.flops_per_token = model.flops_per_token(args.seq_len)
    return model


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's split: matrices and embeddings decay, biases and norms do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine to min_lr at the last step (nanoGPT's get_lr)."""
    if step < args.lr_warmup:
        return args.lr * (step + 1) / (args.lr_warmup + 1)
    if args.steps <= args.lr_warmup + 1:
        return args.lr
    progress = (step - args.lr_warmup) / (args.steps - 1 - args.lr_warmup)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (args.lr - args.min_lr)


class Batches:
    """Step k's batch: the same samples, in the same order, as runner.py's global-batch schedule.

    One permutation per epoch; the (B, T+1) token block is pinned and copied to the
    device in one contiguous non-blocking copy, and split into inputs and targets there.
    """

    def __init__(
        self, args: argparse.Namespace, vocab_size: int, device: torch.device, rank: int = 0, world_size: int = 1
    ):
        self.data = MarkovData(vocab_size, args.seq_len, args.data_samples, args.seed)
        self.global_batch = args.micro_batch * world_size
        if args.data_samples < self.global_batch:
            raise SystemExit(f"--data-samples={args.data_samples} is below the global batch {self.global_batch}")
        self.steps_per_epoch = args.data_samples // self.global_batch
        self.seed, self.device = args.seed, device
        self.lo, self.hi = rank * args.micro_batch, (rank + 1) * args.micro_batch
        self.pin = device.type == "cuda"
        self._epoch, self._perm = -1, None

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.data))
        indices = self._perm[k * self.global_batch : (k + 1) * self.global_batch][self.lo : self.hi]
        rows = torch.from_numpy(self.data.tokens[indices])
        if self.pin:
            rows = rows.pin_memory()
        rows = rows.to(self.device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(train_step: Callable[[int], torch.Tensor], args: argparse.Namespace, device: torch.device) -> dict:
    """Run every step; time those after the warm-up from wall time between two synchronisations.

    The loss stays on the device until the end: no host sync inside the loop. Peak
    memory is the process's peak since start (the model was moved after start).
    """
    loss = None
    # The runner's own profiler: both sides measured by the same instrument, the same step marks.
    rank = int(os.environ.get("RANK", "0"))
    profiler = StepProfiler(args.profile_steps, Path(args.profile_dir), rank, device)
    started = time.perf_counter()
    for step in range(args.steps):
        if step == args.warmup:
            synchronize(device)
            started = time.perf_counter()
        with profiler.step(step):
            loss = train_step(step)
    synchronize(device)
    elapsed = time.perf_counter() - started
    timed = args.steps - args.warmup
    return {"elapsed_s": elapsed, "timed_steps": timed, "final_loss": float(loss.detach().float().item())}


def report(
    backend: str,
    args: argparse.Namespace,
    device: torch.device,
    timing: dict,
    world_size: int = 1,
    rank: int = 0,
    **extra,
) -> dict:
    """Print the run's one JSON line (rank 0) and return it."""
    tokens_per_step = args.micro_batch * world_size * args.seq_len
    tokens_per_s = tokens_per_step * timing["timed_steps"] / timing["elapsed_s"]
    fpt = args.flops_per_token  # 6N + 12·L·H·Q·T, as models/gpt.py counts it
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None) if args.precision == "bf16" else None
    out = {
        "bench": "handwritten",
        "backend": backend,
        "model": args.model,
        "device": name,
        "world_size": world_size,
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "precision": args.precision,
        "steps": args.steps,
        "timed_steps": timing["timed_steps"],
        "tokens_per_s": tokens_per_s,
        "step_time_s": timing["elapsed_s"] / timing["timed_steps"],
        "mfu": tokens_per_s * fpt / (peak * world_size) if peak else None,
        "flops_per_token": fpt,
        "num_params": args.num_params,
        "peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
        "final_loss": timing["final_loss"],
        "compile": args.compile,
        "activation_checkpointing": args.activation_checkpointing,
        "torch": torch.__version__,
        **extra,
    }
    if rank == 0:
        print(json.dumps(out), flush=True)
    return out


def exit_without_teardown() -> None:
    """End a finished multi-process loop without the interpreter's teardown of its objects: on a
    CPU, gloo's worker threads can still hold work that references tensors, and destroying them
    aborts the process ("terminate called without an active exception") after a complete run.
    Output is flushed first; runner.py's workers end the same way (harness/train/train_cli.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
