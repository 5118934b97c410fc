"""One colour per strategy, the same in every figure of every report and plan."""

from __future__ import annotations

from typing import Iterable

from strategies.registry import default_registry

Colour = tuple[float, float, float]


def strategy_colours(names: Iterable[str]) -> dict[str, Colour]:
    """Each name's colour from matplotlib's tab20, picked by the name's place in the registry;
    names the registry does not hold (a config file run as a strategy) take the colours after
    the registered ones, in the order given."""
    import matplotlib

    palette = matplotlib.colormaps["tab20"].colors
    registered = default_registry().names()
    extra = [name for name in dict.fromkeys(names) if name not in registered]
    order = registered + extra
    return {name: palette[order.index(name) % len(palette)] for name in names}
