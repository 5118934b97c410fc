"""bench/megatron_layer_host.py compares like with like: its Megatron-DeepSpeed layer and its plain
eager block compute the same function, and every layer stack it times recomputes and back-propagates."""

from __future__ import annotations

import torch

import bench.megatron_layer_host as host


def _megatron_qkv_rows(width: int, heads: int) -> torch.Tensor:
    """Megatron's fused projection's output rows in the plain block's order: Megatron views its output
    as [heads, 3 x head dim] (each head's q, k, v together), the plain block as q, k, v of all heads."""
    head = width // heads
    return torch.tensor([part * width + h * head + i for h in range(heads) for part in range(3) for i in range(head)])


def test_the_megatron_layer_computes_what_the_plain_block_does(monkeypatch):
    monkeypatch.setattr(host, "DROPOUT", 0.0)
    torch.manual_seed(0)
    plain = host.PlainUnfusedBlock(host.WIDTH, host.HEADS)
    megatron = host.MegatronStack(1)
    layer = megatron.layers[0]
    with torch.no_grad():
        for p in plain.parameters():
            p.normal_(0.0, 0.3)
        rows = _megatron_qkv_rows(host.WIDTH, host.HEADS)
        pairs = [
            (layer.input_layernorm.weight, plain.ln_1.weight),
            (layer.input_layernorm.bias, plain.ln_1.bias),
            (layer.attention.query_key_value.weight, plain.c_attn.weight[rows]),
            (layer.attention.query_key_value.bias, plain.c_attn.bias[rows]),
            (layer.attention.dense.weight, plain.c_proj.weight),
            (layer.attention.dense.bias, plain.c_proj.bias),
            (layer.post_attention_layernorm.weight, plain.ln_2.weight),
            (layer.post_attention_layernorm.bias, plain.ln_2.bias),
            (layer.mlp.dense_h_to_4h.weight, plain.c_fc.weight),
            (layer.mlp.dense_h_to_4h.bias, plain.c_fc.bias),
            (layer.mlp.dense_4h_to_h.weight, plain.c_out.weight),
            (layer.mlp.dense_4h_to_h.bias, plain.c_out.bias),
        ]
        for mine, theirs in pairs:
            mine.copy_(theirs)
    x = torch.randn(host.BATCH, host.SEQ, host.WIDTH, requires_grad=True)
    x_megatron = x.detach().transpose(0, 1).clone().requires_grad_()
    out_plain, out_megatron = plain(x), megatron(x_megatron)
    torch.testing.assert_close(out_megatron.transpose(0, 1), out_plain)
    out_plain.square().sum().backward()
    out_megatron.square().sum().backward()
    torch.testing.assert_close(x_megatron.grad.transpose(0, 1), x.grad)


def test_every_timed_stack_recomputes_and_fills_every_gradient():
    for name, (model, x) in host.variants().items():
        model.train()
        host.micro_step(model, x)
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, f"{name}: no gradient for {missing}"
