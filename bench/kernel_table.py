#!/usr/bin/env python3
"""This GPU's kernel table: what the planner's speed model takes from published figures, timed here,
written where the planner reads it for this card (harness/plan/speed/kernel_table.py describes the
file and what each part replaces).

  host_s_per_kernel  an eager and a compiled training step's host time per kernel: parabench's GPT
                     (64 wide, one sequence of 32 tokens, so the GPU idles on the host), forward and
                     backward, at 12 and at 24 blocks, its kernels counted once under torch.profiler
                     and the steps timed without it (each model's fastest of five rounds, the two
                     models' rounds in turn); host time = the two step times' difference over the two
                     kernel counts' difference (a step's fixed cost cancels)
  memory_efficiency  eager elementwise kernels over 256 MiB tensors (add, mul, GELU, LayerNorm
                     forward), bytes read and written over the kernel's time, over the data sheet's
                     bandwidth: their median
  matmuls            bf16 matmuls of the shapes tensor parallelism's splits give a GPT block's four
                     projections (width x 3 width, x width, x 4 width, 4 width x width, the output
                     or input over tp), forward and both gradients, by width, tp and tokens
  attention          SDPA's FlashAttention-2 and cuDNN backends, causal, bf16, 16k tokens a call at
                     hidden 2048, by sequence and head dim, at the rate attention.py counts

Every kernel is timed on the device (the profiler's kernel durations): a launch and a wait for
the result are the host's, which host_s_per_kernel measures on its own.

On a GPU machine, from the repository root (about a minute on an H200):

    python bench/kernel_table.py                 # writes harness/plan/speed/kernel_tables/<card>.json
    python bench/kernel_table.py --out my.json   # elsewhere
    python bench/kernel_table.py --dry-run --out /tmp/t.json   # tiny sizes on the CPU: checks the script only

A card the planner does not know (harness/common/hardware.py) is one line saying so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_timing import device_seconds  # noqa: E402
from harness.common.hardware import GPUS, gpu_spec  # noqa: E402
from harness.plan.speed.attention import causal_attention_flops  # noqa: E402
from harness.plan.speed.kernel_table import TABLES  # noqa: E402
from models.gpt import GPT, GPTConfig  # noqa: E402

WIDTHS, TPS, TOKENS = (1024, 2048, 4096, 8192), (1, 2, 4, 8), (512, 2048, 8192, 32768)
QUICK = dict(widths=(1024, 4096), tps=(1, 8), tokens=(2048,))
SEQS, HEAD_DIMS, ATTENTION_TOKENS, ATTENTION_HIDDEN = (512, 1024, 2048, 4096, 8192, 16384), (64, 128), 16384, 2048
HOST_MODEL = GPTConfig(n_layer=12, n_head=4, n_embd=64, vocab_size=256, block_size=64)
HOST_LAYERS = (12, 24)
HOST_ROUNDS = 5
ELEMENTWISE_BYTES = 256 * 2**20
REPEATS = 5


class Timer:
    """Device time of a callable: on a GPU the summed durations of the kernels it runs, as
    torch.profiler reads them from the device, so that neither the launch nor the host's wait for
    the result counts (a wall clock around one small matmul reads the launch: 33 us for a 5 us
    kernel behind an H200's host); the wall clock on the CPU (--dry-run), which has no such split."""

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def seconds(self, once: Callable[[], object], repeats: int = REPEATS) -> float:
        once()  # warm-up: kernel selection, allocator
        if self.device.type != "cuda":
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                once()
                best = min(best, time.perf_counter() - start)
            return best
        return device_seconds(once, repeats)


def host_per_kernel(device: torch.device, timer: Timer, compiled: bool, steps: int) -> float:
    """Host seconds per kernel of training steps that are all host: the step time of the deeper of
    HOST_LAYERS' models less the shallower's, over the kernels the extra blocks launch (counted under
    the profiler). What a step costs whatever its size (autograd's start, a compiled graph's guards
    and wrapper) cancels, as it does in a large model's step, where it is spread over many kernels.
    Each model's time is its fastest of HOST_ROUNDS rounds of `steps` steps, the two models' rounds
    taken in turn, so that another process's work on the host slows some rounds of both, not one model."""
    (shallow, shallow_kernels), (deep, deep_kernels) = (
        _host_step(device, timer, compiled, layers) for layers in HOST_LAYERS
    )
    rounds: tuple[list[float], list[float]] = ([], [])
    for _ in range(HOST_ROUNDS):
        for step, times in zip((shallow, deep), rounds, strict=True):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            timer.sync()
            times.append((time.perf_counter() - start) / steps)
    return (min(rounds[1]) - min(rounds[0])) / max(deep_kernels - shallow_kernels, 1)


def _host_step(device: torch.device, timer: Timer, compiled: bool, layers: int) -> tuple[Callable[[], None], int]:
    """A training step of a `layers`-block HOST_MODEL, forward and backward, warmed up, and the kernels it
    launches."""
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(HOST_MODEL, n_layer=layers)).to(device)
    # On the CPU (--dry-run) only Dynamo's capture, no code generation: the path, not the figure.
    run = torch.compile(model, backend="inductor" if device.type == "cuda" else "eager") if compiled else model
    inputs = torch.randint(0, HOST_MODEL.vocab_size, (1, 32), device=device)

    def step() -> None:
        run(inputs, inputs).backward()

    for _ in range(3):
        step()
    on_gpu = device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if on_gpu else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        step()
        timer.sync()
    launched = DeviceType.CUDA if on_gpu else DeviceType.CPU  # the CPU's operators stand for kernels there
    return step, sum(1 for e in prof.events() if e.device_type == launched)


def memory_efficiency(device: torch.device, timer: Timer, data_sheet: float, size: int) -> float:
    """The median share of the data sheet's bandwidth eager elementwise kernels reach."""
    n = size // 2
    x, y = (torch.randn(n, device=device, dtype=torch.bfloat16) for _ in range(2))
    rows = x.view(-1, 1024)
    kernels = {
        "add": (lambda: x + y, 3 * size),
        "mul": (lambda: x * y, 3 * size),
        "gelu": (lambda: F.gelu(x), 2 * size),
        "layer_norm": (lambda: F.layer_norm(rows, (1024,)), 2 * size),
    }
    rates = [moved / timer.seconds(call) / data_sheet for call, moved in kernels.values()]
    return statistics.median(rates)


def matmul_shapes(widths, tps, tokens) -> list[tuple[int, int, int]]:
    """(m, n, k) of a GPT block's projections on one of tp GPUs, forward and both gradients."""
    shapes = set()
    for width in widths:
        for tp in tps:
            for out, into in (
                (3 * width // tp, width),
                (width, width // tp),
                (4 * width // tp, width),
                (width, 4 * width // tp),
            ):
                for t in tokens:
                    shapes |= {(t, out, into), (t, into, out), (out, into, t)}
    return sorted(shapes)


def matmuls(device: torch.device, timer: Timer, shapes) -> list[list[float]]:
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        out.append([m, n, k, timer.seconds(lambda a=a, b=b: a @ b)])
    return out


def attention(device: torch.device, timer: Timer, seqs, head_dims, tokens: int, hidden: int) -> dict:
    """Forward+backward TFLOP/s by backend, sequence and head dim, as attention.py counts them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    table: dict[str, list[list[float]]] = {name: [] for name in backends}
    for seq in seqs:
        for dim in head_dims:
            batch, heads = max(1, tokens // seq), hidden // dim
            q, k, v = (
                torch.randn(batch, heads, seq, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            flops = 3.5 * causal_attention_flops(batch, seq, heads, dim)
            for name, backend in backends.items():

                def once(backend=backend, q=q, k=k, v=v) -> None:
                    with sdpa_kernel([backend]):
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

                try:
                    table[name].append([seq, dim, flops / timer.seconds(once) / 1e12])
                except RuntimeError:  # the backend does not take this shape on this card
                    continue
    return {name: points for name, points in table.items() if points}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where to write the table (default: the planner's, for this card)")
    parser.add_argument("--quick", action="store_true", help="fewer matmul shapes")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: checks the script only")
    args = parser.parse_args(argv)
    if args.dry_run:
        if args.out is None:
            parser.error("--dry-run writes only where --out says (never over a card's table)")
        device, card, data_sheet = torch.device("cpu"), "dry-run (CPU)", 50e9
    elif not torch.cuda.is_available():
        print("bench/kernel_table.py times this GPU's kernels: run it on a GPU machine", file=sys.stderr)
        return 2
    else:
        device, name = torch.device("cuda"), torch.cuda.get_device_name()
        spec = gpu_spec(name)
        card = next((key for key, s in GPUS.items() if s is spec), None)
        if card is None:
            print(f"{name}: not a card of harness/common/hardware.py: add it there first", file=sys.stderr)
            return 2
        data_sheet = spec.hbm_bytes_per_s
    timer = Timer(device)
    sizes = QUICK if args.quick or args.dry_run else dict(widths=WIDTHS, tps=TPS, tokens=TOKENS)
    if args.dry_run:
        sizes = dict(widths=(64,), tps=(1, 2), tokens=(32,))
    table = {
        "source": (
            f"{card}: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}, "
            f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}, `python bench/kernel_table.py"
            f"{' --quick' if args.quick else ''}{' --dry-run' if args.dry_run else ''}`"
        ),
        "host_s_per_kernel": {
            "eager": host_per_kernel(device, timer, False, 3 if args.dry_run else 50),
            "compiled": host_per_kernel(device, timer, True, 3 if args.dry_run else 50),
        },
        "memory_efficiency": min(
            1.0, memory_efficiency(device, timer, data_sheet, 2**20 if args.dry_run else ELEMENTWISE_BYTES)
        ),
        "matmuls": matmuls(device, timer, matmul_shapes(**sizes)),
        "attention": {}
        if args.dry_run
        else attention(device, timer, SEQS, HEAD_DIMS, ATTENTION_TOKENS, ATTENTION_HIDDEN),
    }
    out = args.out or TABLES / f"{card}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(
        f"{out}: host {table['host_s_per_kernel']}, memory {table['memory_efficiency']:.3f}, "
        f"{len(table['matmuls'])} matmuls, attention {sorted(table['attention'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
