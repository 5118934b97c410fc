"""The model zoo, user models by import path, and the data sets they train on."""

from models.zoo import ModelError, build_model, flops_per_token, known_models, num_params

__all__ = ["ModelError", "build_model", "flops_per_token", "known_models", "num_params"]
