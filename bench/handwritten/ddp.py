"""Hand-written reference: DistributedDataParallel, launched by torchrun.

    torchrun --standalone --nproc_per_node=1 bench/handwritten/ddp.py [--compile] [--steps N ...]

nanoGPT's order: compile the model, then wrap it; bf16 through autocast, gradients
as views of the all-reduce buckets, fused AdamW, clipping at 1.0. Each rank reads
its slice of the global batch. Prints one JSON line from rank 0.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from _common import (
    Batches,
    build_model,
    exit_without_teardown,
    local_device,
    lr_at,
    param_groups,
    parse_args,
    report,
    timed_loop,
)
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    device = local_device(args)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        model = build_model(args).to(device)
        optimizer = torch.optim.AdamW(
            param_groups(model, args.weight_decay),
            lr=args.lr,
            betas=(args.beta1, args.beta2),
            fused=device.type == "cuda" or None,
        )
        wrapped = torch.compile(model) if args.compile else model
        wrapped = DDP(
            wrapped, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
        )
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else contextlib.nullcontext()
        )
        batches = Batches(args, model.vocab_size, device, rank, world)

        def train_step(step: int) -> torch.Tensor:
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = batches.get(step)
            with autocast:
                loss = wrapped(inputs, targets)
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        report("ddp", args, device, timed_loop(train_step, args, device), world, rank)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
