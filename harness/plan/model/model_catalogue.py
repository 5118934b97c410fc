"""Public models by name for `runner.py plan model=<name>`: the shapes model_catalogue.json holds,
each with the hub repository whose config.json it copies and the paper that publishes its sizes.
A name is planned as `model=hf:<its config.json>` would be (hf_files.py); the GPT-2 sizes are
the zoo's presets."""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.plan.model.model_shape import ModelShape, PlanError, shape_of_spec
from harness.plan.model.moe_shape import total_params
from models.gpt_config import PRESETS
from models.zoo_names import ZOO_NAMES

CATALOGUE_FILE = Path(__file__).with_name("model_catalogue.json")
NORMS = {"RMSNorm": True, "LayerNorm": False}  # the norm, and whether the shape's blocks use RMSNorm
ACTIVATIONS = {"SwiGLU": True, "GeGLU": True, "GELU": False}  # the MLP's activation, and whether it is gated


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    hub: str  # the Hugging Face repository whose config.json the sizes are
    paper: str  # where the sizes are published
    norm: str
    activation: str
    config: dict[str, Any] = field(default_factory=dict)  # config.json's shape fields; empty for a preset

    @property
    def preset(self) -> bool:
        return not self.config


def _entry(name: str, raw: dict[str, Any]) -> CatalogueEntry:
    """One entry of the file, checked: a broken table is the project's bug, said as such."""
    entry = CatalogueEntry(
        name,
        raw["hub"],
        raw["paper"],
        raw["norm"],
        raw["activation"],
        {} if raw.get("preset") else raw["config"],
    )
    if entry.norm not in NORMS or entry.activation not in ACTIVATIONS:
        raise ValueError(
            f"{CATALOGUE_FILE.name}: {name}: norm {entry.norm!r} or activation {entry.activation!r} unknown"
        )
    if entry.preset and name not in PRESETS:
        raise ValueError(f"{CATALOGUE_FILE.name}: {name} is marked a preset, but the zoo has no such preset")
    if not entry.preset and "max_position_embeddings" not in entry.config:
        raise ValueError(f"{CATALOGUE_FILE.name}: {name} states no max_position_embeddings")
    return entry


@functools.cache
def catalogue() -> dict[str, CatalogueEntry]:
    models = json.loads(CATALOGUE_FILE.read_text())["models"]
    return {name: _entry(name, raw) for name, raw in models.items()}


def entry(name: str) -> CatalogueEntry | None:
    return catalogue().get(name)


def named_after(repo: str) -> str | None:
    """The catalogue's name for the hub repository `repo`, if it has one."""
    return next((e.name for e in catalogue().values() if e.hub.lower() == repo.strip("/").lower()), None)


def check_known(name: str) -> None:
    """A plain name that is neither in the catalogue nor in the zoo: one line naming the closest and all."""
    zoo = ZOO_NAMES
    if name in zoo or name in catalogue():
        return
    names = list(dict.fromkeys([*catalogue(), *zoo]))
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    raise PlanError(
        f"unknown model {name!r}: {guess}known names: {', '.join(names)}; or hf:<dir or config.json>, "
        "hf:<ConfigClass>, pkg.module:build, or layers= width= heads= ..."
    )


@dataclass(frozen=True)
class Summary:
    """What `runner.py list` and docs/planner.md show of an entry."""

    entry: CatalogueEntry
    shape: ModelShape
    tied: bool
    max_seq: int


def summary(name: str) -> Summary:
    e = catalogue()[name]
    shape = shape_of_spec(name)
    if e.preset:
        # models/gpt.py ties its head to the embedding; its positions are learned up to block_size.
        return Summary(e, shape, True, PRESETS[name].block_size)
    from harness.plan.model import hf_configs

    arch = hf_configs.architecture(e.config["model_type"])
    if arch is None:  # a mixture of experts (moe_shape.py): its config states whether the head is tied
        return Summary(e, shape, bool(e.config["tie_word_embeddings"]), int(e.config["max_position_embeddings"]))
    tied = bool(arch.sizes(e.config)["tie_word_embeddings"])
    return Summary(e, shape, tied, int(e.config["max_position_embeddings"]))


def catalogue_listing() -> list[str]:
    """One line per model of the catalogue: its sizes and where they come from."""
    lines = []
    for name in catalogue():
        s = summary(name)
        d = s.shape.dims
        assert d is not None
        heads = f"{d.heads}" if d.kv_heads == d.heads else f"{d.heads}/{d.kv_heads}kv"
        ffn = f"F={d.ffn_width}" if d.moe is None else f"E={d.moe.experts}x{d.moe.expert_ffn} top-{d.moe.top_k}"
        lines.append(
            f"  {name:<16} {total_params(s.shape) / 1e9:>7.2f}B  L={d.layers} W={d.width} H={heads} {ffn} "
            f"V={d.vocab} seq<={s.max_seq} {s.entry.norm} {s.entry.activation}{' tied' if s.tied else ''}  "
            f"({s.entry.hub})"
        )
    return lines
