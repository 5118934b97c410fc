"""The block classes Accelerate's transformer_based_wrap is told to wrap, checked against the model
before prepare(): Accelerate itself stops there with "Could not find the transformer layer class
Block in the model.", which names neither the setting nor a class that would do. The classes come
from a user's config file (`accelerate:<file.yaml>`) or from `accelerate launch` (its config's
fsdp_transformer_layer_cls_to_wrap, or --fsdp_transformer_layer_cls_to_wrap), in whose environment
they are FSDP_TRANSFORMER_CLS_TO_WRAP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from strategies.base import StrategyError

if TYPE_CHECKING:
    import torch.nn as nn

KEY = "fsdp_transformer_layer_cls_to_wrap"


def launched_wrap_classes(env: Mapping[str, str]) -> str | None:
    """The classes `accelerate launch` told Accelerate to wrap by name, or None where it wraps
    otherwise (no wrap, by size) or names none."""
    if env.get("FSDP_AUTO_WRAP_POLICY", "").strip().upper() != "TRANSFORMER_BASED_WRAP":
        return None
    return env.get("FSDP_TRANSFORMER_CLS_TO_WRAP") or None


def check_wrap_classes(model: nn.Module, names: str, where: str, blocks: list[str] | None = None) -> None:
    """Refuse, in one line, a class in `names` (comma-separated, as Accelerate reads them) that no
    module of `model` has. `where` says what set them ("accelerate:mine.yaml sets fsdp_config."); the
    classes offered instead start with the model's blocks' (`blocks`), then the rest of its own."""
    present = {type(m).__name__ for m in model.modules()}
    missing = [name.strip() for name in str(names).split(",") if name.strip() not in present]
    if not missing:
        return
    others = sorted(present - {type(model).__name__})
    offered = list(dict.fromkeys([*(blocks or []), *others]))
    raise StrategyError(
        f"{where}{KEY}: {missing[0]}, which the model has no module of: name one of its classes "
        f"({', '.join(offered[:8])})"
    )
