"""CPU reference of ``torch_npu.npu_rotary_mul``."""

from __future__ import annotations

import torch

from ._common import to_compute


def _rotate(x: torch.Tensor, rotary_mode: str) -> torch.Tensor:
    """The "x_new" of the docs: (-x2, x1) with x1/x2 the halves (half) or the even/odd
    elements (interleave) of the last axis."""
    if x.shape[-1] % 2:
        raise ValueError(f"npu_rotary_mul needs an even last axis, got {x.shape[-1]}")
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    if rotary_mode == "interleave":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)
    raise ValueError(f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")


def npu_rotary_mul(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half") -> torch.Tensor:
    """output = r1 * input + r2 * rotate(input): rotary position embedding with r1 = cos, r2 = sin.

    Result in input's dtype and shape; r1/r2 broadcast against input (11SD, B1SD, 1S1D, ...).

    Facts:
    - torch_npu docs: npu_rotary_mul(input, r1, r2, rotary_mode='half') -> Tensor, shape and dtype of input.
    - torch_npu docs: half mode: x1, x2 = chunk(input, 2, -1); x_new = cat((-x2, x1), -1); output = r1 * input + r2 * x_new.
    - torch_npu docs: interleave mode: x1 = input[..., ::2], x2 = input[..., 1::2]; x_new = (-x2, x1) interleaved back; same output formula.

    Choices:
    - Backward (for input, r1 and r2) by autograd.
    """
    x = to_compute(input)
    return (to_compute(r1) * x + to_compute(r2) * _rotate(x, rotary_mode)).to(input.dtype)
