"""The run settings a strategy's config file sets for the whole run (strategies/config_files.py
FileChoice.run_settings: a DeepSpeed JSON's scheduler sets the schedule's shape), taken where the
run leaves them unset, so that every strategy of a compare trains under them, the file's own too.
A file that contradicts what the run sets, or another file of the compare, is a one-line error."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TypeVar

from configs.schema import ConfigError, RunConfig
from strategies.registry import default_registry

Config = TypeVar("Config", bound=RunConfig)


def adopt_file_settings(cfg: Config, names: Iterable[str]) -> tuple[Config, list[str]]:
    """(`cfg` with the settings the config files among the strategies `names` set, where it leaves
    them unset; a line for each file whose settings it took)."""
    registry = default_registry()
    taken: dict[str, tuple[Any, str]] = {}  # key: (value, the file and what in it sets it)
    for name in names:
        file = registry.get(name).config_file
        if file is None:
            continue
        source = f"{file.label} ({file.choice.run_settings_from})"
        for key, value in file.choice.run_settings.items():
            if key in taken and taken[key][0] != value:
                raise ConfigError(
                    f"{taken[key][1]} sets {key}={taken[key][0]} but {source} sets {key}={value}: every strategy of a "
                    f"comparison trains under one {key}; make the two files agree"
                )
            given = getattr(cfg, key)
            if given is not None and given != value:
                raise ConfigError(
                    f"the run sets {key}={given} but {source} sets {key}={value}: drop {key}= so that every strategy "
                    "trains under the file's, or change the file"
                )
            taken.setdefault(key, (value, source))
    adopted = {key: value for key, (value, _) in taken.items() if getattr(cfg, key) is None}
    by_source: dict[str, list[str]] = {}
    for key, value in adopted.items():
        by_source.setdefault(taken[key][1], []).append(f"{key}={value}")
    lines = [f"{', '.join(settings)} for every strategy, from {source}" for source, settings in by_source.items()]
    return replace(cfg, **adopted), lines
