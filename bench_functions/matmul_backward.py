"""CPU reference of ``matmul_backward`` (the NPU's fused backward of torch.matmul)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Undo broadcasting: sum ``t`` over leading and size-1 batch axes down to ``shape``."""
    while t.dim() > len(shape):
        t = t.sum(dim=0)
    dims = [d for d, want in enumerate(shape) if want == 1 and t.shape[d] != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


def matmul_backward(
    grad: torch.Tensor, self: torch.Tensor, other: torch.Tensor, mask: Sequence[bool]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``torch.matmul(self, other)`` w.r.t. self and other, given the output's grad.

    With 1-D operands promoted as matmul does (self -> 1 x n, other -> n x 1) and batch axes
    broadcast: grad_self = grad @ other^T, grad_other = self^T @ grad, each summed back over
    the broadcast axes and squeezed back to its operand's shape. ``mask[i]`` False skips that
    gradient (returned as None).

    Facts:
    - msprobe's API list: matmul_backward(grad, self, other, mask) -> (Tensor, Tensor) is dumped as NPU.matmul_backward; mask is the bool[2] output mask of the two gradients.
    - PyTorch docs (torch.matmul): 1-D first argument is prepended a 1, 1-D second argument appended a 1, both removed after; batch dimensions broadcast.

    Choices:
    - Computed in the operands' dtype (a matmul); a gradient not asked for by mask is None.
    """
    if len(mask) < 2:
        raise ValueError(f"mask must hold two bools (grad_self, grad_other), got {list(mask)!r}")
    a = self.unsqueeze(0) if self.dim() == 1 else self
    b = other.unsqueeze(-1) if other.dim() == 1 else other
    g = grad
    if other.dim() == 1:  # restore the axes matmul removed: the appended one first
        g = g.unsqueeze(-1)
    if self.dim() == 1:
        g = g.unsqueeze(-2)
    grad_self = grad_other = None
    if mask[0]:
        grad_self = _sum_to(torch.matmul(g, b.transpose(-1, -2)), a.shape)
        grad_self = grad_self.reshape(self.shape)
    if mask[1]:
        grad_other = _sum_to(torch.matmul(a.transpose(-1, -2), g), b.shape)
        grad_other = grad_other.reshape(other.shape)
    return grad_self, grad_other
