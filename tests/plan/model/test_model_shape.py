"""Model shapes read without torch (the zoo's GPT presets, the hf: architectures of hf_configs.py,
a description) are the shapes the built model has; a plan imports no torch and answers in under
a second."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.plan.memory.model_states import tp_slice
from harness.plan.model.model_build import built_shape
from harness.plan.model.model_shape import ParamTensor, PlanError, shape_of_description, shape_of_spec
from tests.helpers import ROOT, env_for_tests

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)


@pytest.mark.parametrize(
    "spec,kwargs",
    [
        ("gpt2-124m", {}),
        ("gpt-nano", {"n_embd": 66, "n_head": 3, "vocab_size": 131}),
        ("gpt-nano", {"bias": True}),
        ("hf:LlamaConfig", {**TINY, "num_key_value_heads": 2}),
        ("hf:LlamaConfig", {**TINY, "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
        ("hf:llama", {**TINY, "head_dim": 32, "rms_norm_eps": 1e-5}),
        ("hf:MistralConfig", {**TINY, "num_key_value_heads": 2}),
        ("hf:Qwen2Config", {**TINY, "num_key_value_heads": 2}),
        ("hf:GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_inner": 100}),
        ("hf:gpt2", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}),
    ],
)
def test_a_shape_read_from_its_sizes_is_the_built_models(spec, kwargs):
    read, built = shape_of_spec(spec, kwargs), built_shape(spec, kwargs, None)
    assert read.tensors == built.tensors  # every tensor, its shape, its block, in the model's order
    assert (read.params, read.flops_params, read.param_modules) == (
        built.params,
        built.flops_params,
        built.param_modules,
    )
    assert read.dims == built.dims


def test_the_hf_table_holds_each_config_classs_own_defaults():
    import transformers

    from harness.plan.model.hf_configs import ARCHITECTURES
    from models.hf import _known_fields

    for arch in ARCHITECTURES:
        cls = getattr(transformers, arch.config_class)
        config, sizes = cls(), arch.sizes({})
        for key in arch.defaults:
            if key in _known_fields(cls):
                assert sizes[key] == getattr(config, key), (arch.config_class, key)
        assert arch.inert <= _known_fields(cls), arch.config_class  # each a field the class has


def test_an_hf_field_the_table_does_not_know_goes_to_the_real_config_class():
    with pytest.raises(ValueError, match="no field hiden_size"):
        shape_of_spec("hf:LlamaConfig", {"hiden_size": 64})


def test_described_transformers():
    preset = shape_of_spec("gpt2-124m")
    described = shape_of_description(params=None, layers=12, width=768, heads=12, vocab=50304, seq_len=1024)
    assert described.params == preset.params and described.dims == preset.dims
    llama = shape_of_description(
        params=None, layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192, arch="llama"
    )
    assert 8.0e9 < llama.params < 8.1e9 and llama.dims.gated_mlp and llama.dims.rotary and llama.dims.kv_heads == 8
    guessed = shape_of_description(params=7.5e9, layers=None, width=None, heads=None, vocab=None, seq_len=1024)
    assert guessed.params == 7.5e9 and "assumed" in guessed.note
    with pytest.raises(PlanError, match="must be a multiple of kv_heads=3"):
        shape_of_description(params=None, layers=2, width=64, heads=4, kv_heads=3, vocab=10, seq_len=8)


def test_a_described_gpt_with_biases_has_one_tensor_more_for_each_linear_and_norm():
    plain = shape_of_description(params=None, layers=12, width=768, heads=12, vocab=50304, seq_len=1024)
    biased = shape_of_description(params=None, layers=12, width=768, heads=12, vocab=50304, seq_len=1024, biases=True)
    # Per block: two norms and four linear layers; and the final norm.
    assert len(biased.tensors) == len(plain.tensors) + 12 * 6 + 1
    assert biased.params - plain.params == 12 * (2 * 768 + 3 * 768 + 768 + 4 * 768 + 768) + 768
    assert biased.dims == plain.dims and "biases" in biased.name
    with pytest.raises(PlanError, match="biases are described for arch=gpt only"):
        shape_of_description(params=None, layers=2, width=64, heads=4, vocab=10, seq_len=8, arch="llama", biases=True)


def test_one_description_is_one_shape_and_equal_tensors_slice_to_one_tensor():
    """A plan's per-model caches key on the shape's tensors: the published rows of one model, hundreds
    of them, share the work only if they share the shape, and its tensors' slices."""
    llama = dict(params=None, layers=4, width=256, heads=8, kv_heads=2, vocab=1000, seq_len=512, arch="llama")
    shape = shape_of_description(**llama)
    assert shape_of_description(**llama) is shape
    assert shape_of_description(**{**llama, "layers": 5}) is not shape
    matrix = next(t for t in shape.tensors if len(t.shape) == 2 and t.block is not None)
    copy = ParamTensor(matrix.shape, matrix.block)
    assert copy is not matrix and tp_slice(copy, 2) is tp_slice(matrix, 2)
    assert tp_slice(matrix, 2).shape == (matrix.shape[0] // 2, matrix.shape[1])


def test_a_plan_imports_no_torch():
    """plan runs where torch is not installed (a laptop asking about a cluster): nothing it imports
    pulls torch in. How fast it answers is bench/plan_search.py's to measure, not a unit test's."""
    code = (
        "import sys; import runner; "
        "runner.main(['plan', 'model=hf:LlamaConfig', 'model_kwargs.num_hidden_layers=80', 'gpus=[8,64]', "
        "'activation_checkpointing=selective']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env_for_tests()
    )
    assert proc.returncode == 0, proc.stderr
