"""CPU reference of ``torch_npu.fast_gelu`` / ``torch_npu.npu_fast_gelu``."""

from __future__ import annotations

import torch

from ._common import to_compute


def fast_gelu(self: torch.Tensor) -> torch.Tensor:
    """The documented formula, x / (1 + exp(-1.702 |x|)) * exp(0.851 (x - |x|)), equals x * sigmoid(1.702 x).

    Both documented forms are the same function (for x >= 0 the second factor is 1; for
    x < 0 multiply numerator and denominator by exp(1.702 x)); the sigmoid form is evaluated
    because torch.sigmoid never overflows.

    Facts:
    - torch_npu docs: npu_fast_gelu(input) -> Tensor; fast_gelu(self) -> Tensor; same function.
    - torch_npu docs: Atlas training/inference formula x / (1 + e^(-1.702|x|)) * e^(0.851 (x - |x|)); Atlas A2/A3 formula x / (1 + e^(-1.702 x)).
    - torch_npu docs: example fast_gelu(0.5991) = 0.4403, fast_gelu(0.4094) = 0.2733.

    Choices:
    - Backward by autograd.
    """
    x = to_compute(self)
    return (x * torch.sigmoid(1.702 * x)).to(self.dtype)


def npu_fast_gelu(input: torch.Tensor) -> torch.Tensor:
    """Same as ``fast_gelu`` (torch_npu exposes the op under both names).

    Facts:
    - torch_npu docs: npu_fast_gelu(input) -> Tensor computes FastGelu elementwise, output dtype of input.
    """
    return fast_gelu(input)
