"""CPU reference of ``torch_npu.npu_layer_norm_eval``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import to_compute


def npu_layer_norm_eval(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-05,
) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the trailing normalized_shape axes
    (var is the biased variance), in input's dtype.

    Facts:
    - torch_npu docs: npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-05) -> Tensor, "the same as torch.nn.functional.layer_norm" (weight = gamma, bias = beta, eps added to the variance).

    Choices:
    - Two-pass mean/variance in float32 (float64 for float64 input); backward by autograd.
    """
    norm = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
    if tuple(input.shape[input.dim() - len(norm) :]) != norm:
        raise ValueError(f"normalized_shape {norm} must match the trailing axes of input {tuple(input.shape)}")
    x = to_compute(input)
    axes = tuple(range(input.dim() - len(norm), input.dim()))
    mean = x.mean(dim=axes, keepdim=True)
    centered = x - mean
    var = centered.pow(2).mean(dim=axes, keepdim=True)
    y = centered * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * to_compute(weight)
    if bias is not None:
        y = y + to_compute(bias)
    return y.to(input.dtype)
