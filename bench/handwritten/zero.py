"""Hand-written reference: DeepSpeed ZeRO-1/2/3, launched by torchrun.

    torchrun --standalone --nproc_per_node=1 bench/handwritten/zero.py --stage 3 [--ds-config tuned.json]

deepspeed.initialize with a client torch AdamW (fused on CUDA; DeepSpeed's FusedAdam
needs an nvcc JIT build that fails on some images), DeepSpeed's bf16 mode, clipping
at 1.0 by the engine, the rest of the config left at DeepSpeed's defaults unless
--ds-config gives a JSON whose keys are merged over it (zero_optimization merged
key by key). Named zero.py, not deepspeed.py, so it does not shadow the package.
Prints one JSON line from rank 0.
"""

from __future__ import annotations

import json

import torch
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


def extra(p) -> None:
    p.add_argument("--stage", type=int, choices=(1, 2, 3), required=True)
    p.add_argument("--ds-config", default=None, help="JSON merged over the built DeepSpeed config")


def ds_config(args, world: int) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": args.micro_batch * world,
        "gradient_clipping": args.grad_clip,
        "bf16": {"enabled": args.precision == "bf16"},
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if args.ds_config:
        user = json.loads(open(args.ds_config).read())
        config["zero_optimization"].update(user.pop("zero_optimization", {}))
        config.update(user)
    return config


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], extra)
    import deepspeed

    device = local_device(args)
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        model = build_model(args).to(device)
        optimizer = torch.optim.AdamW(
            param_groups(model, args.weight_decay),
            lr=args.lr,
            betas=(args.beta1, args.beta2),
            fused=device.type == "cuda" or None,
        )
        config = ds_config(args, world)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        batches = Batches(args, model.vocab_size, device, rank, world)

        def train_step(step: int) -> torch.Tensor:
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = batches.get(step)
            loss = engine(inputs, targets)
            engine.backward(loss)
            engine.step()  # clips, steps and zeroes the gradients
            return loss

        report(
            f"zero{args.stage}",
            args,
            device,
            timed_loop(train_step, args, device),
            world,
            rank,
            deepspeed=deepspeed.__version__,
            zero_optimization=config["zero_optimization"],
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
