"""CPU reference of ``torch_npu.npu_group_norm_silu``."""

from __future__ import annotations

import torch

from ._common import to_compute


def npu_group_norm_silu(
    input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, group: int, eps: float = 1e-05
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out = silu(GroupNorm(x)), with the group statistics meanOut and rstdOut.

    GroupNorm(x) = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta over each (sample, group)
    (channels = axis 1, split into ``group`` equal groups; Var is the biased variance);
    silu(y) = y / (1 + e^-y). Returns ``(out, mean, rstd)``: out of input's shape, mean and
    rstd of shape (N, group), all in input's dtype.

    Facts:
    - torch_npu docs: npu_group_norm_silu(input, weight, bias, group, eps) -> (Tensor, Tensor, Tensor): out, meanOut, rstdOut.
    - torch_npu/aclnnGroupNormSilu docs: E[x] mean, Var[x] = 1/n sum (x - E[x])^2, rstdOut = 1/sqrt(Var[x] + eps), out = silu(groupnormOut).
    - torch_npu docs: weight/bias are 1-D of size C = input.shape[1] (optional); C divisible by group; meanOut/rstdOut shape (N, group) and input's dtype.

    Choices:
    - eps defaults to 1e-5 (CANN's GroupNormSilu attribute default); backward by autograd.
    """
    if input.dim() < 2:
        raise ValueError(f"npu_group_norm_silu needs at least 2-D input, got shape {tuple(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    if group <= 0 or c % group:
        raise ValueError(f"channels {c} must split into group={group} equal groups")
    x = to_compute(input).reshape(n, group, -1)
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    rstd = torch.rsqrt(centered.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = (centered * rstd).reshape(input.shape)
    affine_shape = (1, c) + (1,) * (input.dim() - 2)
    if weight is not None:
        y = y * to_compute(weight).reshape(affine_shape)
    if bias is not None:
        y = y + to_compute(bias).reshape(affine_shape)
    out = y * torch.sigmoid(y)
    return out.to(input.dtype), mean.reshape(n, group).to(input.dtype), rstd.reshape(n, group).to(input.dtype)
