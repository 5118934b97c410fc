"""Byte units, one of each, and the one way bytes (and milliseconds) are written for a person to read."""

from __future__ import annotations

GIB = 2**30  # memory: what torch and nvidia-smi report, and what a card's capacity is planned in
GB = 1e9  # decimal: network rates and data sizes on the wire

_BINARY_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def byte_unit(largest: float) -> tuple[float, str]:
    """The binary unit to write bytes up to `largest` in: (its size, its name)."""
    for scale, unit in _BINARY_UNITS:
        if abs(largest) >= scale:
            return scale, unit
    return 1, "B"


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a' (a figure that was not measured)."""
    if n is None:
        return "n/a"
    scale, unit = byte_unit(n)
    return f"{n / scale:.3g} {unit}" if scale > 1 else f"{n:.0f} B"


def milliseconds(seconds: float) -> str:
    """Seconds as milliseconds to about three significant figures, so a small model's step is not '0 ms'."""
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"
