"""The recipe's plan options (harness/plan/memory/recipe.py): each against what the library that offers
it holds, saves or moves, and bad combinations as one-line errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import runner
from harness.common.units import GIB
from harness.plan.memory.activations import qk_norm_bytes_per_token
from harness.plan.memory.buffers import fp8_block_share
from harness.plan.memory.model_states import model_states
from harness.plan.memory.recipe import EIGHT_BIT_BLOCK, PLAIN, Recipe, moment_bytes
from harness.plan.model.model_build import shape_of_module
from harness.plan.parallel.backends import backend_for
from harness.plan.plan_cli import PlanConfig, question
from harness.plan.predict import plan_strategy
from models.zoo import build_model
from tests.plan.test_plan import LLAMA_TINY, _saved_activation_bytes

LLAMA_8B = dict(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, arch="llama")


def _plan(name: str, recipe: Recipe = PLAIN, **options):
    q = question(PlanConfig(**{**LLAMA_8B, "gpus": 8, "micro_batch": 1, "seq_len": 4096, **options}))
    return plan_strategy(name, replace(q, recipe=recipe)), q


@pytest.mark.parametrize("style", ["fp32", "low_precision"])
def test_qk_norm_keeps_what_autograd_saves(style):
    """Qwen3 is Llama with an RMSNorm on each head's queries and keys: what autograd saves beyond
    Llama's, at the same sizes, is the qk-norm's term."""
    batch, seq = 3, 40
    saved = {}
    for spec, extra in (("hf:LlamaConfig", {}), ("hf:Qwen3Config", {"head_dim": 16})):
        torch.manual_seed(0)
        model = build_model(spec, {**LLAMA_TINY, **extra})
        if style == "low_precision":
            model = model.to(torch.bfloat16)
        model.train()
        rows = torch.randint(0, model.vocab_size, (batch, seq + 1))
        saved[spec] = _saved_activation_bytes(model, rows, autocast=False)[0]
    dims = shape_of_module("hf:LlamaConfig", build_model("hf:LlamaConfig", LLAMA_TINY)).dims
    per_token = qk_norm_bytes_per_token(dims, 4 if style == "fp32" else 2)
    assert saved["hf:Qwen3Config"] - saved["hf:LlamaConfig"] == per_token * batch * seq * dims.layers


def test_pure_bf16_holds_what_torch_adamw_holds_on_a_bf16_model():
    """torchtune's recipe: the model cast to bf16 and torch's AdamW, whose moments take the
    parameters' dtype: 2 + 2 + 4 bytes a parameter and a 4-byte step per tensor."""
    torch.manual_seed(0)
    model = build_model("gpt-nano", {}).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters())
    rows = torch.randint(0, model.vocab_size, (2, 17))
    model(rows[:, :-1], rows[:, 1:]).backward()
    optimizer.step()
    measured = {
        "params": sum(p.numel() * p.element_size() for p in model.parameters()),
        "grads": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()),
        "optimizer": sum(
            t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
        ),
    }
    shape = shape_of_module("gpt-nano", model)
    backend = backend_for("single", shape, "bf16", 1)
    planned = model_states(shape, backend, "bf16", 1, recipe=Recipe(pure_bf16=True))
    assert {c: planned.total(c) for c in measured} == measured


def test_pure_bf16_halves_fsdp_and_leaves_deepspeed_its_master():
    mixed, _ = _plan("fsdp")
    pure, _ = _plan("fsdp", Recipe(pure_bf16=True))
    for category in ("params", "grads", "optimizer"):
        assert pure.states_on()[category] == pytest.approx(mixed.states_on()[category] / 2, rel=1e-3), category
    assert _plan("zero3", Recipe(pure_bf16=True))[0].states == _plan("zero3")[0].states


def test_eight_bit_adamw_keeps_a_byte_and_a_block_scale_per_moment_element():
    """bitsandbytes' AdamW8bit (torchao's alike): uint8 moments, one fp32 absmax per 256 elements
    each; tensors under 4,096 elements keep fp32 moments."""
    matrix, norm = 4096 * 4096, 4096 - 1
    assert moment_bytes([matrix], "adamw8bit") == 2 * (matrix + 4 * matrix // EIGHT_BIT_BLOCK)
    assert moment_bytes([norm], "adamw8bit") == moment_bytes([norm], "adamw") == 8 * norm
    fp32, _ = _plan("ddp")
    eight, _ = _plan("ddp", Recipe(optimizer="adamw8bit"))
    ratio = eight.states_on()["optimizer"] / fp32.states_on()["optimizer"]
    assert ratio == pytest.approx((1 + 4 / EIGHT_BIT_BLOCK) / 4, rel=0.01)
    master, q = _plan("zero2", Recipe(optimizer="adamw8bit"))  # DeepSpeed's fp32 master partition stays
    per_param = 4 + 2 * (1 + 4 / EIGHT_BIT_BLOCK)
    assert master.states_on()["optimizer"] == pytest.approx(q.shape.params / 8 * per_param, rel=0.01)


def test_tied_embeddings_drop_or_add_the_head():
    untied = question(PlanConfig(**LLAMA_8B, gpus=8))
    tied = question(PlanConfig(**LLAMA_8B, gpus=8, tied_embeddings=True))
    assert untied.shape.params - tied.shape.params == 128256 * 4096
    gpt = question(PlanConfig(model="gpt2-124m", gpus=1))
    assert question(PlanConfig(model="gpt2-124m", gpus=1, tied_embeddings=True)).shape == gpt.shape
    head = gpt.shape.dims.vocab * gpt.shape.dims.width  # GPT-2's vocabulary padded to 50,304
    assert question(PlanConfig(model="gpt2-124m", gpus=1, tied_embeddings=False)).shape.params == (
        gpt.shape.params + head
    )


def test_fp32_gradient_accumulation_doubles_deepspeeds_gradients():
    plain, _ = _plan("zero2")
    fp32, _ = _plan("zero2", Recipe(fp32_grad_accum=True))
    assert fp32.states_on()["grads"] == 2 * plain.states_on()["grads"]
    assert _plan("fsdp", Recipe(fp32_grad_accum=True))[0].states == _plan("fsdp")[0].states  # fp32 already
    pure, _ = _plan("fsdp", Recipe(pure_bf16=True, fp32_grad_accum=True))  # Megatron-LM's main_grad beside bf16
    assert pure.states_on()["grads"] == _plan("fsdp")[0].states_on()["grads"]
    assert pure.states_on()["params"] == _plan("fsdp")[0].states_on()["params"] / 2


def test_fp8_all_gathers_move_and_hold_a_byte_per_block_matrix_element():
    bf16, q = _plan("fsdp", precision="fp8")
    fp8, _ = _plan("fsdp", Recipe(fp8_all_gather=True), precision="fp8")
    share = fp8_block_share(q.shape)
    assert 0.99 < share <= 1.0  # a Llama block is its projections but for two norm vectors
    name = "blocks gathered (in use + prefetched)"
    assert fp8.buffers.backward[name] == pytest.approx(bf16.buffers.backward[name] * (1 - share / 2), rel=1e-6)
    gathers = [(a, b) for a, b in zip(bf16.collectives, fp8.collectives, strict=True) if a.kind == "all-gather"]
    assert gathers and all(b.payload_bytes < 0.6 * a.payload_bytes for a, b in gathers)
    assert fp8.time.step_s < bf16.time.step_s


def test_fp8_saved_inputs_keep_a_byte_per_projection_input_element():
    """TransformerEngine keeps each fp8 projection's input as its fp8 cast: per token and block, the
    attention's and the MLP's inputs (h each) and the down projection's (f) drop from two bytes to one,
    and the output projection's (q) adds a one-byte copy beside the bf16 output attention keeps."""
    bf16, q = _plan("fsdp", precision="fp8")
    fp8, _ = _plan("fsdp", Recipe(fp8_saved_inputs=True), precision="fp8")
    dims = q.shape.dims
    per_token = 2 * dims.width + dims.ffn_width - dims.q_width
    tokens = q.micro_batch * q.seq_len
    assert bf16.activations.blocks - fp8.activations.blocks == dims.layers * per_token * tokens
    assert fp8.peak_bytes < bf16.peak_bytes


def test_activation_offload_keeps_two_blocks_and_pays_for_what_pcie_cannot_hide():
    kept, _ = _plan("fsdp", micro_batch=4)
    offloaded, _ = _plan("fsdp", Recipe(activation_offload=True), micro_batch=4)
    per_block = kept.activations.blocks / 32
    assert offloaded.activations.blocks == pytest.approx(2 * per_block, rel=1e-6)
    assert offloaded.activations.host == pytest.approx(30 * per_block, rel=1e-6)
    assert offloaded.peak_bytes < kept.peak_bytes - 25 * per_block
    copies = [c for c in offloaded.collectives if c.kind == "host-copy"]
    assert [c.window for c in copies] == ["forward", "backward"]
    assert offloaded.time.step_s > kept.time.step_s  # 30 blocks over PCIe outrun the forward's compute


def test_offloaded_layers_leave_the_others_on_the_gpu_at_the_peak():
    """Megatron-core's cpu_offloading_num_layers: that many blocks' activations in host memory, the
    rest on the GPU; where nearly all go, the last copy out and the block computed beside it."""
    kept, _ = _plan("fsdp", micro_batch=4)
    offloaded, _ = _plan("fsdp", Recipe(activation_offload_layers=10), micro_batch=4)
    per_block = kept.activations.blocks / 32
    assert offloaded.activations.blocks == pytest.approx(22 * per_block, rel=1e-6)
    assert offloaded.activations.host == pytest.approx(10 * per_block, rel=1e-6)
    copies = [c for c in offloaded.collectives if c.kind == "host-copy"]
    assert [(c.window, c.calls) for c in copies] == [("forward", 10), ("backward", 10)]
    assert kept.peak_bytes - offloaded.peak_bytes == pytest.approx(10 * per_block, rel=0.01)
    nearly_all, _ = _plan("fsdp", Recipe(activation_offload_layers=31), micro_batch=4)
    assert nearly_all.activations.blocks == pytest.approx(2 * per_block, rel=1e-6)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["activation_offload_layers=12", "strategies=[fsdp]"], "must be fewer than the 12 blocks each GPU holds"),
        (
            ["activation_offload_layers=4", "activation_checkpointing=full", "strategies=[fsdp]"],
            "give activation_checkpointing=none",
        ),
        (["activation_offload_layers=4", "activation_offload=true"], "give one of them"),
        (["activation_offload_layers=-1"], "give 0 or more"),
        (["activation_offload_layers=4", "strategies=[fsdp-pp]", "gpus=16"], "does not run beside a pipeline"),
    ],
)
def test_offloaded_layers_megatron_refuses_are_one_line_errors(capsys, args, fragment):
    assert runner.main(["plan", "model=gpt2-124m", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_loss_in_place_keeps_the_logits_once():
    """TransformerEngine's cross-entropy writes the logits' gradient over them: the head keeps one bf16
    logit where a fused loss keeps the logits and their gradient. At micro-batch 4 the head's logits
    outweigh a block's gradients, so the peak stays at the start of the backward and falls as much."""
    fused, q = _plan("fsdp", fused_loss=True, micro_batch=4)
    in_place, _ = _plan("fsdp", Recipe(loss_in_place=True), fused_loss=True, micro_batch=4)
    logits = q.micro_batch * q.seq_len * LLAMA_8B["vocab"]
    assert fused.activations.head - in_place.activations.head == 2 * logits
    assert fused.peak_bytes - in_place.peak_bytes == 2 * logits


def test_loss_in_place_without_a_fused_loss_is_a_one_line_error(capsys):
    assert runner.main(["plan", "model=gpt2-124m", "loss_in_place=true", "strategies=[fsdp]"]) == 2
    err = capsys.readouterr().err
    assert "give fused_loss=true as well" in err and err.count("\n") == 1


def test_a_fused_linear_loss_holds_no_logits():
    """Liger's fused linear cross-entropy runs the head's matmul and the loss a chunk of tokens at a
    time: the head keeps the hidden states' gradient and one chunk's logits (a width each, bf16) and
    each token's fp32 loss, where a fused loss keeps the logits and their gradient (2 x 2 bytes a logit)."""
    fused, q = _plan("fsdp", fused_loss=True, micro_batch=4)
    linear, _ = _plan("fsdp", Recipe(fused_linear_loss=True), fused_loss=True, micro_batch=4)
    tokens = q.micro_batch * q.seq_len
    kept = 2 * 2 * LLAMA_8B["vocab"] - (2 * 2 * LLAMA_8B["width"] + 4)
    assert fused.activations.head - linear.activations.head == kept * tokens
    assert linear.peak_bytes < fused.peak_bytes


def test_a_fused_linear_loss_without_a_fused_loss_is_a_one_line_error(capsys):
    assert runner.main(["plan", "model=gpt2-124m", "fused_linear_loss=true", "strategies=[fsdp]"]) == 2
    err = capsys.readouterr().err
    assert "give fused_loss=true as well" in err and err.count("\n") == 1


def test_fragmentation_is_a_share_of_the_activations_at_the_peak():
    plain, _ = _plan("fsdp", micro_batch=4)
    fragmented, _ = _plan("fsdp", Recipe(fragmentation=0.1), micro_batch=4)
    assert fragmented.peak_bytes - plain.peak_bytes == pytest.approx(0.1 * plain.activations.total, abs=1)
    assert fragmented.peak_bytes > plain.peak_bytes + 1 * GIB


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["optimizer=sgd"], "optimizer='sgd' is not one of adamw, adamw8bit"),
        (["fragmentation=2"], "must be a share of the activations in [0, 1]"),
        (["fp8_all_gather=true"], "give precision=fp8 as well"),
        (["fp8_saved_inputs=true"], "keeps the fp8 projections' inputs: give precision=fp8 as well"),
        (["fp8_attention=true", "attention=cudnn"], "runs the attention under the fp8 recipe: give precision=fp8"),
        (["fp8_attention=true", "precision=fp8", "gpu=B200"], "cuDNN's fp8 attention kernel: give attention=cudnn"),
        (["fp8_attention=true", "precision=fp8", "gpu=B200", "attention=flash"], "give attention=cudnn as well"),
        (["pure_bf16=true", "precision=fp32"], "give precision=bf16 (or fp8), not fp32"),
        (["megatron_mixed_precision=true", "precision=fp32"], "give precision=bf16, fp16 or fp8, not fp32"),
        (["megatron_mixed_precision=true", "pure_bf16=true"], "give one of them"),
    ],
)
def test_a_recipe_that_cannot_be_is_a_one_line_error(capsys, args, fragment):
    assert runner.main(["plan", "model=gpt2-124m", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


@pytest.mark.parametrize(("name", "dp", "per_param"), [("ddp", 1, 6 + 12), ("zero1-tp", 8, 6 + 12 / 8)])
def test_megatron_mixed_precision_holds_what_its_distributed_optimizer_doc_says(name, dp, per_param):
    """Megatron-LM's docs/source/distrib_optimizer.md: a bf16 parameter and its fp32 main_grad
    whole (6 bytes), the fp32 master and both moments (12) over the data-parallel ranks under the
    distributed optimizer, whole without it."""
    shape = question(PlanConfig(**LLAMA_8B, gpus=dp)).shape
    recipe = Recipe(megatron_mixed_precision=True, fp32_grad_accum=True)
    backend = backend_for(name, shape, "bf16", dp)
    states = model_states(shape, backend, "bf16", dp, recipe=recipe)
    held = sum(states.total(c) for c in ("params", "grads", "optimizer"))
    assert held / shape.params == pytest.approx(per_param, rel=1e-4)
    bf16_grads = model_states(shape, backend, "bf16", dp, recipe=replace(recipe, fp32_grad_accum=False))
    assert states.total("grads") == 2 * bf16_grads.total("grads")
    deepspeed = backend_for("zero1", shape, "bf16", dp)  # DeepSpeed's bf16 mode holds its master already
    assert model_states(shape, deepspeed, "bf16", dp, recipe=replace(recipe, fp32_grad_accum=False)) == model_states(
        shape, deepspeed, "bf16", dp
    )
