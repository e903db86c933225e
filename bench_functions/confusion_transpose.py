"""CPU reference of ``torch_npu.npu_confusion_transpose``."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def npu_confusion_transpose(
    self: torch.Tensor, perm: Sequence[int], shape: Sequence[int], transpose_first: bool
) -> torch.Tensor:
    """Permute then reshape (transpose_first=True), or reshape then permute (False).

    Facts:
    - torch_npu docs: npu_confusion_transpose(self, perm, shape, transpose_first) -> Tensor, "mixes transpose and reshape"; transpose_first says which comes first.
    - torch_npu docs example: x (2, 3, 4, 6), perm (0, 2, 1, 3), shape (2, 4, 18), transpose_first=True -> (2, 4, 18); y2 with perm (0, 2, 1), shape (2, 12, 6), transpose_first=False -> (2, 6, 12).

    Choices:
    - Values are moved, never computed: exact in any dtype; backward by autograd.
    """
    perm, shape = [int(p) for p in perm], [int(s) for s in shape]
    if transpose_first:
        return self.permute(*perm).reshape(shape)
    return self.reshape(shape).permute(*perm).contiguous()
