"""A zoo preset's settings by name, without importing torch: a model_kwargs key the preset does
not have is one line naming the closest setting it has, for `train`, `compare` and `plan` alike."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any


def unknown_setting(name: str, preset: Any, kwargs: dict[str, Any]) -> str | None:
    """Why `kwargs` does not fit the dataclass `preset` of model `name`, or None where every key is one
    of its fields."""
    fields = [f.name for f in dataclasses.fields(preset)]
    unknown = [key for key in kwargs if key not in fields]
    if not unknown:
        return None
    key = unknown[0]
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f" (did you mean model_kwargs.{close[0]}?)" if close else ""
    return f"model {name!r} has no setting model_kwargs.{key}{hint}: its settings are {', '.join(fields)}"
