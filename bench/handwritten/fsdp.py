"""Hand-written reference: FSDP2 `fully_shard`, each block then the root, launched by torchrun.

    torchrun --standalone --nproc_per_node=1 bench/handwritten/fsdp.py [--compile] [--no-reshard-after-forward]

As torchtitan does it: compile per block (before sharding), mixed precision through
MixedPrecisionPolicy (bf16 compute, fp32 gradient reduction), the root not resharded
after forward (backward needs it at once), fused AdamW over the DTensor shards,
clipping by the global norm. Prints one JSON line from rank 0.
"""

from __future__ import annotations

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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def extra(p) -> None:
    p.add_argument(
        "--no-reshard-after-forward",
        action="store_true",
        help="keep each block's parameters gathered from forward to backward (ZeRO-2-like)",
    )


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], extra)
    device = local_device(args)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        mesh = init_device_mesh(device.type, (world,))
        model = build_model(args).to(device)
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if args.precision == "bf16"
            else MixedPrecisionPolicy()
        )
        for block in model.blocks:
            if args.compile:
                block.compile()
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=not args.no_reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        optimizer = torch.optim.AdamW(
            param_groups(model, args.weight_decay),
            lr=args.lr,
            betas=(args.beta1, args.beta2),
            fused=device.type == "cuda" or None,
        )
        params = list(model.parameters())
        batches = Batches(args, model.vocab_size, device, rank, world)

        def train_step(step: int) -> torch.Tensor:
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = batches.get(step)
            loss = model(inputs, targets)
            loss.backward()
            if args.grad_clip > 0:
                grads = [p.grad for p in params if p.grad is not None]
                norm = torch.nn.utils.get_total_norm(grads, foreach=True)
                if isinstance(norm, DTensor):
                    norm = norm.full_tensor()  # the norm over every rank's shard
                torch.nn.utils.clip_grads_with_norm_(params, args.grad_clip, norm, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        report(
            "fsdp",
            args,
            device,
            timed_loop(train_step, args, device),
            world,
            rank,
            reshard_after_forward=not args.no_reshard_after_forward,
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
