"""Which strategy gets which `strategy_options`, when one command names several strategies
(`runner.py compare`, `runner.py plan`, `plan search=true`): one rule, here, for all of them.

- `strategy_options.<key>=` is compare-wide: it reaches every strategy of the command that takes
  `key`, and a key none of them takes is a one-line error naming the closest one they do take;
- `strategy_options.<name>.<key>=` (a section named after a registered strategy) reaches that
  strategy alone, and a section for a strategy the command does not run, or for no registered
  strategy, is a one-line error.

What a strategy takes is what `train` takes: the keyword options of its class less those its
name presets (StrategyEntry.user_options), read from the registry at run time, so a strategy that
learns an option is routed it without an edit here. `train` runs one strategy, and refuses an
option it does not take (StrategyRegistry.check_options).

Nothing here imports torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from strategies.base import StrategyError


@dataclass(frozen=True)
class RoutedOptions:
    by_strategy: dict[str, dict[str, Any]]  # each strategy's options: the compare-wide ones it takes, then its section
    takers: dict[str, list[str]]  # each compare-wide option -> the strategies that take it, in the command's order

    def reaches(self) -> list[str]:
        """A line for each compare-wide option: the strategies it reaches."""
        return [f"strategy_options.{key} reaches {', '.join(names)}" for key, names in self.takers.items()]


def is_section(key: str, value: Any, registered: Collection[str]) -> bool:
    """Whether `strategy_options.<key>` is a strategy's own section rather than a compare-wide option."""
    return isinstance(value, Mapping) and key in registered


def compare_wide(options: Mapping[str, Any], registered: Collection[str]) -> dict[str, Any]:
    """The options of `strategy_options.<key>=`: for every strategy that takes `key`."""
    return {k: v for k, v in options.items() if not is_section(k, v, registered)}


def section(options: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The options of `strategy_options.<name>.<key>=`: for strategy `name` alone."""
    own = options.get(name)
    return dict(own) if isinstance(own, Mapping) else {}


def route_options(
    options: Mapping[str, Any],
    names: Collection[str],
    registered: Collection[str],
    takes: Callable[[str], Collection[str]],
    *,
    verb: str = "compare",
    adjective: str = "compared",
) -> RoutedOptions:
    """`options` split over the strategies `names` of one command (`verb`: compare, plan; `adjective`:
    compared, planned):
    `takes(name)` is what strategy `name` accepts. One line (StrategyError) for a section of a
    strategy the command does not run, or a compare-wide option none of `names` takes."""
    for key, value in options.items():
        if is_section(key, value, registered) and key not in names:
            raise StrategyError(
                f"strategy_options.{key} is for strategy {key!r}, which this {verb} does not run: "
                f"add it to strategies= or drop the section"
            )
    wide = compare_wide(options, registered)
    accepted = {name: set(takes(name)) for name in names}
    takers = {key: [name for name in names if key in accepted[name]] for key in wide}
    for key, found in takers.items():
        if not found and isinstance(wide[key], Mapping):
            # `<key>.<option>=`: a section, for a strategy of no registered name (none takes `key` as an option)
            close = difflib.get_close_matches(key, list(registered), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise StrategyError(
                f"unknown strategy {key!r} in strategy_options.{key}.*: {hint}known strategies are "
                f"{', '.join(registered)}"
            )
        if not found:
            known = sorted(set().union(*accepted.values())) if accepted else []
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            listed = ", ".join(known) or "none"
            if len(accepted) == 1:
                raise StrategyError(
                    f"strategy {next(iter(accepted))!r} has no option {key}: {hint}its options are {listed} "
                    "(runner.py list shows each strategy's)"
                )
            raise StrategyError(
                f"strategy_options.{key} is an option of none of the {adjective} strategies: {hint}their options are "
                f"{listed} (runner.py list shows each strategy's)"
            )
    by_strategy = {
        name: {**{k: v for k, v in wide.items() if k in accepted[name]}, **section(options, name)} for name in names
    }
    return RoutedOptions(by_strategy, {key: found for key, found in takers.items()})
