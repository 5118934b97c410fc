"""Model specs -> modules: zoo presets by name, or any user model by import path.

`model=gpt-nano` builds a preset; `model=mypkg.mod:build` calls `build(**model_kwargs)`.
Every model keeps the contract `forward(inputs, targets) -> loss`; `num_params` and
`flops_per_token` are taken from the model where it has them, else counted here.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import torch.nn as nn

from models.gpt import GPT, PRESETS
from models.mlp import TokenMLP
from models.moe import MoEGPT
from models.moe_config import MOE_PRESETS
from models.on_meta import on_meta
from models.preset_settings import unknown_setting
from models.zoo_names import TOKEN_MLP


class ModelError(ValueError):
    """A model spec that cannot be built (one line, says what to do)."""


def _check_settings(name: str, preset: Any, overrides: dict[str, Any]) -> None:
    why = unknown_setting(name, preset, overrides)
    if why is not None:
        raise ModelError(why)


def _build_gpt(name: str) -> Callable[..., nn.Module]:
    def build(**overrides: Any) -> nn.Module:
        _check_settings(name, PRESETS[name], overrides)
        try:
            return GPT(dataclasses.replace(PRESETS[name], **overrides))
        except ValueError as exc:  # a size, bias or dropout out of range (the presets' own are in range)
            raise ModelError(f"model {name!r}: model_kwargs.{exc}") from None

    return build


def _build_moe(name: str) -> Callable[..., nn.Module]:
    def build(**overrides: Any) -> nn.Module:
        _check_settings(name, MOE_PRESETS[name], overrides)
        try:
            return MoEGPT(dataclasses.replace(MOE_PRESETS[name], **overrides))
        except ValueError as exc:  # a routing option out of range: one line
            raise ModelError(f"model {name!r}: {exc}") from None

    return build


ZOO: dict[str, Callable[..., nn.Module]] = {name: _build_gpt(name) for name in PRESETS}
ZOO.update({name: _build_moe(name) for name in MOE_PRESETS})
ZOO[TOKEN_MLP] = TokenMLP


def known_models() -> list[str]:
    return list(ZOO)


def _resolve_import(spec: str) -> Callable[..., nn.Module]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model {spec!r}: cannot import {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ModelError(f"model {spec!r}: {module_name} has no attribute {attr!r}") from None


def build_model(spec: str, kwargs: dict[str, Any] | None = None) -> nn.Module:
    """Build the model `spec` names on the current default device."""
    kwargs = dict(kwargs or {})
    if spec in ZOO:
        factory = ZOO[spec]
    elif spec.startswith("hf:"):
        from models.hf import hf_factory  # late: transformers is heavy to import

        factory = hf_factory(spec[3:])
    elif ":" in spec:
        factory = _resolve_import(spec)
    else:
        raise ModelError(
            f"unknown model {spec!r}: use one of {', '.join(ZOO)}, an import path like mypkg.module:build, "
            "or a transformers config class like hf:LlamaConfig"
        )
    try:
        model = factory(**kwargs)
    except TypeError as exc:
        raise ModelError(f"model {spec!r} rejected model_kwargs {kwargs}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {spec!r} built a {type(model).__name__}, not a torch.nn.Module")
    return model


def num_params(model: nn.Module) -> int:
    if hasattr(model, "num_params"):
        return int(model.num_params())
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    if hasattr(model, "flops_per_token"):
        return float(model.flops_per_token(seq_len))
    return 6.0 * num_params(model)  # no attention term known for an arbitrary model


def describe(spec: str) -> dict[str, Any]:
    """Parameter count and shape of a zoo model, built on the meta device (no memory)."""
    with on_meta():
        model = build_model(spec)
    info: dict[str, Any] = {"name": spec, "params": num_params(model)}
    if isinstance(model, (GPT, MoEGPT)):
        c = model.config
        info.update(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, vocab_size=c.vocab_size)
    if isinstance(model, MoEGPT):
        info.update(n_experts=model.config.n_experts, top_k=model.config.top_k)
    return info
