"""What Megatron-DeepSpeed's two blocking copies in each layer's forward cost a small micro-step on
this GPU, beside what the plan prices them at (host_issue.py's LAYER_SYNCS, the `layer_syncs` token of
vTrain's published rows: docs/planner.md, "The layer's copies").

Each point steps parabench's GPT as vTrain's one-node runs are shaped (24 layers of width 1,024, 16
heads, sequence 1,024, bf16 autocast, every block recomputed in the backward) through one micro-step,
forward and backward, twice: as it is, and with two scalars made on the GPU before each block's MLP as
Megatron-DeepSpeed's ParallelTransformerLayer makes them (`torch.tensor(0.0, device=...)`, a copy that
waits for the stream), in the forward and in the recomputed one alike. Micro-batch 1 to 8: the copies
cost most where the GPU's work per op is small. Beside each, the plan of the same model on this card
both ways (strategy `single`, full checkpointing).

    python bench/layer_syncs.py --out bench/results/layer_syncs_<gpu>.md   # on a GPU machine
    python bench/layer_syncs.py --dry-run            # on a CPU: a tiny model's code path, planned on an A100
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_timing import best_seconds  # noqa: E402
from harness.common.hardware import GPUS, gpu_spec  # noqa: E402
from harness.plan.plan_cli import PlanConfig, question  # noqa: E402
from harness.plan.predict import plan_backend, plan_strategy  # noqa: E402
from harness.plan.speed.host_issue import LAYER_SYNC_COPIES, LAYER_SYNCS  # noqa: E402
from models.gpt import GPT, GPTConfig  # noqa: E402

MODEL = GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, block_size=1024)
DRY_MODEL = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16)
MICRO_BATCHES = (1, 2, 4, 8)
REPEATS = 5


def with_layer_copies(model: GPT) -> list[int]:
    """Two blocking copies to the model's device before each block's MLP, as Megatron-DeepSpeed's layer
    makes its `moe_loss` and `mlp_bias`; the returned list counts them (one entry per copy made)."""
    made: list[int] = []

    def copies(module: torch.nn.Module, args: tuple) -> None:
        device = args[0].device
        for _ in range(LAYER_SYNC_COPIES):
            torch.tensor(0.0, device=device)
            made.append(1)

    for block in model.transformer_blocks():
        block.mlp.register_forward_pre_hook(copies)
    return made


def micro_step_seconds(cfg: GPTConfig, micro_batch: int, copies: bool, device: torch.device, repeats: int) -> float:
    """The best of `repeats` micro-steps (forward and backward, every block recomputed) of `cfg`, each
    timed to the end of its GPU work."""
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    model.activation_checkpointing = True
    if copies:
        with_layer_copies(model)
    tokens = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.block_size), device=device)

    def once() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(tokens, tokens)
        loss.backward()

    once()
    return best_seconds(once, repeats)


def planned_seconds(cfg: GPTConfig, micro_batch: int, card: str, copies: bool) -> float:
    """The plan's micro-step of `cfg` on `card` (strategy `single`, full checkpointing, bf16), with or
    without the layers' copies."""
    shape = dict(layers=cfg.n_layer, width=cfg.n_embd, heads=cfg.n_head, vocab=cfg.vocab_size, seq_len=cfg.block_size)
    run = dict(gpu=card, gpus=1, micro_batch=micro_batch, activation_checkpointing="full", strategies=["single"])
    config = PlanConfig(**shape, **run)
    plan = plan_strategy("single", question(config))
    if copies:
        plan = plan_backend(
            replace(plan.backend, options={**plan.backend.options, LAYER_SYNCS: True}), question(config)
        )
    return plan.time.step_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU: a tiny model, the A100's plan")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, cfg, card, repeats = torch.device("cpu"), DRY_MODEL, "A100", 1
    elif not torch.cuda.is_available():
        print("layer_syncs.py times a GPU's micro-steps: run it on a GPU machine (or --dry-run)", file=sys.stderr)
        return 2
    else:
        name = torch.cuda.get_device_name()
        spec = gpu_spec(name)
        card = next((key for key, s in GPUS.items() if s is spec), None)
        if card is None:
            print(f"layer_syncs.py: the planner does not know the {name}: nothing to set it beside", file=sys.stderr)
            return 2
        device, cfg, repeats = torch.device("cuda"), MODEL, REPEATS
    lines = [
        f"# Two blocking copies in each layer's forward: {card} ({device.type}, torch {torch.__version__})",
        "",
        f"Command: `python bench/layer_syncs.py{' --dry-run' if args.dry_run else ''}`. parabench's GPT of "
        f"{cfg.n_layer} layers, width {cfg.n_embd}, {cfg.n_head} heads, sequence {cfg.block_size}, bf16 autocast, "
        "every block recomputed; one micro-step (forward and backward), milliseconds, measured beside planned "
        f"(`single` on the {card}, the copies as `layer_syncs`).",
        "",
        "| micro-batch | measured | with copies | ratio | planned | with copies | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for micro_batch in MICRO_BATCHES:
        measured = [micro_step_seconds(cfg, micro_batch, copies, device, repeats) for copies in (False, True)]
        planned = [planned_seconds(cfg, micro_batch, card, copies) for copies in (False, True)]
        cells = [f"{s * 1e3:.2f}" for s in measured] + [f"{measured[1] / measured[0]:.3f}"]
        cells += [f"{s * 1e3:.2f}" for s in planned] + [f"{planned[1] / planned[0]:.3f}"]
        lines.append(f"| {micro_batch} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
