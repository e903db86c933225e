"""CPU reference of ``torch_npu.npu_moe_gating_top_k_softmax``."""

from __future__ import annotations

import torch

from ._common import one_node, to_compute


def npu_moe_gating_top_k_softmax(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax over experts (last axis), then top-k: returns ``(y, expert_idx, row_idx)``.

    y: the k largest softmax values per row, descending, in x's dtype; expert_idx: their
    expert numbers (int32), set to num_experts on rows whose ``finished`` is True; row_idx
    (int32): arange(rows * k).reshape(k, rows).T, the position of each (row, slot) in the
    slot-major flattening used by the MoE routing ops.

    Facts:
    - torch_npu docs (op-plugin 7.x, the op's only signature): npu_moe_gating_top_k_softmax(x, finished=None, k=1) -> (Tensor, Tensor, Tensor); x 2-D or 3-D float16/bfloat16/float32; finished bool of shape x.shape[:-1]; 0 < k <= num_experts, k <= 1024.
    - aclnnMoeGatingTopKSoftmax docs: softmaxOut = softmax(x, axis=-1); yOut, expertIdxOut = topK(softmaxOut, k); rowIdxOut = arange(shape[0]*shape[1]).reshape([shape[1], shape[0]]).transpose(1, 0); a finished row gets expert number num_expert.
    - torch_npu docs: y has x's dtype, expert_idx and row_idx are int32 with y's shape.

    Choices:
    - Softmax in float32 (float64 for float64 x); the top k are chosen on those values and
      only then rounded to x's dtype. Choosing on the rounded values would make the choice
      between two experts whose probabilities round alike depend on the precision the
      softmax ran in: a bfloat16 call replayed at float32 and at float64 then picks
      different experts (a false alarm on the indices and the backward). Exact ties (equal
      logits) go to the lower expert number at any precision.
    - 3-D x: the leading two axes are flattened into rows for row_idx, then reshaped back.
    - Backward by autograd, as one node (torch_npu's op is one): a dump's gradient of x pairs with x offline.
    """
    num_experts = x.shape[-1]
    if not 0 < k <= num_experts:
        raise ValueError(f"k must be in 1..{num_experts} (the number of experts), got {k}")
    y, expert_idx, row_idx = one_node(lambda logits, done: _gating(logits, done, k), [x, finished])
    return y, expert_idx, row_idx


def _gating(x: torch.Tensor, finished: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_experts = x.shape[-1]
    probs = torch.softmax(to_compute(x), dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :k]
    y = torch.gather(probs, -1, order).to(x.dtype)
    expert_idx = order.to(torch.int32)
    if finished is not None:
        expert_idx = torch.where(
            finished.to(torch.bool).unsqueeze(-1), torch.full_like(expert_idx, num_experts), expert_idx
        )
    rows = y.numel() // k
    row_idx = torch.arange(rows * k, dtype=torch.int32, device=x.device).reshape(k, rows).t().reshape(y.shape)
    return y, expert_idx, row_idx.contiguous()
