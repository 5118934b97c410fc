"""A model built on the meta device for its shape alone: no weights, and no initialisation.

An initialiser on a meta tensor has nothing to fill, yet runs through torch's reference
implementations, whose first call imports the whole compiler stack (about a second of a
process's start-up). The checks before a run and the zoo's descriptions need only the
modules and their shapes, so torch.nn.init's in-place initialisers are skipped while the
model is built, as Hugging Face's loaders skip them for weights about to be replaced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# Every in-place initialiser torch.nn.init offers, looked up by modules at call time.
_INITIALISERS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device with torch.nn.init's initialisers skipped."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS}
    try:
        for name in saved:
            setattr(torch.nn.init, name, _unchanged)
        with torch.device("meta"):
            yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def _unchanged(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor
