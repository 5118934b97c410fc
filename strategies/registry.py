"""Strategy names -> plugin classes, with preset options per name.

Built-in backends register through `register_strategies(registry)` in their module;
third-party ones through the `parabench.strategies` entry-point group, whose object
is either such a function or a `Strategy` subclass (registered under the entry
point's name). A plugin whose dependency is missing stays listed, with the reason.

A plugin's options are the keyword-only parameters of its __init__; those a name
presets (zero1's stage=1, fsdp-grad-op's reshard_after_forward=False) are what the
name means, so a run cannot override them: results under a name mean one thing.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from strategies.base import RunContext, Strategy, StrategyError

ENTRY_POINT_GROUP = "parabench.strategies"
BUILTIN_MODULES = ("strategies.single", "strategies.ddp", "strategies.fsdp", "strategies.deepspeed", "strategies.accelerate")


@dataclass(frozen=True)
class StrategyEntry:
    name: str
    cls: type[Strategy] | None
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    load_error: str | None = None  # set when the plugin itself could not be loaded

    @property
    def unavailable_reason(self) -> str | None:
        if self.load_error:
            return self.load_error
        return self.cls.unavailable_reason() if self.cls else "not loaded"

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def user_options(self) -> dict[str, Any]:
        """The options a run may set through strategy_options, with their defaults."""
        if self.cls is None:
            return {}
        return {k: v for k, v in _keyword_options(self.cls).items() if k not in self.options}

    def option_values(self) -> dict[str, Any]:
        """Every option's value when a run sets none: the plugin's defaults, then the name's presets."""
        return {**(_keyword_options(self.cls) if self.cls else {}), **self.options}

    def recovers_from_oom(self) -> bool:
        """Whether the batch search may probe several micro-batches of this name in one process."""
        return self.cls is not None and self.cls.recovers_from_oom(self.options)

    def unsupported_reason(self, device_type: str) -> str | None:
        """Why this name cannot run on `device_type` ("cpu" or "cuda"), or None."""
        if self.cls is None:
            return self.unavailable_reason
        return self.cls.unsupported_reason(device_type, self.options)


class StrategyRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, StrategyEntry] = {}

    def register(self, name: str, cls: type[Strategy], description: str = "", **options: Any) -> None:
        if name in self._entries:
            raise StrategyError(f"strategy name {name!r} is registered twice")
        self._entries[name] = StrategyEntry(name, cls, description or cls.description, options)

    def register_broken(self, name: str, reason: str) -> None:
        self._entries.setdefault(name, StrategyEntry(name, None, load_error=reason))

    def names(self) -> list[str]:
        return list(self._entries)

    def available_names(self) -> list[str]:
        return [n for n, e in self._entries.items() if e.available]

    def entries(self) -> list[StrategyEntry]:
        return list(self._entries.values())

    def get(self, name: str) -> StrategyEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise StrategyError(f"unknown strategy {name!r}: known strategies are {', '.join(self._entries)}") from None

    def create(self, name: str, ctx: RunContext, **user_options: Any) -> Strategy:
        """Instantiate `name` with its preset options overlaid by the user's."""
        entry = self.get(name)
        reason = entry.unavailable_reason
        if reason:
            raise StrategyError(f"strategy {name!r} is unavailable here: {reason}")
        assert entry.cls is not None
        fixed = sorted(set(user_options) & set(entry.options))
        if fixed:
            preset = ", ".join(f"{k}={entry.options[k]}" for k in fixed)
            raise StrategyError(f"strategy {name!r} means {preset}: drop strategy_options.{fixed[0]}, or pick the "
                                f"strategy registered with the value you want (runner.py list)")
        allowed = set(entry.user_options())
        unknown = sorted(set(user_options) - allowed)
        if unknown:
            listed = ", ".join(sorted(allowed)) or "none"
            raise StrategyError(f"strategy {name!r} has no option {', '.join(unknown)}: its options are {listed}")
        _check_option_types(name, user_options, _keyword_options(entry.cls))
        strategy = entry.cls(ctx, **{**entry.options, **user_options})
        strategy.name = name
        return strategy


def _keyword_options(cls: type[Strategy]) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: None if p.default is p.empty else p.default for p in params if p.kind is p.KEYWORD_ONLY}


# What a value must be, in words, for each option type a plugin's keyword default can have.
_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def _check_option_types(name: str, options: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Each option must have the type of the plugin's default for it (an int will do for a
    float; a bool is not a number here). Options whose default is None take anything."""
    for key, value in options.items():
        default = defaults.get(key)
        expected = type(default)
        if default is None or expected not in _TYPE_WORDS:
            continue
        if expected is bool:
            fits = isinstance(value, bool)
        else:
            accepted = (int, float) if expected is float else expected
            fits = isinstance(value, accepted) and not isinstance(value, bool)
        if not fits:
            example = str(default).lower() if expected is bool else default
            raise StrategyError(f"strategy {name!r}: strategy_options.{key}={value!r} must be {_TYPE_WORDS[expected]} "
                                f"({expected.__name__}), e.g. strategy_options.{key}={example}")


def _load_entry_points(registry: StrategyRegistry) -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if inspect.isclass(obj) and issubclass(obj, Strategy):
                registry.register(ep.name, obj)
            elif callable(obj):
                obj(registry)
            else:
                registry.register_broken(ep.name, f"entry point {ep.value} is neither a Strategy nor a register function")
        except StrategyError:
            raise
        except Exception as exc:  # a broken third-party plugin is listed, not fatal
            registry.register_broken(ep.name, f"plugin {ep.value} failed to load: {type(exc).__name__}: {exc}")


_DEFAULT: StrategyRegistry | None = None


def default_registry() -> StrategyRegistry:
    """The built-in strategies plus every installed entry-point plugin (built once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        registry = StrategyRegistry()
        for module_name in BUILTIN_MODULES:
            importlib.import_module(module_name).register_strategies(registry)
        _load_entry_points(registry)
        _DEFAULT = registry
    return _DEFAULT
