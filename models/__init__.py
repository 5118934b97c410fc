"""The model zoo, user models by import path, and the data sets they train on.

The names below load models.zoo (and so torch) on first use: the planner reads the GPT presets
from models/gpt_config.py without paying for it."""

from importlib import import_module
from typing import Any

__all__ = ["ModelError", "build_model", "flops_per_token", "known_models", "num_params"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("models.zoo"), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
