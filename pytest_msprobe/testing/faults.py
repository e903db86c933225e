"""Planted faults: wrappers that make an API wrong only in the dtype under test, so
the bench (which runs at raised precision) still computes the truth."""

from __future__ import annotations

from collections.abc import Callable

import torch


def scaled_in(dtype: torch.dtype, factor: float) -> Callable[[Callable], Callable]:
    """The API's result (each tensor of a tuple result) times `factor` whenever it
    comes out in `dtype`."""

    def scale(out):
        if isinstance(out, tuple):
            return tuple(scale(item) for item in out)
        return out * factor if isinstance(out, torch.Tensor) and out.dtype == dtype else out

    def wrap(function: Callable) -> Callable:
        def faulty(*args, **kwargs):
            return scale(function(*args, **kwargs))

        return faulty

    return wrap
