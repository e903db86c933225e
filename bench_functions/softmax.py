"""CPU reference of ``torch_npu.npu_scaled_masked_softmax``."""

from __future__ import annotations

import torch

from ._common import to_compute


def npu_scaled_masked_softmax(
    x: torch.Tensor, mask: torch.Tensor, scale: float = 1.0, fixed_triu_mask: bool = False
) -> torch.Tensor:
    """y = softmax((x * scale).masked_fill(mask, -inf), dim=-1), in x's dtype.

    Facts:
    - torch_npu docs: npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False) -> Tensor, shape of x, softmax over the last axis.
    - torch_npu docs (operator guide): if fixed_triu_mask: mask = triu(ones(mask.shape), diagonal=1); y = softmax((x * scale).masked_fill(mask, -inf), dim=-1).
    - torch_npu docs: mask is bool (True = masked out) and must broadcast to x's shape.

    Choices:
    - A row whose every entry is masked (NaN by the formula) is the uniform distribution, as with Megatron's -10000 fill that this op replaces.
    - Backward by autograd; masked entries get zero gradient.
    """
    if fixed_triu_mask:
        rows, cols = mask.shape[-2], mask.shape[-1]
        mask = torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(1).expand(mask.shape)
    mask = mask.to(torch.bool)
    s = (to_compute(x) * scale).masked_fill(mask, float("-inf"))
    all_masked = mask.expand(s.shape).all(dim=-1, keepdim=True)
    s = s.masked_fill(all_masked, 0.0)  # uniform row instead of NaN
    return torch.softmax(s, dim=-1).to(x.dtype)
