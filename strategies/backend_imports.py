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


# What a backend imports on its first use rather than with itself, where installed: imported with
# it here, so that a launcher forking its workers pays for it once, not in every rank. Accelerate's
# unwrap_model, which every mode's setup calls, imports DeepSpeed wherever it is installed (Accelerate
# 1.15's accelerate/utils/other.py, extract_model_from_parallel), and MLflow with it unless hidden as
# above: 2 s a rank. DeepSpeed 0.19's engine imports its Muon optimizer in every initialize
# (deepspeed/runtime/zero/utils.py, is_zero_supported_optimizer), whose torch.compile wrappers import
# inductor: 1 s a rank.
_IMPORTED_ON_FIRST_USE = {
    "accelerate": ("deepspeed",),
    "deepspeed": ("deepspeed.runtime.zero.muon.muon_optimizer",),
}


def import_backends(modules: Iterable[str]) -> None:
    """Import each of `modules` (a no-op for one already imported) and what it imports on its first use."""
    for name in modules:
        if name not in sys.modules:
            with _hidden(_HIDDEN_WHILE_IMPORTING.get(name, ())):
                importlib.import_module(name)
        for used in _IMPORTED_ON_FIRST_USE.get(name, ()):
            # Not installed (or a DeepSpeed without Muon): the backend does without it, as here.
            with contextlib.suppress(ModuleNotFoundError):
                import_backends([used])


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
