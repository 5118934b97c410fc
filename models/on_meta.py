"""A model built on the meta device for its shape alone: no weights, and no initialisation.

An initialiser on a meta tensor has nothing to fill, yet runs through torch's reference
implementations, whose first call imports the whole compiler stack (about a second of a
process's start-up). The checks before a run and the zoo's descriptions need only the
modules and their shapes, so torch.nn.init's in-place initialisers are skipped while the
model is built, as Hugging Face's loaders skip them for weights about to be replaced.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

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
    """Build modules on the meta device with torch.nn.init's initialisers skipping meta tensors.

    A library imported while the model is built may keep its own reference to an initialiser
    (transformers does): what it keeps initialises every tensor but a meta one, as before."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS}
    try:
        for name, initialiser in saved.items():
            setattr(torch.nn.init, name, _skipping_meta(initialiser))
        with torch.device("meta"):
            yield
    finally:
        for name, initialiser in saved.items():
            setattr(torch.nn.init, name, initialiser)


def _skipping_meta(initialiser: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(initialiser)
    def initialise(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return tensor if tensor.is_meta else initialiser(tensor, *args, **kwargs)

    return initialise
