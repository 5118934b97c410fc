"""The model zoo: contract, sizes, flops per token, user models by import path."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from models.gpt import GPT, PRESETS
from models.zoo import ModelError, build_model, describe, flops_per_token, num_params
from tests.helpers import run_bounded


@pytest.mark.parametrize(
    "name, millions", [("gpt2-124m", 124), ("gpt2-350m", 354), ("gpt2-774m", 772), ("gpt2-1.5b", 1555)]
)
def test_gpt2_presets_have_their_published_sizes(name, millions):
    assert describe(name)["params"] / 1e6 == pytest.approx(millions, rel=0.01)


def test_nano_is_small_enough_for_cpu_tests():
    assert describe("gpt-nano")["params"] < 1e6


def test_flops_per_token_is_6n_plus_attention():
    model = build_model("gpt-nano")
    c = model.config
    assert flops_per_token(model, 64) == 6 * num_params(model) + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * 64


def test_params_count_tied_weights_once_and_leave_out_positions():
    model = build_model("gpt-nano")
    unique = sum(p.numel() for p in model.parameters())  # parameters() already yields the tied one once
    assert model.num_params() == unique - model.wpe.weight.numel()
    assert model.lm_head.weight is model.wte.weight


@pytest.mark.parametrize("spec", ["gpt-nano", "mlp"])
def test_contract_forward_inputs_targets_gives_a_scalar_loss(spec):
    model = build_model(spec)
    x = torch.randint(0, model.vocab_size, (2, 16))
    loss = model(x, x)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = build_model("gpt-nano")
    x = torch.randint(0, 128, (2, 16))
    model(x, x).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.activation_checkpointing = True
    model(x, x).backward()
    for a, p in zip(plain, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)


def test_user_model_by_import_path_with_kwargs():
    model = build_model("models.mlp:TokenMLP", {"vocab_size": 64, "width": 32, "depth": 1})
    assert model.vocab_size == 64 and num_params(model) == 64 * 32 + 32 * 32 + 32


def test_preset_overrides_through_model_kwargs():
    assert build_model("gpt-nano", {"n_layer": 3}).config.n_layer == 3


@pytest.mark.parametrize(
    "spec, kwargs, expected",
    [
        ("gpt-enormous", {}, "unknown model 'gpt-enormous'"),
        ("no_such_pkg.mod:build", {}, "cannot import 'no_such_pkg.mod'"),
        ("models.mlp:Nothing", {}, "has no attribute 'Nothing'"),
        ("gpt-nano", {"n_layers": 3}, r"no setting model_kwargs.n_layers \(did you mean model_kwargs.n_layer\?\)"),
        ("moe-nano", {"experts": 4}, r"did you mean model_kwargs.n_experts\?\): its settings are n_layer,"),
        ("mlp", {"widht": 3}, "rejected model_kwargs"),  # a model of its own arguments, not a preset
        ("models.data:uniform_loss", {"vocab_size": 3}, "not a torch.nn.Module"),
    ],
)
def test_bad_model_specs_are_clear(spec, kwargs, expected):
    with pytest.raises(ModelError, match=expected):
        build_model(spec, kwargs)


def test_every_preset_builds_on_meta():
    for name in PRESETS:
        with torch.device("meta"):
            assert isinstance(build_model(name), GPT)


BUILD_AFTER_META = """
import json, sys, torch
from models.on_meta import on_meta
from models.zoo import build_model
spec, kwargs, first = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
if first == "meta":
    with on_meta():
        assert all(p.is_meta for p in build_model(spec, kwargs).parameters())
torch.manual_seed(0)
print(sum(p.double().abs().sum().item() for p in build_model(spec, kwargs).parameters()))
"""
TINY_LLAMA = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.mark.parametrize(
    "spec, kwargs",
    [
        ("gpt-nano", {}),
        pytest.param(
            "hf:LlamaConfig",
            {**TINY_LLAMA, "vocab_size": 64},
            marks=pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers"),
        ),
    ],
)
def test_a_meta_build_leaves_the_next_real_build_initialised_as_before(spec, kwargs):
    """The checks before a run build the model on the meta device in the process that may then
    train it: a library first imported during that build (transformers) must still initialise."""
    weights = {}
    for first in ("meta", "real"):
        proc = run_bounded([sys.executable, "-c", BUILD_AFTER_META, spec, json.dumps(kwargs), first], timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        weights[first] = float(proc.stdout.split()[-1])
    assert weights["meta"] == weights["real"] > 0


def test_hf_model_kwargs_take_zero_dropout_but_not_zero_sizes():
    from models.hf import HFModelError, build_config

    config = build_config("GPT2Config", {"n_layer": 2, "resid_pdrop": 0.0, "embd_pdrop": 0, "attn_pdrop": 0.0})
    assert config.resid_pdrop == 0.0 and config.embd_pdrop == 0
    with pytest.raises(HFModelError, match="model_kwargs.n_layer=0 must be positive"):
        build_config("GPT2Config", {"n_layer": 0})
    with pytest.raises(HFModelError, match="model_kwargs.resid_pdrop=-0.1 must be positive"):
        build_config("GPT2Config", {"resid_pdrop": -0.1})


def test_the_zoo_names_known_without_torch_are_the_zoo_s():
    from models.zoo import known_models
    from models.zoo_names import ZOO_NAMES

    assert list(ZOO_NAMES) == known_models()


def test_an_unknown_model_name_is_answered_without_importing_torch():
    """The plan's 'unknown model' line lists the zoo's names; reading them must not cost torch's import."""
    probe = (
        "import sys\n"
        "from harness.plan.model.model_catalogue import check_known\n"
        "from harness.plan.model.model_shape import PlanError\n"
        "try:\n    check_known('no-such-model')\nexcept PlanError as exc:\n    assert 'gpt-nano' in str(exc)\n"
        "assert 'torch' not in sys.modules\n"
    )
    done = run_bounded([sys.executable, "-c", probe], timeout=60)
    assert done.returncode == 0, done.stderr
