"""Shared helpers of the references: the dtype policy and the "unsupported case" error.

Dtype policy (the same for every reference unless its docstring says otherwise): the
arithmetic runs in ``compute_dtype(x)`` — float32 for float16/bfloat16/float32 inputs,
float64 for float64 inputs — and results come back in the dtype the NPU op documents
(usually the input's). So the bench (inputs raised to float32/float64) keeps its raised
precision, and the device-side stand-in (inputs in the dump's float16/bfloat16) behaves
like a fused NPU kernel that accumulates in float32 and rounds once at the end.
"""

from __future__ import annotations

import torch


class Unsupported(ValueError):
    """A documented case of the NPU op that no CPU reference can reproduce (dropout
    with the NPU's random stream, a compressed ALiBi pse, ...).

    A ``ValueError`` subclass so that callers that only know ``ValueError`` still catch
    it; the plugin turns it into a skip with this message as the reason.
    """


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs, float32 for every other floating dtype."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def to_compute(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its compute dtype (a no-op for float32/float64; differentiable)."""
    return x.to(compute_dtype(x))


def as_float(value: object, what: str) -> float:
    """A Python float from a number or a one-element tensor (NPU ``Scalar`` arguments
    are recorded either way in dumps)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)
