"""What a run's recipe (recipe.py) changes in a strategy's plan beyond its memory terms: how the
strategy then runs its precision, and what it moves: fp8 all-gathers halve the gathered block
matrices on the wire, and offloaded activations cross PCIe out in the forward and back in the
backward, hidden behind each phase's compute where the link keeps up."""

from __future__ import annotations

from dataclasses import replace

from harness.plan.memory.activations import Activations
from harness.plan.memory.buffers import fp8_block_share, matmul_weights
from harness.plan.memory.recipe import Recipe
from harness.plan.model.model_shape import ModelShape
from harness.plan.network.comm import Collective
from harness.plan.parallel.backends import Backend

FRAGMENTATION = "the allocator's fragmentation (a share of the activations)"


def with_recipe(backend: Backend, recipe: Recipe) -> Backend:
    """A torch-engine strategy with bf16 parameters (pure bf16, Megatron's mixed precision) runs
    the whole model in bf16 and reduces its bf16 gradients as they are (in fp32 with fp32
    accumulation, as Megatron-LM reduces its main_grad)."""
    if recipe.low_precision_params and backend.engine == "torch":
        return replace(backend, mixed_precision="low_precision", reduce_in_fp32=recipe.fp32_grad_accum)
    return backend


def fp8_gathers(backend: Backend, recipe: Recipe) -> bool:
    """Whether this strategy gathers its blocks' weights in fp8 (FSDP2 under torchao)."""
    return recipe.fp8_all_gather and backend.engine == "torch" and backend.stage == 3


def recipe_collectives(
    comms: list[Collective], shape: ModelShape, backend: Backend, recipe: Recipe, acts: Activations | None
) -> list[Collective]:
    """`comms` with the recipe's changes: fp8 parameter all-gathers, activation copies to the host."""
    out = list(comms)
    if fp8_gathers(backend, recipe):
        head = shape.dims.vocab * shape.dims.width if shape.dims else 0
        matrices = (matmul_weights(shape) - head) / shape.params  # of the gathered parameters
        out = [
            replace(
                c,
                payload_bytes=c.payload_bytes * (1 - matrices / 2),
                tail_bytes=c.tail_bytes * (1 - fp8_block_share(shape) / 2),
            )
            if c.kind == "all-gather" and c.what.startswith("all-gather parameters")
            else c
            for c in out
        ]
    if acts is not None and acts.host:
        calls = recipe.activation_offload_layers or (shape.dims.layers if shape.dims else 1)
        out += [
            Collective("activations to host memory", "host-copy", acts.host, calls, "forward", per_micro_step=True),
            Collective("activations back to the GPU", "host-copy", acts.host, calls, "backward", per_micro_step=True),
        ]
    return out
