"""CPU reference of ``torch_npu.npu_mish``."""

from __future__ import annotations

import torch

from ._common import to_compute


def npu_mish(self: torch.Tensor) -> torch.Tensor:
    """mish(x) = x * tanh(softplus(x)), softplus(x) = ln(1 + e^x), in x's dtype.

    softplus is evaluated as max(x, 0) + log1p(exp(-|x|)), which neither overflows for large x
    nor loses the small values for very negative x.

    Facts:
    - torch_npu docs: npu_mish(self) -> Tensor, elementwise; "planned for deprecation, replace with torch.nn.functional.mish" (i.e. the same function, x * tanh(softplus(x))).

    Choices:
    - Backward by autograd.
    """
    x = to_compute(self)
    softplus = torch.clamp(x, min=0) + torch.log1p(torch.exp(-x.abs()))
    return (x * torch.tanh(softplus)).to(self.dtype)
