"""CPU reference of ``torch_npu.npu_linear``."""

from __future__ import annotations

import torch


def npu_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = input @ weight^T + bias, in the inputs' dtype.

    Facts:
    - torch_npu docs: npu_linear(input, weight, bias=None) -> Tensor with 2-D input and weight, the NPU form of torch.nn.functional.linear: input (N, in), weight (out, in), bias (out).

    Choices:
    - Computed in the input dtype (a matmul, like the NPU's cube unit with its own accumulation); backward by autograd.
    """
    y = torch.matmul(input, weight.transpose(-1, -2))
    return y + bias if bias is not None else y
