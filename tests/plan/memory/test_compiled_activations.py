"""A compiled model's activations against what torch.compile's partitioner saves for the backward.

The model is traced as torch.compile traces it for inductor (dynamo, AOTAutograd with inductor's
decompositions and its partition function: its joint-graph passes, then the min-cut partitioner)
on the CPU, and the forward graph's saved tensors are summed from their shapes; no code is
generated. The partitioner picks what to save by each op's category, not its device, so this is
what a GPU's compiled forward keeps too (the attention kernel differs, its saved q, k, v, output
and log-sum-exp alike).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.compile_fx import partition_fn
from torch._inductor.decomposition import select_decomp_table

from harness.plan.memory.activations import activations
from harness.plan.model.model_build import shape_of_module
from models.zoo import build_model

# Heads as many as key/value heads: transformers repeats the keys and values of grouped-query
# attention before SDPA when it builds a mask, as it does under tracing, which the plan's
# q + 2k does not count (the model's code, not the partitioner's).
LLAMA_TINY = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=512,
    max_position_embeddings=256,
)
CAST = torch.ops.prims.convert_element_type.default
VIEWS = {"view", "_unsafe_view", "t", "permute", "transpose", "expand", "slice", "select", "alias", "reshape"}


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage a chain of views reads."""
    while node.op == "call_function" and getattr(node.target, "__name__", "").split(".")[0] in VIEWS:
        node = node.args[0]
    return node


def _compiled_saved_bytes(model: torch.nn.Module, rows: torch.Tensor, autocast: bool) -> int:
    """Bytes of the activations the compiled forward saves for the backward: its outputs past the
    loss, less the graph's inputs (parameters, tokens) and what is made of the parameters alone
    (their 16-bit copies under autocast, counted as the autocast cache's), and less transformers'
    causal mask (T x T, once a batch)."""
    saved: list[int] = []
    seq = rows.size(1) - 1

    def forward_compiler(gm: torch.fx.GraphModule, _inputs: list) -> torch.fx.GraphModule:
        for node in gm.graph.find_nodes(op="output")[0].args[0][1:]:
            value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                continue
            base = _base(node)
            weight_copy = base.target is CAST and base.args[0].op == "placeholder"
            if base.op != "placeholder" and not weight_copy and tuple(value.shape[-2:]) != (seq, seq):
                saved.append(value.numel() * value.element_size())
        return gm

    backend = aot_autograd(
        fw_compiler=forward_compiler,
        bw_compiler=lambda gm, _inputs: gm,
        partition_fn=partition_fn,
        decompositions=select_decomp_table(),
    )
    torch._dynamo.reset()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        torch.compile(model, backend=backend)(rows[:, :-1], rows[:, 1:])
    torch._dynamo.reset()
    return sum(saved)


def _layers(spec: str, kwargs: dict, layers: int) -> dict:
    return {**kwargs, ("n_layer" if spec == "gpt-nano" else "num_hidden_layers"): layers}


@pytest.mark.parametrize("style", ["fp32", "autocast", "low_precision"])
@pytest.mark.parametrize(
    "spec,kwargs", [("gpt-nano", {"n_embd": 64, "n_head": 2, "vocab_size": 512}), ("hf:LlamaConfig", LLAMA_TINY)]
)
def test_compiled_activations_match_what_the_partitioner_saves(spec, kwargs, style):
    # 3 x 40 = 120 tokens; one block and two, whose difference is the second block's saved tensors. The vocabulary
    # large enough that the loss's bytes a logit weigh beside the blocks'.
    batch, seq = 3, 40
    saved, predicted = {}, {}
    for layers in (1, 2):
        torch.manual_seed(0)
        model = build_model(spec, _layers(spec, kwargs, layers))
        if style == "low_precision":
            model = model.to(torch.bfloat16)
        model.train()
        rows = torch.randint(0, model.vocab_size, (batch, seq + 1))
        saved[layers] = _compiled_saved_bytes(model, rows, autocast=style == "autocast")
        predicted[layers] = activations(
            shape_of_module(spec, model),
            micro_batch=batch,
            seq_len=seq,
            precision="fp32" if style == "fp32" else "bf16",
            mixed_precision="low_precision" if style == "low_precision" else "autocast",
            checkpointing="none",
            fused_loss=True,
            compiled=True,
            head_compiled=True,
        )
    block = predicted[2].blocks - predicted[1].blocks
    assert saved[2] - saved[1] == pytest.approx(block, rel=0.002)
    # The whole model, the loss's gradient written over the saved logits (a donated buffer). The first
    # block's input differs by up to a width a token: the partitioner may keep it as the embeddings'
    # rows, or the attention's output projection beside them, and rebuild the sum.
    assert saved[2] == pytest.approx(predicted[2].blocks + predicted[2].head, rel=0.03)
