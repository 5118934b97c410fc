"""The library versions parabench is tested with (pyproject.toml's ranges, read from the
installed package's metadata), checked once at start-up: parabench reaches into private
attributes of Accelerate, DeepSpeed and torch's compiler, which change between releases
without notice, so a version outside the range is a one-line error rather than a traceback
from deep inside a backend. PARABENCH_ALLOW_UNTESTED=1 runs anyway.

The dev extra pins, inside those ranges, the releases the test suite runs with (where a range
holds a pair that does not agree); the start-up check holds to the ranges, not the pins."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement

ALLOW_ENV = "PARABENCH_ALLOW_UNTESTED"
# What the ranges cover: the backends and the model libraries, not the test tools.
CHECKED = ("torch", "deepspeed", "accelerate", "transformers", "omegaconf")


class VersionError(ValueError):
    """A backend library outside the tested range (one line, says what to install)."""


def _declared() -> list[Requirement]:
    try:
        return [Requirement(line) for line in requires("parabench") or []]
    except PackageNotFoundError:  # run from a source tree that was never installed: nothing to hold to
        return []


def _for_dev_only(requirement: Requirement) -> bool:
    marker = requirement.marker
    return marker is not None and marker.evaluate({"extra": "dev"}) and not marker.evaluate({"extra": ""})


def tested_ranges() -> dict[str, Requirement]:
    """The range pyproject.toml gives each checked library (where parabench is installed): its
    dependencies' and user extras' ranges, not the dev extra's pins."""
    ranges = {}
    for requirement in _declared():
        if requirement.name in CHECKED and not _for_dev_only(requirement):
            ranges.setdefault(requirement.name, requirement)
    return ranges


def check_versions(env: dict[str, str] | None = None) -> None:
    """Raise VersionError for the first installed library outside its tested range."""
    if (env if env is not None else os.environ).get(ALLOW_ENV) == "1":
        return
    for name, requirement in tested_ranges().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # an optional backend that is not installed is listed as unavailable instead
        if not requirement.specifier.contains(installed, prereleases=True):
            raise VersionError(
                f"{name} {installed} is installed, but parabench is tested with {name}{requirement.specifier}: "
                f"pip install '{name}{requirement.specifier}' (or set {ALLOW_ENV}=1 to run untested)"
            )
