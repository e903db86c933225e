"""CPU reference of ``torch_npu.npu_sort_v2``."""

from __future__ import annotations

import torch


def npu_sort_v2(
    self: torch.Tensor, dim: int = -1, descending: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The values of ``self`` sorted along ``dim`` (no indices).

    Facts:
    - torch_npu docs: npu_sort_v2(self, dim=-1, descending=False, out=None) -> Tensor: sorts along dim (ascending unless descending) and returns the values without indices; "replace with torch.sort".
    - torch_npu docs: only the last axis (dim=-1) is supported on the NPU.

    Choices:
    - Any dim is accepted (the NPU limit is not enforced); NaN order follows torch.sort (NaN largest); with out given the values are written into it and it is returned.
    """
    values = torch.sort(self, dim=dim, descending=descending, stable=True).values
    if out is not None:
        out.copy_(values)
        return out
    return values
