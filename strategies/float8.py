"""precision=fp8: the blocks' linear layers train in float8 through torchao, as torchtitan does.

`convert_to_float8_training` swaps each nn.Linear inside the model's blocks for torchao's
Float8Linear: its three matmuls (output, input gradient, weight gradient) take float8 operands
(e4m3 forward, e5m2 gradients), scaled per tensor (`fp8_scaling=tensorwise`) or per row
(`rowwise`, more accurate, slower). Everything else (embeddings, norms, attention, the head, the
loss) runs as precision=bf16 does, so a run's dtype, rounding and peak FLOP/s are bf16's
(configs/schema.py compute_precision). The head stays in bf16 as torchtitan leaves it, and a layer
whose sizes are not multiples of 16 stays too (float8 matmuls need them).

Under FSDP2 with tensorwise scaling, parameters are all-gathered in float8 (`fp8_all_gather`,
on by default): half the bytes of a bf16 gather. Their scales are then computed for every layer
at once before the first step and after each optimizer step (torchao's
precompute_float8_dynamic_scale_for_fsdp), one all-reduce instead of one per layer.

Where it runs: a CUDA GPU with float8 tensor cores (compute capability 8.9 or newer: H100, H200,
L40S, RTX 4090...), and the CPU, where torch's scaled matmul gives float8's numerics with no speed
to speak of (the CPU tests train through it). Strategies declare whether they train in fp8
(Strategy.trains_fp8); a compare skips the others with the reason.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from strategies.base import ModelUnsupported, StrategyError, missing_package_reason

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from models.blocks import Blocks
    from strategies.base import Strategy
    from strategies.registry import StrategyEntry

FP8_MIN_CAPABILITY = (8, 9)
INSTALL = "pip install 'parabench[fp8]' (torchao)"
MATMUL_MULTIPLE = 16  # torch._scaled_mm takes sizes divisible by 16


def fp8_unavailable_reason(device: torch.device) -> str | None:
    """Why precision=fp8 cannot train on `device` here, or None when it can."""
    missing = missing_package_reason("torchao", INSTALL)
    if missing or device.type != "cuda":
        return missing
    import torch

    capability = torch.cuda.get_device_capability(device)
    if capability >= FP8_MIN_CAPABILITY:
        return None
    return (
        f"{torch.cuda.get_device_name(device)} has no float8 tensor cores (compute capability "
        f"{capability[0]}.{capability[1]}; fp8 needs {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or newer, "
        "e.g. H100): run precision=bf16"
    )


def check_fp8(entry: StrategyEntry, device: torch.device) -> None:
    """Before any worker starts: a strategy that does not train in fp8 is ModelUnsupported (a compare
    skips it with the reason), a machine that cannot is a StrategyError; each one line."""
    refusal = entry.fp8_refusal()
    if refusal:
        raise ModelUnsupported(f"strategy {entry.name!r} {refusal}")
    reason = fp8_unavailable_reason(device)
    if reason:
        raise StrategyError(f"precision=fp8 cannot train here: {reason}")


def gathers_in_fp8(strategy: Strategy, scaling: str, all_gather: bool) -> bool:
    """Whether `strategy`'s FSDP2 all-gathers carry float8 weights: asked for, tensorwise scaling
    (torchao gathers no rowwise-scaled weights), and a strategy that shards with FSDP2."""
    return all_gather and scaling == "tensorwise" and type(strategy).gathers_fp8


def _torchao_float8():
    """torchao.float8, imported with its notices about kernels parabench does not use kept quiet
    (it tries to load extensions for every architecture and warns for each it cannot)."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        logger.setLevel(level)
    return float8


def _convertible(module: nn.Module) -> bool:
    import torch.nn as nn

    return (
        isinstance(module, nn.Linear)
        and module.in_features % MATMUL_MULTIPLE == 0
        and module.out_features % MATMUL_MULTIPLE == 0
    )


def convert_to_float8(model: nn.Module, blocks: Blocks, scaling: str, all_gather: bool) -> int:
    """Swap the linear layers inside `model`'s blocks for Float8Linear, in place; returns how many.
    `scaling`: tensorwise or rowwise (configs/schema.py FP8_SCALINGS); `all_gather`: FSDP2 will
    gather their weights in float8 (tensorwise scaling only)."""
    if not blocks.modules:
        raise StrategyError(
            "precision=fp8 converts the linear layers of the model's blocks, and this model has none found: "
            "name them with model_blocks=<class name>"
        )
    float8 = _torchao_float8()
    if scaling == "tensorwise":
        config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather)
    else:
        config = float8.Float8LinearConfig.from_recipe_name(scaling)
    inside = {id(module) for block in blocks.modules for module in block.modules()}
    chosen = {name for name, module in model.named_modules() if id(module) in inside and _convertible(module)}
    if not chosen:
        raise StrategyError(
            f"precision=fp8 found no linear layer in the model's blocks with sizes divisible by {MATMUL_MULTIPLE}: "
            "run precision=bf16"
        )
    float8.convert_to_float8_training(model, config=config, module_filter_fn=lambda _, fqn: fqn in chosen)
    return len(chosen)


def float8_scales_hook(model: nn.Module) -> Callable[..., None]:
    """Computes the float8 scales of every FSDP2-sharded weight at once for the first step's float8
    all-gathers, and returns an optimizer step post-hook that does so for the next step's. The first
    step's too: an all-gather left to scale its weight itself takes a `max` in the block's forward,
    inside the block's checkpoint where the model checkpoints its own blocks, and selective
    checkpointing saves every `max` there for the recompute (which gathers nothing) to read as its own."""
    precompute = _torchao_float8().precompute_float8_dynamic_scale_for_fsdp

    def hook(*_: object) -> None:
        precompute(model)

    hook()
    return hook
