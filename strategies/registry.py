"""Strategy names -> plugin classes, with preset options per name.

A backend is one module: its Strategy class lists the names it registers (`presets`), each
with the options that name fixes and its planner model, and the registry finds it. Built-in
backends are every module of the `strategies` package (sub-packages included); others come
from the `parabench.strategies` entry-point group, whose object is a `Strategy` subclass (its
presets, or the entry point's name) or a `register_strategies(registry)` function, or from
modules named in PARABENCH_PLUGINS (import paths, comma-separated: a plugin in one file, no
packaging). A plugin whose dependency is missing stays listed, with the reason.

A class that declares `config_file_kind` also runs a user's own config file of that kind, named
`<kind>:<path>` (`accelerate:mine.yaml`, `deepspeed:ds.json`): `get` reads the file and answers
with the entry of the built-in it amounts to, under the file's name (strategies/config_files.py).

A plugin's options are the keyword-only parameters of its __init__; those a name
presets (zero1's stage=1, fsdp-grad-op's reshard_after_forward=False) are what the
name means, so a run cannot override them: results under a name mean one thing.

Nothing here imports torch: `runner.py list` and `runner.py plan` read the presets without it.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import inspect
import os
import pkgutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import strategies
from strategies.base import Preset, RunContext, Strategy, StrategyError
from strategies.config_files import ConfigFile, split_spec
from strategies.mesh_layout import MeshError, MeshLayout
from strategies.parallel_dims import ModelFacts
from strategies.plan_model import PlanModel

ENTRY_POINT_GROUP = "parabench.strategies"
EXAMPLE_FILES = {"deepspeed": "ds_config.json", "accelerate": "accelerate_config.yaml"}
PLUGINS_ENV = "PARABENCH_PLUGINS"


@dataclass(frozen=True)
class StrategyEntry:
    name: str
    cls: type[Strategy] | None
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    load_error: str | None = None  # set when the plugin itself could not be loaded
    plan: PlanModel | None = None  # the planner's model of this name; None: not planned
    config_file: ConfigFile | None = None  # set for `<kind>:<path>`: the file and the built-in it runs as
    takes: tuple[str, ...] | None = None  # the options a run may set under this name (None: every one not fixed)

    @property
    def resolves_to(self) -> str | None:
        """The built-in name a config file runs as (None for a registered name)."""
        return self.config_file.choice.builtin if self.config_file else None

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
        options = _keyword_options(self.cls)
        names = options if self.takes is None else [k for k in self.takes if k in options]
        return {k: options[k] for k in names if k not in self.options}

    def option_values(self) -> dict[str, Any]:
        """Every option's value when a run sets none: the plugin's defaults, then the name's presets."""
        return {**self.user_options(), **self.options}

    @property
    def one_process(self) -> bool:
        """Whether a compare runs this name as one process, whatever its process count."""
        return self.cls is not None and bool(vars(self.cls).get("one_process", False))

    def takes_deepspeed_config(self) -> bool:
        """Whether a run's deepspeed_config= reaches this name (Strategy.takes_deepspeed_config)."""
        return self.cls is not None and self.cls.takes_deepspeed_config(self.config_file)

    def recovers_from_oom(self) -> bool:
        """Whether the batch search may probe several micro-batches of this name in one process."""
        return self.cls is not None and self.cls.recovers_from_oom(self.options)

    def unsupported_reason(self, device_type: str, options: dict[str, Any] | None = None) -> str | None:
        """Why this name, with a run's strategy `options`, cannot run on `device_type` ("cpu" or
        "cuda"), or None."""
        if self.cls is None:
            return self.unavailable_reason
        return self.cls.unsupported_reason(device_type, {**(options or {}), **self.options})

    def fp8_refusal(self) -> str | None:
        """Why this name cannot train with precision=fp8, or None."""
        if self.cls is None:
            return self.unavailable_reason
        return self.cls.fp8_refusal(self.options)


class StrategyRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, StrategyEntry] = {}
        self._file_kinds: dict[str, type[Strategy]] = {}  # config file kind -> the class that declares it
        # `<kind>:<path>` entries, by name and the file's size and modification time: read once per version.
        self._file_entries: dict[tuple[str, int, int], StrategyEntry] = {}

    def register(
        self,
        name: str,
        cls: type[Strategy],
        description: str = "",
        plan: PlanModel | None = None,
        takes: tuple[str, ...] | None = None,
        **options: Any,
    ) -> None:
        if name in self._entries:
            raise StrategyError(f"strategy name {name!r} is registered twice")
        self._entries[name] = StrategyEntry(name, cls, description or cls.description, options, plan=plan, takes=takes)

    def register_class(self, cls: type[Strategy], default_name: str | None = None) -> None:
        """Every name `cls` presets; a class with no presets under `default_name`."""
        # Its own presets: a plugin subclassing a built-in does not register the built-in's names again.
        presets = vars(cls).get("presets") or ((Preset(default_name, cls.description),) if default_name else ())
        for preset in presets:
            self.register(preset.name, cls, preset.description, preset.plan, preset.takes, **preset.options)
        if cls.config_file_kind:
            declaring = next(c for c in cls.__mro__ if "config_file_kind" in vars(c))
            self.register_file_kind(cls.config_file_kind, declaring)

    def register_file_kind(self, kind: str, cls: type[Strategy]) -> None:
        """`<kind>:<path>` names a config file that `cls.resolve_config_file` resolves."""
        known = self._file_kinds.setdefault(kind, cls)
        if known is not cls:
            raise StrategyError(f"config file kind {kind!r} is registered twice ({known.__name__}, {cls.__name__})")

    def file_kinds(self) -> list[str]:
        return list(self._file_kinds)

    def register_broken(self, name: str, reason: str) -> None:
        self._entries.setdefault(name, StrategyEntry(name, None, load_error=reason))

    def names(self) -> list[str]:
        return list(self._entries)

    def planned_names(self) -> list[str]:
        """The names the planner has a model of."""
        return [n for n, e in self._entries.items() if e.plan is not None]

    def available_names(self) -> list[str]:
        return [n for n, e in self._entries.items() if e.available]

    def entries(self) -> list[StrategyEntry]:
        return list(self._entries.values())

    def get(self, name: str) -> StrategyEntry:
        if name in self._entries:
            return self._entries[name]
        spec = split_spec(name)
        if spec is not None and spec[0] in self._file_kinds:
            return self._file_entry(name, *spec)
        files = "".join(f", or {kind}:<file>" for kind in self._file_kinds)
        close = difflib.get_close_matches(name, [*self._entries, *self._file_kinds], n=1)
        hint = ""
        if close:
            hint = f"did you mean {close[0] + ':<file>' if close[0] in self._file_kinds else close[0]!r}? "
        raise StrategyError(f"unknown strategy {name!r}: {hint}known strategies are {', '.join(self._entries)}{files}")

    def _file_entry(self, name: str, kind: str, path: str) -> StrategyEntry:
        """The entry of `<kind>:<path>`: the built-in the file resolves to, under the file's name."""
        if not path.strip():
            raise StrategyError(
                f"strategy {name!r} names no file: write the path of your {kind} config file after the colon, "
                f"e.g. {kind}:{EXAMPLE_FILES.get(kind, 'my_config')}"
            )
        file = Path(path)
        if not file.is_file():
            raise StrategyError(
                f"strategy {name!r} names no file {path!r}: give the path of the {kind} config file, relative to the "
                "directory you run parabench from"
            )
        stat = file.stat()
        key = (name, stat.st_size, stat.st_mtime_ns)
        if key not in self._file_entries:
            self._file_entries[key] = self._resolve_file(name, kind, file)
        return self._file_entries[key]

    def _resolve_file(self, name: str, kind: str, file: Path) -> StrategyEntry:
        owner = self._file_kinds[kind]
        reason = owner.unavailable_reason()
        if reason:  # the file cannot even be read without the backend's package
            return StrategyEntry(name, None, load_error=reason)
        choice = owner.resolve_config_file(file)
        builtin = self.get(choice.builtin)
        plan = replace(builtin.plan, **choice.plan_changes) if builtin.plan is not None else None
        return StrategyEntry(
            name,
            builtin.cls,
            f"{choice.summary}, run as {builtin.name}",
            {**builtin.options, **choice.options},
            builtin.load_error,
            plan,
            ConfigFile(kind, file, choice),
            builtin.takes,
        )

    def create(self, name: str, ctx: RunContext, **user_options: Any) -> Strategy:
        """Instantiate `name` with its preset options overlaid by the user's."""
        entry, options = self._resolved(name, user_options)
        assert entry.cls is not None
        if entry.config_file is not None:
            ctx = replace(ctx, config_file=entry.config_file)
        with _named_in_file(entry):
            strategy = entry.cls(ctx, **options)
        strategy.name = name
        return strategy

    def mesh_layout(
        self, name: str, world_size: int, local_world_size: int, model: ModelFacts | None = None, **user_options: Any
    ) -> MeshLayout:
        """How `name` with the user's options lays out the ranks (before any process group exists),
        for a model of these facts where known (its blocks and heads: the sizes that default to them)."""
        entry, options = self._resolved(name, user_options)
        assert entry.cls is not None
        with _named_in_file(entry):
            return entry.cls.mesh_layout(world_size, local_world_size, options, model)

    def _resolved(self, name: str, user_options: dict[str, Any]) -> tuple[StrategyEntry, dict[str, Any]]:
        """The entry of `name` and its options (presets overlaid by the user's), checked."""
        entry = self.get(name)
        reason = entry.unavailable_reason
        if reason:
            raise StrategyError(f"strategy {name!r} is unavailable here: {reason}")
        return entry, self.check_options(name, user_options)

    def check_options(self, name: str, user_options: dict[str, Any]) -> dict[str, Any]:
        """`name`'s options, its presets overlaid by the user's, as `train` takes them: an option the
        name presets, one its class has not, or one of the wrong type is one line. The planner checks
        a plan's options here too, so that plan and train take the same ones."""
        entry = self.get(name)
        if entry.cls is None:
            return dict(user_options)  # a plugin that failed to load: its own line says why
        fixed = sorted(set(user_options) & set(entry.options))
        if fixed:
            preset = ", ".join(f"{k}={entry.options[k]}" for k in fixed)
            raise StrategyError(
                f"strategy {name!r} means {preset}: drop strategy_options.{fixed[0]}, or pick the "
                f"strategy registered with the value you want (runner.py list)"
            )
        allowed = set(entry.user_options())
        unknown = sorted(set(user_options) - allowed)
        if unknown:
            listed = ", ".join(sorted(allowed)) or "none"
            section = user_options.get(unknown[0])
            if isinstance(section, Mapping) and unknown[0] in self.names():
                # compare's per-strategy section, given to one strategy's run: its options are given bare.
                how = (
                    "takes its options bare: " + " ".join(f"strategy_options.{k}={v}" for k, v in section.items())
                    if unknown[0] == name
                    else f"does not read another strategy's: leave strategy_options.{unknown[0]} out"
                )
                raise StrategyError(
                    f"strategy_options.{unknown[0]}.<option> is a section for compare, which runs several "
                    f"strategies; a run of {name!r} {how}"
                )
            raise StrategyError(f"strategy {name!r} has no option {', '.join(unknown)}: its options are {listed}")
        _check_option_types(name, user_options, _keyword_options(entry.cls))
        return {**entry.options, **user_options}


@contextlib.contextmanager
def _named_in_file(entry: StrategyEntry) -> Iterator[None]:
    """A mesh error about a size a config file fixes (its parallelism_config_tp_size, say) raised
    again, of the same class (a compare skips or stops on it alike), naming the file's key."""
    try:
        yield
    except MeshError as exc:
        if entry.config_file is None:
            raise
        message = entry.config_file.named_in_file(str(exc))
        if message == str(exc):
            raise
        raise type(exc)(message) from None


def _keyword_options(cls: type[Strategy]) -> dict[str, Any]:
    return dict(_signature_options(cls))


@functools.cache
def _signature_options(cls: type[Strategy]) -> tuple[tuple[str, Any], ...]:
    """A class's keyword options and defaults, read once: a plan asks for them for every layout."""
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple((p.name, None if p.default is p.empty else p.default) for p in params if p.kind is p.KEYWORD_ONLY)


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
            raise StrategyError(
                f"strategy {name!r}: strategy_options.{key}={value!r} must be {_TYPE_WORDS[expected]} "
                f"({expected.__name__}), e.g. strategy_options.{key}={example}"
            )


def _classes_in(module: ModuleType) -> list[type[Strategy]]:
    """The Strategy classes a module defines (not those it imports) that declare presets of
    their own (a subclass that inherits its parent's registers nothing twice)."""
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Strategy)
        and obj.__module__ == module.__name__
        and vars(obj).get("presets")
    ]


def _builtin_modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(strategies.__path__, "strategies."))


def _plugin_modules(env: dict[str, str]) -> list[str]:
    return [name.strip() for name in env.get(PLUGINS_ENV, "").split(",") if name.strip()]


def _import(name: str) -> ModuleType:
    if name.startswith("strategies."):
        return importlib.import_module(name)  # a built-in that fails to import is a bug: its traceback says where
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing = exc.name or name
        if name == missing or name.startswith(f"{missing}."):
            dotted = name.removesuffix(".py").replace("/", ".").replace("\\", ".").strip(".")
            example = dotted if dotted != name else "my_package.my_strategy"  # a file's path, written as a module
            raise StrategyError(
                f"{PLUGINS_ENV} names module {name!r}, which cannot be imported ({exc}): give an "
                f"import path on sys.path, such as {example}"
            ) from None
        # The module was found and failed on an import of its own: its path is right, a dependency is not.
        raise StrategyError(
            f"{PLUGINS_ENV} names module {name!r}, which was found but failed to import ({exc}): install "
            f"or fix what it imports, or leave {name!r} out of {PLUGINS_ENV}"
        ) from None


def _load_entry_points(registry: StrategyRegistry) -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if inspect.isclass(obj) and issubclass(obj, Strategy):
                registry.register_class(obj, default_name=ep.name)
            elif callable(obj):
                obj(registry)
            else:
                registry.register_broken(
                    ep.name, f"entry point {ep.value} is neither a Strategy nor a register function"
                )
        except StrategyError:
            raise
        except Exception as exc:  # a broken third-party plugin is listed, not fatal
            registry.register_broken(ep.name, f"plugin {ep.value} failed to load: {type(exc).__name__}: {exc}")


def registry_of(module_names: list[str]) -> StrategyRegistry:
    """A registry of the classes these modules define, in their classes' listing order
    (stable: module order within one order)."""
    modules = [_import(name) for name in module_names]
    registry = StrategyRegistry()
    for cls in sorted((cls for module in modules for cls in _classes_in(module)), key=lambda c: c.listing_order):
        registry.register_class(cls)
    return registry


def builtin_registry() -> StrategyRegistry:
    """The strategies parabench ships, and nothing installed beside it."""
    return registry_of(_builtin_modules())


_DEFAULT: StrategyRegistry | None = None


def default_registry() -> StrategyRegistry:
    """The built-in strategies, the modules in PARABENCH_PLUGINS and every installed entry-point
    plugin (built once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        registry = registry_of(_builtin_modules() + _plugin_modules(dict(os.environ)))
        _load_entry_points(registry)
        _DEFAULT = registry
    return _DEFAULT
