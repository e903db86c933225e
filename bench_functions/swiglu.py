"""CPU reference of ``torch_npu.npu_swiglu``."""

from __future__ import annotations

import torch

from ._common import one_node, to_compute


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """swiglu(x) = swish(A) * B = A * sigmoid(A) * B, with A/B the first/second half of x along dim.

    Facts:
    - torch_npu docs: npu_swiglu(self, dim=-1) -> Tensor; A is the front half, B the back half of x split along dim; the size along dim must be even.
    - torch_npu docs: the output dtype is the input's.

    Choices:
    - Backward by autograd, as one node (torch_npu's op is one): a dump's input gradient pairs with x offline.
    """
    if self.shape[dim] % 2:
        raise ValueError(f"npu_swiglu needs an even size along dim={dim}, got {self.shape[dim]}")
    (y,) = one_node(lambda x: [_swiglu(x, dim)], [self])
    return y


def _swiglu(x: torch.Tensor, dim: int) -> torch.Tensor:
    a, b = to_compute(x).chunk(2, dim=dim)
    return (a * torch.sigmoid(a) * b).to(x.dtype)
