"""CPU reference of ``torch_npu.npu_rms_norm``."""

from __future__ import annotations

import torch

from ._common import to_compute


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06) -> tuple[torch.Tensor, torch.Tensor]:
    """RmsNorm(x) = x / sqrt(mean(x^2) + epsilon) * gamma, and rstd = 1 / sqrt(mean(x^2) + epsilon).

    The mean runs over the trailing ``gamma.dim()`` axes of ``self`` (gamma is "usually the
    last axis"). Returns ``(y, rstd)``: y in self's dtype, rstd of shape
    ``self.shape[:-gamma.dim()] + (1,) * gamma.dim()``.

    Facts:
    - torch_npu docs: npu_rms_norm(self, gamma, epsilon=1e-06) -> (Tensor, Tensor); RmsNorm drops LayerNorm's mean subtraction.
    - torch_npu docs: output 1 is RmsNorm(x), output 2 is the reciprocal of Rms(x) ("rstd"), kept for the backward.
    - CANN RmsNorm IR: y has x's dtype, rstd is float32 for every input dtype.
    - torch_npu docs: gamma's shape matches the trailing axes of self.

    Choices:
    - rstd is float32, or float64 for a float64 (bench) input, so the bench keeps its precision.
    - Backward by autograd (the NPU's RmsNormGrad has no separate torch_npu entry in dumps).
    """
    if gamma.dim() < 1 or tuple(self.shape[self.dim() - gamma.dim() :]) != tuple(gamma.shape):
        raise ValueError(f"gamma shape {tuple(gamma.shape)} must match the trailing axes of x {tuple(self.shape)}")
    x = to_compute(self)
    axes = tuple(range(self.dim() - gamma.dim(), self.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dim=axes, keepdim=True) + epsilon)
    y = (x * rstd * to_compute(gamma)).to(self.dtype)
    return y, rstd
