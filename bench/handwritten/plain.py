"""Hand-written reference: one GPU, no process group, no wrapper.

    python bench/handwritten/plain.py [--compile] [--activation-checkpointing] [--steps N ...]

bf16 through autocast (fp32 weights and optimizer), fused AdamW, clipping at 1.0,
gradients set to None. Prints one JSON line (see _common.report).
"""

from __future__ import annotations

import contextlib

import torch
from _common import Batches, build_model, local_device, lr_at, param_groups, parse_args, report, timed_loop


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    device = local_device(args)
    model = build_model(args).to(device)
    optimizer = torch.optim.AdamW(
        param_groups(model, args.weight_decay),
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        fused=device.type == "cuda" or None,
    )
    forward = torch.compile(model) if args.compile else model  # the whole model, loss included
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else contextlib.nullcontext()
    )
    batches = Batches(args, model.vocab_size, device)

    def train_step(step: int) -> torch.Tensor:
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = batches.get(step)
        with autocast:
            loss = forward(inputs, targets)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    report("plain", args, device, timed_loop(train_step, args, device))


if __name__ == "__main__":
    main()
