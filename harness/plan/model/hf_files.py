"""Hugging Face configs as config.json holds them: `model=hf:<dir or config.json>`, read offline,
and the models of the catalogue, which are such configs. An architecture hf_configs.py lists is
read from its sizes without torch; any other, or a field that table does not know, is built on
the meta device from the real config class (no weights, no download, no remote code). A
mixture-of-experts config of moe_shape.py's architectures is read from its sizes too; any other is
refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.common.numbers import is_whole
from harness.plan.model import hf_configs
from harness.plan.model.model_shape import ModelShape, PlanError, hf_shape

# What a config.json says beside the model's sizes: its provenance and settings no parameter or
# size the planner models depends on.
FILE_METADATA = frozenset(
    {
        "_name_or_path",
        "apply_residual_connection_post_layernorm",
        "architectures",
        "auto_map",
        "model_type",
        "rope_scaling",
        "rope_theta",
        "torch_dtype",
        "transformers_version",
    }
)
# Fields that count experts (Mixtral, Qwen-MoE, OLMoE, DeepSeek, DBRX's ffn_config) or pick them per token.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def experts(fields: dict[str, Any]) -> str | None:
    """The field that makes `fields` a mixture of experts, as `name=value`, or None for a dense model."""
    for key in EXPERT_FIELDS:
        value = fields.get(key)
        if is_whole(value, 2):
            return f"{key}={value}"
    for key, value in fields.items():
        inner = experts(value) if isinstance(value, dict) else None
        if inner:
            return f"{key}.{inner}"
    return None


def refuse_experts(spec: str, fields: dict[str, Any]) -> None:
    found = experts(fields)
    if found:
        from harness.plan.model.moe_shape import MOE_ARCHITECTURES, refuse_unmodelled

        refuse_unmodelled(spec, str(fields.get("model_type", "")))

        raise PlanError(
            f"model {spec}: a mixture-of-experts model ({found}) of a family the planner does not read: plan "
            f"{', '.join(a.config_class for a in MOE_ARCHITECTURES)}, a zoo MoE preset or the catalogue's MoE models"
        )


def config_file(ref: str) -> Path | None:
    """The config.json `hf:<ref>` names (a file, or a directory holding config.json), or None where
    `ref` is a config class or model type; a path that is not there is a one-line error."""
    path = Path(ref).expanduser()
    looks_like_path = "/" in ref or ref.endswith(".json")
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file() and looks_like_path:
        return path
    if not looks_like_path:
        return None
    from harness.plan.model.model_catalogue import named_after

    hint = named_after(ref)
    raise PlanError(
        f"model hf:{ref}: no config.json there; the planner reads configs offline: give a directory holding "
        "config.json or the file itself (huggingface-cli download <repo> config.json fetches it)"
        + (f", or model={hint} from the catalogue" if hint else "")
    )


def read_config(spec: str, path: Path) -> dict[str, Any]:
    try:
        fields = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"model {spec}: cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"model {spec}: {path} is not JSON ({exc})") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        raise PlanError(f"model {spec}: {path} has no model_type: give the config.json of a transformers model")
    return fields


def shape_of_fields(spec: str, fields: dict[str, Any], block_names: list[str] | None = None) -> ModelShape:
    """The shape of the model a config.json's `fields` describe (model_type among them)."""
    if experts(fields):
        from harness.plan.model.moe_shape import catalogue_moe_shape

        shape = None if block_names else catalogue_moe_shape(spec, fields)
        if shape is not None:
            return shape
        refuse_experts(spec, fields)
    model_type = fields.get("model_type")
    arch = hf_configs.architecture(model_type) if isinstance(model_type, str) else None
    if arch is not None and not block_names:
        plain = hf_configs.plain_kwargs(arch, {k: v for k, v in fields.items() if k not in FILE_METADATA})
        if plain is not None:
            return hf_shape(spec, arch, {k: v for k, v in plain.items() if k in arch.defaults})
    return _built(spec, fields, block_names)


def _built(spec: str, fields: dict[str, Any], block_names: list[str] | None) -> ModelShape:
    """Built on the meta device from the config class transformers has for its model_type."""
    import torch
    import transformers

    from harness.plan.model.model_build import shape_of_module
    from models.hf import HFCausalLM

    model_type = str(fields.get("model_type"))
    try:
        cls = type(transformers.AutoConfig.for_model(model_type))
    except ValueError:
        raise PlanError(
            f"model {spec}: model_type {model_type!r} is not one transformers knows (the planner runs no remote "
            "code): describe the model with layers=, width=, heads=, kv_heads=, ffn=, vocab= instead"
        ) from None
    try:
        config = cls.from_dict({k: v for k, v in fields.items() if k != "model_type"})
        with torch.device("meta"):
            model = HFCausalLM(config)
    except Exception as exc:  # the config's validators, a model that is not a causal LM: one line
        raise PlanError(
            f"model {spec}: transformers cannot build a causal LM from it: {str(exc).splitlines()[-1].strip()}"
        ) from None
    return shape_of_module(spec, model, block_names)
