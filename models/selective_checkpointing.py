"""activation_checkpointing=selective: torchtitan's op-level policy, the one the planner prices
(docs/planner.md, "Checkpointing"). Inside each checkpointed block the forward keeps the outputs
of every second matmul and of the attention kernel (and of a reduce-scatter, and of `max`, whose
result low-precision scaling reads); the backward recomputes the other matmuls and all elementwise
work from those and the block's input.

It runs as torch.utils.checkpoint's selective checkpointing (`create_selective_checkpoint_contexts`):
a policy asked for every op the block runs, in the forward and again in the recompute, each counting
its own matmuls so both keep the same ones. A matmul is `mm`, `addmm` or `_scaled_mm`: torchtitan's
Llama has no biases, a linear layer with a bias runs as `addmm` (parabench's GPT, GPT-2's), and an fp8
one as `_scaled_mm` (torchao's Float8Linear), each still one of the matmuls the planner counts.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def _ops(*names: str) -> frozenset[Any]:
    """The overloads of `names` (namespace.op.overload) this torch has: a recent torch may add or drop one."""
    found = []
    for name in names:
        namespace, op, overload = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None and hasattr(packet, overload):
            found.append(getattr(packet, overload))
    return frozenset(found)


MATMULS = _ops("aten.mm.default", "aten.addmm.default", "aten._scaled_mm.default")
SAVED = MATMULS | _ops(
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_attention_math.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default",
)


def selective_context() -> tuple[AbstractContextManager, AbstractContextManager]:
    """The forward's and the recompute's contexts for one checkpointed call (torch.utils.checkpoint's
    `context_fn`): a fresh count of matmuls for each call."""
    matmuls: dict[bool, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMULS:
            matmuls[ctx.is_recompute] += 1
            if matmuls[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
