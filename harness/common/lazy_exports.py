"""A job package's public names, each imported from its module on first use: a sibling job
imports only these (`from harness.train import preflight`), and pays only for what it uses
(the planner never imports torch through them)."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level __getattr__ for `package` that serves each name in `exports`
    (name -> the submodule defining it, relative to the package)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{exports[name]}"), name)

    return __getattr__
