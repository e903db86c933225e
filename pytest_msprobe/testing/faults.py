"""Planted faults: wrappers that make an API wrong only in the dtype under test, so
the bench (which runs at raised precision) still computes the truth."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import torch

#: a torch function a fault replaces: any arguments, a tensor (or what the API returns)
TorchFunction: TypeAlias = Callable[..., torch.Tensor]


def scaled_in(dtype: torch.dtype, factor: float) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """The API's result (each tensor of a tuple result) times `factor` whenever it
    comes out in `dtype`."""

    def scale(out: object) -> object:
        if isinstance(out, tuple):
            return tuple(scale(item) for item in out)
        return out * factor if isinstance(out, torch.Tensor) and out.dtype == dtype else out

    def wrap(function: Callable[..., object]) -> Callable[..., object]:
        def faulty(*args: object, **kwargs: object) -> object:
            return scale(function(*args, **kwargs))

        return faulty

    return wrap
