"""activation_checkpointing=selective: torchtitan's op-level policy inside each block, the one the planner
prices. Its gradients are no checkpointing's, and it keeps more than full checkpointing and less than none."""

import gc
import weakref

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from models import build_model
from models.activation_checkpointing import CheckpointingError, enable_checkpointing
from models.blocks import find_blocks
from models.pipeline_layers import BlockLayer
from models.selective_checkpointing import selective_context

LLAMA = (
    "hf:LlamaConfig",
    dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    ),
    None,
)
MODELS = [
    ("gpt-nano", {}, None),  # its own switch, linear layers with biases (addmm)
    LLAMA,  # transformers' gradient checkpointing, no biases (mm)
    ("tests.user_models:build_decoder", {}, ["DecoderLayer"]),  # blocks wrapped here
]


class _Kept(TorchDispatchMode):
    """Every tensor an op makes, to see which the forward leaves alive for the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[weakref.ref, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.made.append((weakref.ref(t), storage.data_ptr(), storage.nbytes()))
        return out

    def alive_bytes(self) -> int:
        gc.collect()
        return sum(dict((ptr, size) for ref, ptr, size in self.made if ref() is not None).values())


def _step(name: str, kwargs: dict, blocks: list[str] | None, mode: str) -> tuple[list[torch.Tensor], int]:
    """Gradients of one forward and backward, and the bytes the forward left for the backward."""
    torch.manual_seed(0)
    model = build_model(name, kwargs)
    if mode != "none":
        enable_checkpointing(model, find_blocks(model, blocks), selective=mode == "selective")
    model.train()
    inputs, targets = (torch.randint(0, model.vocab_size, (2, 48)) for _ in range(2))
    kept = _Kept()
    with kept:
        loss = model(inputs, targets)
    alive = kept.alive_bytes()
    loss.backward()
    return [p.grad for p in model.parameters()], alive


@pytest.mark.parametrize(("name", "kwargs", "blocks"), MODELS, ids=["gpt", "hf-llama", "user-blocks"])
def test_gradients_are_no_checkpointings_and_it_keeps_between_none_and_full(name, kwargs, blocks):
    none, kept_none = _step(name, kwargs, blocks, "none")
    selective, kept_selective = _step(name, kwargs, blocks, "selective")
    _, kept_full = _step(name, kwargs, blocks, "full")
    assert all(torch.equal(a, b) for a, b in zip(none, selective, strict=True))
    assert kept_full < kept_selective < kept_none


def test_a_pipeline_stages_block_keeps_what_the_policy_keeps():
    """DeepSpeed's pipeline runs the GPT's blocks as BlockLayers, which take the GPT's checkpoint context."""
    block = build_model("gpt-nano", {}).blocks[0]
    x = torch.randn(2, 48, block.ln_1.normalized_shape[0], requires_grad=True)
    kept = {}
    grads = {}
    for mode, layer in (
        ("none", BlockLayer(block, False, selective_context)),
        ("selective", BlockLayer(block, True, selective_context)),
    ):
        layer.train()
        made = _Kept()
        with made:
            out = layer(x)
        kept[mode] = made.alive_bytes()
        (grads[mode],) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grads["none"], grads["selective"])
    assert kept["selective"] < kept["none"]


def test_a_model_whose_own_switch_recomputes_whole_blocks_refuses_selective_in_one_line():
    class Switched(nn.Module):
        activation_checkpointing = False

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    model = Switched()
    with pytest.raises(CheckpointingError, match="model_blocks=<ClassName>"):
        enable_checkpointing(model, find_blocks(model, None), selective=True)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_model_compiled_whole_traces_its_checkpointed_blocks(mode):
    """compile=true compiles the model whole under DDP: dynamo traces the GPT's own checkpoint call, and
    cannot read a context given to it as the no-op (full checkpointing stopped in its first step)."""
    eager, _ = _step("gpt-nano", {}, None, "none")
    torch.manual_seed(0)
    model = build_model("gpt-nano", {})
    enable_checkpointing(model, find_blocks(model, None), selective=mode == "selective")
    model.train()
    inputs, targets = (torch.randint(0, model.vocab_size, (2, 48)) for _ in range(2))
    torch.compile(model, backend="eager")(inputs, targets).backward()
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(model.parameters(), eager, strict=True))
