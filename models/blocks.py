"""Which modules of a model are its blocks: the unit FSDP shards, ZeRO-3 and compile work
through one at a time, and activation checkpointing recomputes.

Every backend and the planner ask `find_blocks`, so a user's model is cut the same way
everywhere. In order of precedence:
  model_blocks=<ClassName,...>  the run names the classes (as Lightning's and Accelerate's wrap
                                policies take class names)
  transformer_blocks()          the model says (parabench's GPT and MLP, `hf:` models)
  _no_split_modules             a Hugging Face model says, on itself or any submodule
  repeated layers               the same class repeated in an nn.ModuleList or nn.Sequential,
                                anywhere in the model: the group holding most parameters
A model with none of these has no blocks: it is one unit, and `Blocks.warning` says what
that costs and how to name them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch.nn as nn

FOUND_BY_NAMES = "model_blocks="
FOUND_BY_METHOD = "transformer_blocks()"
FOUND_BY_HF = "_no_split_modules"
FOUND_BY_REPEATS = "repeated layers"
FOUND_NONE = "none"


class BlocksError(ValueError):
    """model_blocks= names a class the model does not have (one line, lists the classes it has)."""


@dataclass(frozen=True)
class Blocks:
    """A model's blocks, in the order the model runs them (module order where it does not say)."""

    modules: tuple[nn.Module, ...]
    # Each block's class name when found: wrapping renames classes (FSDP2's FSDPDecoderLayer).
    module_classes: tuple[str, ...]
    found_by: str  # one of the FOUND_* values
    model_classes: tuple[str, ...]  # every module class of the model, for the messages

    @property
    def count(self) -> int:
        return len(self.modules)

    @property
    def classes(self) -> list[str]:
        """The blocks' class names, each once, in block order."""
        return list(dict.fromkeys(self.module_classes))

    def describe(self) -> str:
        """'6 DecoderLayer', or '6 Linear + 1 LayerNorm' for blocks of several classes."""
        if not self.modules:
            return "no blocks"
        counts = Counter(self.module_classes)
        return " + ".join(f"{counts[name]} {name}" for name in self.classes)

    @property
    def warning(self) -> str | None:
        """What a model without blocks costs, and how to name them; None when there are blocks."""
        if self.modules:
            return None
        return (
            "no repeated layers found, so the model has no blocks: under FSDP it is one unit, every parameter is "
            "gathered at once for the forward, so FSDP saves no parameter memory during it, and compile=true compiles "
            "it whole; name the blocks with model_blocks=<ClassName>; classes in this model: "
            + ", ".join(self.model_classes)
        )

    def as_dict(self) -> dict:
        return {"found_by": self.found_by, "count": self.count, "classes": self.classes, "warning": self.warning}


def find_blocks(model: nn.Module, names: list[str] | None = None) -> Blocks:
    """The blocks of `model`; `names` (model_blocks=) overrides every other way of finding them."""
    classes = tuple(dict.fromkeys(type(m).__name__ for m in model.modules()))

    def found(modules: tuple[nn.Module, ...], how: str) -> Blocks:
        return Blocks(modules, tuple(type(m).__name__ for m in modules), how, classes)

    if names:
        return found(_named(model, list(names), classes), FOUND_BY_NAMES)
    if callable(getattr(model, "transformer_blocks", None)):
        return found(_outermost(list(model.transformer_blocks())), FOUND_BY_METHOD)
    hf_names = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or ())}
    hf_blocks = _outermost([m for m in model.modules() if m is not model and type(m).__name__ in hf_names])
    if hf_blocks:
        return found(hf_blocks, FOUND_BY_HF)
    repeated = _largest_repeated_group(model)
    if repeated:
        return found(repeated, FOUND_BY_REPEATS)
    return found((), FOUND_NONE)


def _named(model: nn.Module, names: list[str], classes: tuple[str, ...]) -> tuple[nn.Module, ...]:
    submodules = [m for m in model.modules() if m is not model]
    present = {type(m).__name__ for m in submodules}
    missing = [name for name in names if name not in present]
    if missing:
        raise BlocksError(
            f"model_blocks={','.join(missing)} matches no module of this model: its module classes are "
            f"{', '.join(classes)}"
        )
    return _outermost([m for m in submodules if type(m).__name__ in names])


def _outermost(modules: list[nn.Module]) -> tuple[nn.Module, ...]:
    """`modules` without any that sits inside another of them: blocks must not nest
    (FSDP would shard the inner one twice over, checkpointing would recompute it twice)."""
    inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
    seen: set[int] = set()
    out = []
    for m in modules:
        if id(m) not in inner and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return tuple(out)


def _largest_repeated_group(model: nn.Module) -> tuple[nn.Module, ...]:
    """Among the direct children of every nn.ModuleList and nn.Sequential in the model, the
    largest group (by parameters, then by members) of two or more of the same class."""
    best: tuple[int, int] = (0, 0)
    chosen: tuple[nn.Module, ...] = ()
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        groups: dict[type, list[nn.Module]] = {}
        for child in container.children():
            groups.setdefault(type(child), []).append(child)
        for members in groups.values():
            params = sum(p.numel() for p in {id(p): p for m in members for p in m.parameters()}.values())
            if len(members) >= 2 and params and (params, len(members)) > best:
                best, chosen = (params, len(members)), tuple(members)
    return chosen
