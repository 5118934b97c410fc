"""A Megatron-DeepSpeed GPT layer's host cost against a plain eager block's, measured on the CPU.

The one-node vTrain runs (bench/data/small_model_tp.csv) take about twice the plan's host issue a
layer pass (docs/planner.md, "Where each GPU's work is small"). Part of a layer's host time is the
Python around its kernels, which is the same on any device: this script runs three layers of the
same sizes, forward, recomputed forward and backward (full activation checkpointing, as the runs),
with tensors so small that the CPU's kernels take next to nothing, and reports for each the host
time a layer pass and what it calls:

  parabench   models/gpt.py's Block (biases on), non-reentrant torch.utils.checkpoint, as
              parabench builds a GPT (SDPA attention; no dropout: SDPA's CPU dropout is its unfused
              math path, where on a GPU the flash kernel draws it)
  plain       the runs' operations written as plain eager PyTorch: LayerNorm, biased linears,
              baddbmm, one softmax op, dropout 0.1 on the probabilities and both branch outputs, bmm,
              tanh GELU; non-reentrant torch.utils.checkpoint
  megatron    microsoft/Megatron-DeepSpeed megatron/model/transformer.py @ f01c9e6e (the code
              vTrain's model copies) at tensor parallelism 1, its defaults on: ParallelTransformerLayer,
              ParallelAttention, ParallelMLP; mpu's Column/RowParallelLinear with their
              autograd.Function regions (identities at TP 1); the TorchScript bias-GELU and
              bias-dropout-add (legacy executor, as the file sets it); apex's MixedFusedLayerNorm
              and the fused upper-triangular softmax as autograd.Functions over one op each way
              (the CUDA extensions' one launch); the RNG tracker's fork around the attention's
              dropout; mpu/random.py's CheckpointFunction (CPU and device RNG states saved and
              restored, the recompute, its `torch.equal` on the MoE-loss output)

and two ablations of the last, which say where its excess lies: `megatron-nojit` (the bias-GELU
and bias-dropout-add unfused, `--no-bias-gelu-fusion --no-bias-dropout-fusion`) and
`megatron-torchckpt` (torch.utils.checkpoint in place of mpu's CheckpointFunction).

Each is measured three ways: the thread's CPU time a layer pass (interleaved samples; on a shared
machine it moves with the other jobs), the host's instructions a layer pass as callgrind counts them
(deterministic; what torch.utils.benchmark's collect_callgrind counts), and what it calls (aten ops,
Python functions). It runs under any torch from 2.0 on: vTrain's container's 2.0.1 (the runs'
likeliest) without the parabench block, which needs 2.1.

The device's generator stands in for the GPU's (the CUDA calls take a CPU's path of the same
Python); the tensor-parallel world size is 1 without torch.distributed's lookup. What this cannot
see is the device's own share: a GPU launch and its allocator, per kernel, which a CPU op does not
pay, and Megatron's syncs (the two `torch.tensor(0.0, device=...)` copies of a forward pass and the
`torch.equal` of each recompute wait for the GPU on a GPU; here they are cheap). So the ratio
below is of the Python and dispatch a layer pass runs, not of a GPU host's whole issue time.

    python bench/megatron_layer_host.py > bench/results/megatron_layer_host.md
    <a torch 2.0.1 environment's python> bench/megatron_layer_host.py >> bench/results/megatron_layer_host.md
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as torch_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:  # parabench's block builds on torch 2.1 or later (LayerNorm's `bias`); the runs' torch 2.0.1 has the rest
    from models.gpt import Block, GPTConfig  # noqa: E402

    torch.nn.LayerNorm(1, bias=True)
except (ImportError, TypeError):
    Block = None

# Tiny sizes: the CPU's kernels cost next to nothing, so the time is the host's calls.
SEQ, BATCH, WIDTH, HEADS, LAYERS = 20, 1, 16, 4, 6
DROPOUT = 0.1
REPEATS, ITERATIONS, WARMUP = 25, 20, 10
COUNTED_STEPS = 3  # micro-steps counted under callgrind
CHILD = "--count-instructions"  # the script's own argument to the process callgrind runs
# --- Megatron-DeepSpeed @ f01c9e6e at TP 1, the CPU standing in for the GPU -------------------------


class _Accelerator:
    """deepspeed.accelerator's CUDA_Accelerator calls Megatron's random.py makes, the CPU's generator
    in place of torch.cuda's (the same Python: a device parsed, the generator looked up)."""

    def device_name(self, index: int | None = None) -> str:
        return "cpu"

    def current_device_name(self) -> str:
        return "cpu"

    def current_device(self) -> int:
        return 0

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        device = torch.device(self.device_name())  # torch.cuda.get_rng_state's own parse
        idx = device.index if device.index is not None else self.current_device()
        return self.default_generator(idx).get_state()

    def default_generator(self, idx: int) -> torch.Generator:
        return torch.default_generator

    def lazy_call(self, callback: Callable[[], None]) -> None:
        callback()  # torch.cuda._lazy_call once CUDA is initialised


_ACCELERATOR = _Accelerator()


def get_accelerator() -> _Accelerator:
    return _ACCELERATOR


def _tp_world_size() -> int:
    return 1


def _set_cuda_rng_state(new_state: torch.Tensor, device: int = -1) -> None:
    """mpu/random.py's, the newer-PyTorch branch."""
    device_ = torch.device(get_accelerator().device_name()) if device == -1 else device

    def cb() -> None:
        idx = device_.index
        if idx is None:
            idx = get_accelerator().current_device()
        get_accelerator().default_generator(idx).set_state(new_state)

    get_accelerator().lazy_call(cb)


class CudaRNGStatesTracker:
    """mpu/random.py's tracker: one named state, forked around the tensor-parallel region's dropout."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        orig = get_accelerator().get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = get_accelerator().get_rng_state()
        _set_cuda_rng_state(orig)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise RuntimeError(f"rng state {name} is not added")
        orig = get_accelerator().get_rng_state()
        _set_cuda_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = get_accelerator().get_rng_state()
            _set_cuda_rng_state(orig)


_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _TRACKER


class CheckpointFunction(torch.autograd.Function):
    """mpu/random.py's (no checkpointed-activations buffer: the default)."""

    @staticmethod
    def forward(ctx, run_function, *args):
        ctx.run_function = run_function
        ctx.fwd_cpu_rng_state = torch.get_rng_state()
        ctx.fwd_cuda_rng_state = get_accelerator().get_rng_state()
        ctx.fwd_cuda_rng_state_tracker = get_cuda_rng_tracker().get_states()
        with torch.no_grad():
            outputs = run_function(*args)
        ctx.save_for_backward(*args)
        return outputs

    @staticmethod
    def backward(ctx, *args):
        inputs = ctx.saved_tensors
        bwd_cpu_rng_state = torch.get_rng_state()
        bwd_cuda_rng_state = get_accelerator().get_rng_state()
        bwd_cuda_rng_state_tracker = get_cuda_rng_tracker().get_states()
        torch.set_rng_state(ctx.fwd_cpu_rng_state)
        _set_cuda_rng_state(ctx.fwd_cuda_rng_state)
        get_cuda_rng_tracker().set_states(ctx.fwd_cuda_rng_state_tracker)
        detached_inputs = torch.utils.checkpoint.detach_variable(inputs)
        with torch.enable_grad():
            outputs = ctx.run_function(*detached_inputs)
        torch.set_rng_state(bwd_cpu_rng_state)
        _set_cuda_rng_state(bwd_cuda_rng_state)
        get_cuda_rng_tracker().set_states(bwd_cuda_rng_state_tracker)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        elif (
            len(outputs) == 2
            and isinstance(outputs[1], torch.Tensor)
            and torch.equal(outputs[1], torch.tensor(0).to(get_accelerator().device_name()))
        ):
            outputs = (outputs[0],)
        torch.autograd.backward(outputs, args[: len(outputs)])
        grads = tuple(inp.grad if isinstance(inp, torch.Tensor) else inp for inp in detached_inputs)
        return (None,) + grads


class _CopyToModelParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_):
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output if _tp_world_size() == 1 else None


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_):
        return input_ if _tp_world_size() == 1 else None

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class ColumnParallelLinear(nn.Module):
    def __init__(self, n_in: int, n_out: int, skip_bias_add: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.skip_bias_add = skip_bias_add
        self.gather_output = False
        self.is_expert_without_slicing = False

    def forward(self, input_):
        input_parallel = input_ if self.is_expert_without_slicing else _CopyToModelParallelRegion.apply(input_)
        bias = self.bias if not self.skip_bias_add else None
        output_parallel = F.linear(input_parallel, self.weight, bias)
        output = output_parallel
        output_bias = self.bias if self.skip_bias_add else None
        return output, output_bias


class RowParallelLinear(nn.Module):
    def __init__(self, n_in: int, n_out: int, skip_bias_add: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.skip_bias_add = skip_bias_add
        self.input_is_parallel = True
        self.is_expert_without_slicing = False

    def forward(self, input_):
        input_parallel = input_
        output_parallel = F.linear(input_parallel, self.weight)
        output_ = (
            output_parallel if self.is_expert_without_slicing else _ReduceFromModelParallelRegion.apply(output_parallel)
        )
        if not self.skip_bias_add:
            return output_ + self.bias, None
        return output_, self.bias


class FusedLayerNormAffineFunction(torch.autograd.Function):
    """megatron/model/fused_layer_norm.py's, apex's forward_affine/backward_affine one op each way."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps):
        ctx.normalized_shape = normalized_shape
        ctx.eps = eps
        input_, weight_, bias_ = input.contiguous(), weight.contiguous(), bias.contiguous()
        output, mean, invvar = torch.native_layer_norm(input_, normalized_shape, weight_, bias_, eps)
        ctx.save_for_backward(input_, weight_, bias_, mean, invvar)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight_, bias_, mean, invvar = ctx.saved_tensors
        grad_input, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
            grad_output.contiguous(), input_, ctx.normalized_shape, mean, invvar, weight_, bias_, [True, True, True]
        )
        return grad_input, grad_weight, grad_bias, None, None


class MixedFusedLayerNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.normalized_shape = torch.Size((width,))
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, input):
        return FusedLayerNormAffineFunction.apply(input, self.weight, self.bias, self.normalized_shape, self.eps)


class ScaledUpperTriangMaskedSoftmax(torch.autograd.Function):
    """fused_softmax.py's, the CUDA extension's kernel one softmax op each way."""

    @staticmethod
    def forward(ctx, inputs, scale):
        scale_t = torch.tensor([scale])
        softmax_results = torch._softmax(inputs, -1, False)  # the extension's forward(inputs, scale_t[0])
        scale_t[0]
        ctx.save_for_backward(softmax_results, scale_t)
        return softmax_results

    @staticmethod
    def backward(ctx, output_grads):
        softmax_results, scale_t = ctx.saved_tensors
        scale_t[0]
        return torch._softmax_backward_data(output_grads, softmax_results, -1, softmax_results.dtype), None


class FusedScaleMaskSoftmax(nn.Module):
    """fused_softmax.py's forward as it runs for a causal fp16 GPT whose sizes take the kernel."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.input_in_float16 = True
        self.scaled_masked_softmax_fusion = True
        self.causal = True

    def forward(self, input, mask):
        assert input.dim() == 4
        data_size = input.size()
        query_seq_len, key_seq_len = data_size[-2], data_size[-1]
        attn_batch_size = data_size[0] * data_size[1]
        custom_kernel_constraint = (
            key_seq_len > 16 and key_seq_len <= 2048 and query_seq_len % 4 == 0 and attn_batch_size % 4 == 0
        )
        if not (self.input_in_float16 and mask is not None and custom_kernel_constraint):
            raise RuntimeError("the sizes must take the fused kernel's path")
        scale = self.scale if self.scale is not None else 1.0
        assert query_seq_len == key_seq_len, "causal mask is only for self attention"
        input = input.view(-1, query_seq_len, key_seq_len)
        probs = ScaledUpperTriangMaskedSoftmax.apply(input, scale)
        return probs.view(*data_size)


@torch.jit.script
def bias_gelu(bias, y):
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


@torch.jit.script
def bias_gelu_back(g, bias, y):
    x = bias + y
    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g


class GeLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        return bias_gelu(bias, input)

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        tmp = bias_gelu_back(grad_output, bias, input)
        return tmp, tmp


def bias_dropout_add(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float, training: bool):
    out = torch.nn.functional.dropout(x + bias, p=prob, training=training)
    return residual + out


@torch.jit.script
def bias_dropout_add_fused_train(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float):
    out = torch.nn.functional.dropout(x + bias, p=prob, training=True)
    return residual + out


class ParallelAttention(nn.Module):
    def __init__(self, width: int, heads: int, layer_number: int):
        super().__init__()
        self.num_attention_heads_per_partition = heads
        self.hidden_size_per_attention_head = width // heads
        self.hidden_size_per_partition = width
        self.query_key_value = ColumnParallelLinear(width, 3 * width)
        coeff = layer_number  # apply_query_key_layer_scaling, on by default
        self.norm_factor = math.sqrt(self.hidden_size_per_attention_head) * coeff
        self.scale_mask_softmax = FusedScaleMaskSoftmax(coeff)
        self.attention_dropout = nn.Dropout(DROPOUT)
        self.dense = RowParallelLinear(width, width)

    def forward(self, hidden_states, attention_mask):
        mixed_x_layer, _ = self.query_key_value(hidden_states)
        new_tensor_shape = mixed_x_layer.size()[:-1] + (
            self.num_attention_heads_per_partition,
            3 * self.hidden_size_per_attention_head,
        )
        mixed_x_layer = mixed_x_layer.view(*new_tensor_shape)
        last_dim_size = mixed_x_layer.size()[-1] // 3  # mpu.split_tensor_along_last_dim
        query_layer, key_layer, value_layer = torch.split(mixed_x_layer, last_dim_size, dim=-1)
        output_size = (query_layer.size(1), query_layer.size(2), query_layer.size(0), key_layer.size(0))
        query_layer = query_layer.reshape(output_size[2], output_size[0] * output_size[1], -1)
        key_layer = key_layer.reshape(output_size[3], output_size[0] * output_size[1], -1)
        matmul_result = torch.empty(
            output_size[0] * output_size[1],
            output_size[2],
            output_size[3],
            dtype=query_layer.dtype,
            device=get_accelerator().current_device_name(),
        )
        matmul_result = torch.baddbmm(
            matmul_result,
            query_layer.transpose(0, 1),
            key_layer.transpose(0, 1).transpose(1, 2),
            beta=0.0,
            alpha=(1.0 / self.norm_factor),
        )
        attention_scores = matmul_result.view(*output_size)
        attention_probs = self.scale_mask_softmax(attention_scores, attention_mask)
        with get_cuda_rng_tracker().fork():
            attention_probs = self.attention_dropout(attention_probs)
        output_size = (value_layer.size(1), value_layer.size(2), query_layer.size(0), value_layer.size(3))
        value_layer = value_layer.reshape(value_layer.size(0), output_size[0] * output_size[1], -1)
        attention_probs = attention_probs.view(output_size[0] * output_size[1], output_size[2], -1)
        context_layer = torch.bmm(attention_probs, value_layer.transpose(0, 1))
        context_layer = context_layer.view(*output_size)
        context_layer = context_layer.permute(2, 0, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.hidden_size_per_partition,)
        context_layer = context_layer.view(*new_context_layer_shape)
        return self.dense(context_layer)


class ParallelMLP(nn.Module):
    def __init__(self, width: int, fused: bool):
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(width, 4 * width, skip_bias_add=True)
        self.bias_gelu_fusion = fused
        self.dense_4h_to_h = RowParallelLinear(4 * width, width)

    def forward(self, hidden_states):
        intermediate_parallel, bias_parallel = self.dense_h_to_4h(hidden_states)
        if self.bias_gelu_fusion:
            intermediate_parallel = GeLUFunction.apply(intermediate_parallel, bias_parallel)
        else:
            intermediate_parallel = F.gelu(intermediate_parallel + bias_parallel)
        return self.dense_4h_to_h(intermediate_parallel)


class ParallelTransformerLayer(nn.Module):
    def __init__(self, width: int, heads: int, layer_number: int, fused: bool):
        super().__init__()
        self.input_layernorm = MixedFusedLayerNorm(width)
        self.attention = ParallelAttention(width, heads, layer_number)
        self.hidden_dropout = DROPOUT
        self.bias_dropout_fusion = fused
        self.post_attention_layernorm = MixedFusedLayerNorm(width)
        self.mlp = ParallelMLP(width, fused)
        self.num_experts = 1

    def forward(self, hidden_states, attention_mask=None, encoder_output=None, enc_dec_attn_mask=None):
        layernorm_output = self.input_layernorm(hidden_states)
        attention_output, attention_bias = self.attention(layernorm_output, attention_mask)
        residual = hidden_states
        if self.bias_dropout_fusion:
            bias_dropout_add_func = bias_dropout_add_fused_train
        else:

            def bias_dropout_add_func(x, bias, residual, prob):
                return bias_dropout_add(x, bias, residual, prob, self.training)

        with torch.enable_grad():
            layernorm_input = bias_dropout_add_func(
                attention_output, attention_bias.expand_as(residual), residual, self.hidden_dropout
            )
        layernorm_output = self.post_attention_layernorm(layernorm_input)
        moe_loss = torch.tensor(0.0, device=layernorm_output.device, dtype=layernorm_output.dtype)
        mlp_bias = torch.tensor(0.0, device=layernorm_output.device, dtype=layernorm_output.dtype)
        mlp_output, mlp_bias = self.mlp(layernorm_output)
        residual = layernorm_input
        with torch.enable_grad():
            output = bias_dropout_add_func(mlp_output, mlp_bias.expand_as(residual), residual, self.hidden_dropout)
        return output, moe_loss


class MegatronStack(nn.Module):
    """ParallelTransformer's layers under `_checkpointed_forward` (checkpoint_num_layers 1)."""

    def __init__(self, layers: int, fused: bool = True, megatron_checkpoint: bool = True):
        super().__init__()
        get_cuda_rng_tracker().set_states({})  # model_parallel_cuda_manual_seed's tensor-parallel state
        get_cuda_rng_tracker().add("model-parallel-rng", 2718)
        self.layers = nn.ModuleList(ParallelTransformerLayer(WIDTH, HEADS, i + 1, fused) for i in range(layers))
        self.megatron_checkpoint = megatron_checkpoint
        mask = torch.tril(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool))
        self.register_buffer("attention_mask", ~mask)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        def custom(start: int, end: int):
            def custom_forward(*inputs):
                x_, attention_mask, encoder_output, enc_dec_attn_mask = inputs
                moe_losses = []
                for index in range(start, end):
                    x_, moe_loss = self.layers[index](
                        x_,
                        attention_mask=attention_mask,
                        encoder_output=encoder_output,
                        enc_dec_attn_mask=enc_dec_attn_mask,
                    )
                    moe_losses.append(moe_loss)
                return (x_, *moe_losses)

            return custom_forward

        for index in range(len(self.layers)):
            run = custom(index, index + 1)
            if self.megatron_checkpoint:
                hidden_states, *_ = CheckpointFunction.apply(run, hidden_states, self.attention_mask, None, None)
            else:  # recomputed whole: an early stop raised inside a TorchScript function fails in it
                with getattr(torch.utils.checkpoint, "set_checkpoint_early_stop", _no_early_stop)(False):
                    hidden_states, *_ = torch_checkpoint(
                        run, hidden_states, self.attention_mask, None, None, use_reentrant=False
                    )
        return hidden_states


# --- the plain eager blocks ---------------------------------------------------------------------------


@contextlib.contextmanager
def _no_early_stop(enabled: bool):
    """torch 2.0's non-reentrant checkpoint, which has no early stop to turn off."""
    yield


class PlainUnfusedBlock(nn.Module):
    """The runs' operations as plain eager PyTorch writes them."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_out = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2).reshape(-1, t, c // self.heads)
                   for z in (q, k, v))  # fmt: skip
        scores = torch.baddbmm(
            torch.empty(q.size(0), t, t), q, k.transpose(1, 2), beta=0.0, alpha=1 / math.sqrt(c // self.heads)
        )
        probs = self.drop(torch.softmax(scores, dim=-1))
        y = torch.bmm(probs, v).view(b, self.heads, t, -1).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.drop(self.c_proj(y))
        return x + self.drop(self.c_out(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class PlainStack(nn.Module):
    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch_checkpoint(block, x, use_reentrant=False)
        return x


# --- measuring ----------------------------------------------------------------------------------------


def variants() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """Each layer stack with its input: [batch, seq, width] for the plain blocks, [seq, batch, width]
    for Megatron's."""
    torch.manual_seed(0)
    plain_in = torch.randn(BATCH, SEQ, WIDTH, requires_grad=True)
    megatron_in = torch.randn(SEQ, BATCH, WIDTH, requires_grad=True)
    runs = {}
    if Block is not None:
        cfg = GPTConfig(n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, bias=True, dropout=0.0)
        runs["parabench"] = (PlainStack([Block(cfg) for _ in range(LAYERS)]), plain_in)
    return {
        **runs,
        "plain": (PlainStack([PlainUnfusedBlock(WIDTH, HEADS) for _ in range(LAYERS)]), plain_in),
        "megatron": (MegatronStack(LAYERS), megatron_in),
        "megatron-nojit": (MegatronStack(LAYERS, fused=False), megatron_in),
        "megatron-torchckpt": (MegatronStack(LAYERS, megatron_checkpoint=False), megatron_in),
    }


def micro_step(model: nn.Module, x: torch.Tensor) -> None:
    """One micro-step of the layer stack: the forward, then the backward with each layer's recompute."""
    model(x).sum().backward()


def seconds_per_layer(model: nn.Module, x: torch.Tensor) -> float:
    """The CPU time this thread spends a layer pass: on a machine other jobs share, the wall clock also
    counts the time the thread waited for a core."""
    start = time.thread_time()
    for _ in range(ITERATIONS):
        micro_step(model, x)
    return (time.thread_time() - start) / ITERATIONS / LAYERS


def op_counts(model: nn.Module, x: torch.Tensor) -> tuple[float, Counter]:
    """aten ops a layer pass dispatches, and of them those called from Python or autograd's engine
    rather than from inside another op (each a crossing into the dispatcher), by name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        micro_step(model, x)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = Counter(e.name for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    return len(events) / LAYERS, top


def python_calls(model: nn.Module, x: torch.Tensor) -> float:
    """Python function calls a layer pass makes (sys.setprofile's 'call' events)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        micro_step(model, x)
    finally:
        sys.setprofile(None)
    return calls / LAYERS


def count_instructions_child() -> None:
    """Under callgrind (collection off at the start): each layer stack's micro-steps, warmed up, then
    counted and dumped one stack at a time, in variants' order."""
    runs = warmed_up()
    for model, x in runs.values():
        torch._C._valgrind_toggle()
        for _ in range(COUNTED_STEPS):
            micro_step(model, x)
        torch._C._valgrind_toggle_and_dump_stats()


def instructions_per_layer(names: list[str]) -> dict[str, float] | None:
    """The host's instructions a layer pass, counted by callgrind (as torch.utils.benchmark's
    collect_callgrind counts them): deterministic where the CPU time moves with the machine's other
    jobs. None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out}/cg.out"]
            + [sys.executable, __file__, CHILD],
            capture_output=True,
            text=True,
        )
        if run.returncode:
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"callgrind's count of the layers failed ({last}): run it without valgrind to see why")
        dumps = sorted(Path(out).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [int(re.search(r"^(?:summary|totals): (\d+)", d.read_text(), re.M).group(1)) for d in dumps]
    return {name: total / COUNTED_STEPS / LAYERS for name, total in zip(names, totals, strict=True)}


def warmed_up() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.set_num_threads(1)
    torch._C._jit_set_profiling_mode(False)  # as megatron/model/transformer.py sets them
    torch._C._jit_set_profiling_executor(False)
    runs = variants()
    for model, x in runs.values():
        model.train()
        for _ in range(WARMUP):
            micro_step(model, x)
    return runs


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "an unnamed CPU"


def main() -> None:
    if CHILD in sys.argv:
        count_instructions_child()
        return
    runs = warmed_up()
    instructions = instructions_per_layer(list(runs))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(REPEATS):  # interleaved, so that the machine's load falls on every variant alike
        for name, (model, x) in runs.items():
            samples[name].append(seconds_per_layer(model, x))
    counts = {name: op_counts(model, x) for name, (model, x) in runs.items()}
    calls = {name: python_calls(model, x) for name, (model, x) in runs.items()}
    best = {name: min(s) for name, s in samples.items()}

    print(f"# A Megatron-DeepSpeed GPT layer's host cost against a plain eager block's: torch {torch.__version__}\n")
    print(f"`python bench/megatron_layer_host.py` on {cpu_model()}, one thread, {LAYERS} layers of")
    print(f"width {WIDTH}, {HEADS} heads, sequence {SEQ}, micro-batch {BATCH}, fp32, dropout {DROPOUT}; each layer's")
    print("forward, recomputed forward and backward (full checkpointing); host time a layer pass: the thread's")
    print(f"CPU time, the median of {REPEATS} interleaved samples of {ITERATIONS} micro-steps (the fastest beside it),")
    print("and its ratio to the plain block's, sample by sample (median and range). aten ops: every op")
    print("the dispatcher ran; from Python or autograd: those not called from inside another op. Instructions:")
    print(f"the host's, a layer pass, counted by callgrind over {COUNTED_STEPS} micro-steps (deterministic, where the")
    print("CPU time moves with the machine's other jobs; no cache misses or stalls in them).\n")
    print(
        "| layer | host us a layer pass (median / fastest) | over plain (median, range) "
        "| instructions (millions) | over plain | aten ops | from Python or autograd | Python calls |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in runs:
        total, top = counts[name]
        ratios = [s / p for s, p in zip(samples[name], samples["plain"], strict=True)]
        counted = (
            f"{instructions[name] / 1e6:.2f} | {instructions[name] / instructions['plain']:.2f}"
            if instructions
            else "no valgrind | -"
        )
        print(
            f"| {name} | {statistics.median(samples[name]) * 1e6:.0f} / {best[name] * 1e6:.0f} "
            f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {counted} | {total:.0f} "
            f"| {sum(top.values()) / LAYERS:.0f} | {calls[name]:.0f} |"
        )
    print("\naten ops from Python or autograd a layer pass, by op (plain, megatron):\n")
    print("| op | plain | megatron |")
    print("|---|---:|---:|")
    plain_ops, megatron_ops = counts["plain"][1], counts["megatron"][1]
    for op in sorted(set(plain_ops) | set(megatron_ops), key=lambda o: -(plain_ops[o] + megatron_ops[o])):
        print(f"| {op} | {plain_ops[op] / LAYERS:g} | {megatron_ops[op] / LAYERS:g} |")


if __name__ == "__main__":
    main()
