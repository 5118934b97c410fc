"""What counts as a whole number in a config, a JSON file or a model's fields."""

from __future__ import annotations

from typing import Any


def is_whole(value: Any, least: int = 1) -> bool:
    """An int of at least `least`; not a bool, which Python takes for an int (YAML's true is 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
