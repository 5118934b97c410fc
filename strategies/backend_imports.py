"""Importing a strategy's backend libraries (its `backend_modules`), once per process, before
its construction: where the launcher forks the workers, it imports them for all of them."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterable, Iterator

# DeepSpeed's autotuner imports MLflow, where it is installed, to log autotuning experiments:
# 0.7 s of every process that imports DeepSpeed, for a feature parabench never starts. Hidden
# while DeepSpeed is first imported, MLflow stays importable (trackers=[mlflow]) after.
_HIDDEN_WHILE_IMPORTING = {"deepspeed": ("mlflow",)}


def import_backends(modules: Iterable[str]) -> None:
    """Import each of `modules` (a no-op for one already imported)."""
    for name in modules:
        if name in sys.modules:
            continue
        with _hidden(_HIDDEN_WHILE_IMPORTING.get(name, ())):
            importlib.import_module(name)


@contextlib.contextmanager
def _hidden(modules: tuple[str, ...]) -> Iterator[None]:
    """`import m` raises ImportError inside the block for each of `modules` not yet imported."""
    hidden = [m for m in modules if m not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
