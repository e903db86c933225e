"""CPU references of torch_npu's MoE routing operators: ``npu_moe_init_routing``,
``npu_moe_compute_expert_tokens``, ``npu_moe_finalize_routing`` and ``npu_moe_gating_top_k``.

Routing moves rows and counts them: its indices and counts are judged bit for bit (integer
outputs), its gathered rows too; only ``npu_moe_finalize_routing`` (a weighted sum of k
rows) and the gating's probabilities carry rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import Unsupported, compute_dtype, one_node, to_compute
from .registry import Companions


def _key_value_sort(expert_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted experts, flat positions in that order): a stable sort of the token-major
    flattening, so tokens keep their order within an expert."""
    flat = expert_idx.reshape(-1).long()
    order = torch.sort(flat, stable=True)
    return order.values, order.indices


def npu_moe_init_routing(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs by expert and gather each pair's token row.

    Returns (expanded_x [min(rows, active_num) * k, H] in x's dtype, expanded_row_idx
    [rows * k] int32 (where each row_idx value went), expanded_expert_idx [rows * k]
    int32 (the experts sorted)).

    Facts:
    - torch_npu docs (op-plugin 7.x, the only version of the op; npu_moe_init_routing_v2 is another op, without row_idx): npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) -> (Tensor, Tensor, Tensor); x 2-D (NUM_ROWS, H) float16/bfloat16/float32; row_idx and expert_idx int32 (NUM_ROWS, K).
    - torch_npu docs: expanded_expert_idx, sorted_row_idx = keyValueSort(expert_idx, row_idx); expanded_row_idx[sorted_row_idx[i]] = i; expanded_x[i] = x[sorted_row_idx[i] % num_rows]; expanded_x has min(NUM_ROWS, active_num) * k rows.

    Choices:
    - keyValueSort is stable over the token-major flattening (op-plugin's own golden of the v2 op sorts so): pairs of one expert keep their token order.
    - Backward by autograd (rows gathered: their gradients summed back per token).
    """
    rows, k = expert_idx.shape
    experts, positions = _key_value_sort(expert_idx)
    sorted_row_idx = row_idx.reshape(-1).long()[positions]
    expanded_row_idx = torch.full_like(sorted_row_idx, -1)  # a row_idx that is no permutation leaves holes
    expanded_row_idx[sorted_row_idx] = torch.arange(sorted_row_idx.numel(), device=x.device)
    active = min(rows, active_num) * k
    expanded_x = x[sorted_row_idx[:active] % rows]
    return expanded_x, expanded_row_idx.to(torch.int32), experts.to(torch.int32)


def _fit_generated_row_idx(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor | None, str]:
    """A statistics dump's generated row_idx (random integers, not a permutation) set in
    place to the one npu_moe_gating_top_k_softmax gives: arange(rows * k).reshape(k, rows).T."""
    rows, k = row_idx.shape
    documented = torch.arange(rows * k, dtype=row_idx.dtype).reshape(k, rows).t()
    if torch.equal(row_idx, documented):
        return None, ""
    row_idx.copy_(documented)
    return row_idx, "set to the gating's row_idx arange(rows * k).reshape(k, rows).T"


def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: torch.Tensor, num_expert: int) -> torch.Tensor:
    """For each expert e < num_expert, the position after its last row in the sorted
    expert list: the cumulative token count group_list that npu_grouped_matmul reads.

    Facts:
    - torch_npu docs (op-plugin 7.x): npu_moe_compute_expert_tokens(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor; input 1-D int32; expertTokens_i = BinarySearch(sortedExpertForSourceRow, numExpert): the last row each expert handles; output dtype the input's.

    Choices:
    - "The last row" is counted one past it (searchsorted right), so an expert with no rows repeats the previous total: the cumulative form group_list_type=0 expects.
    """
    experts = torch.arange(
        num_expert, device=sorted_expert_for_source_row.device, dtype=sorted_expert_for_source_row.dtype
    )
    ends = torch.searchsorted(sorted_expert_for_source_row.contiguous(), experts, right=True)
    return ends.to(sorted_expert_for_source_row.dtype)


def npu_moe_finalize_routing(
    expanded_permuted_rows: torch.Tensor,
    skip1: torch.Tensor | None,
    skip2: torch.Tensor | None,
    bias: torch.Tensor | None,
    scales: torch.Tensor | None,
    expanded_src_to_dst_row: torch.Tensor,
    export_for_source_row: torch.Tensor | None,
    drop_pad_mode: int = 0,
) -> torch.Tensor:
    """out[i] = skip1[i] + skip2[i] + sum_k scales[i, k] * (rows[dst(i, k)] + bias[expert(i, k)]).

    Facts:
    - torch_npu docs (op-plugin 7.x): npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row, export_for_source_row, drop_pad_mode=0) -> Tensor of shape (NUM_ROWS, H).
    - torch_npu docs: out(i, j) = skip1(i, j) + skip2(i, j) + sum_k scales(i, k) * (expandPermutedROWs(expandedSrcRowToDstRow(i + k * num_rows), j) + bias(expertid, j)), expertid = exportForSourceRow(i, k).
    - torch_npu docs: drop_pad_mode 0/2 drop-less with rows (NUM_ROWS * K, H); 1/3 drop-pad with rows (E, C, H) and -1 marking a dropped pair; 0/1 column-major (index i + k * num_rows), 2/3 row-major (index i * K + k).

    Choices:
    - Sum in float32 (float64 for float64 rows), rounded once; a dropped pair (-1) adds nothing; scales None means 1, bias needs export_for_source_row.
    - Backward by autograd, as one node (torch_npu's op is one): a dump's gradients pair with the call's inputs offline.
    """
    values = [expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row, export_for_source_row]
    (out,) = one_node(lambda *tensors: [_finalize(tensors, drop_pad_mode)], values)
    return out


def _finalize(values: Sequence[torch.Tensor | None], drop_pad_mode: int) -> torch.Tensor:
    """npu_moe_finalize_routing's formula on its tensor arguments, in their order."""
    expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row, export_for_source_row = values
    assert expanded_permuted_rows is not None and expanded_src_to_dst_row is not None
    if drop_pad_mode not in (0, 1, 2, 3):
        raise ValueError(f"drop_pad_mode must be 0..3, got {drop_pad_mode}")
    dtype = compute_dtype(expanded_permuted_rows)
    rows = expanded_permuted_rows.reshape(-1, expanded_permuted_rows.shape[-1]).to(dtype)
    if scales is not None:
        num_rows, k = scales.shape
    elif export_for_source_row is not None:
        num_rows, k = export_for_source_row.shape
    elif skip1 is not None:
        num_rows = skip1.shape[0]
        k = expanded_src_to_dst_row.numel() // num_rows
    else:
        raise ValueError(
            "npu_moe_finalize_routing needs scales, export_for_source_row or skip1 to know the number of rows"
        )
    dst = expanded_src_to_dst_row.reshape(-1).long()
    dst = dst.reshape(k, num_rows).t() if drop_pad_mode in (0, 1) else dst.reshape(num_rows, k)
    kept = dst >= 0
    picked = rows[dst.clamp(min=0)]  # [num_rows, k, H]
    if bias is not None:
        if export_for_source_row is None:
            raise ValueError("a bias needs export_for_source_row (the expert of each pair)")
        picked = picked + to_compute(bias).to(dtype)[export_for_source_row.long()]
    weights = scales.to(dtype) if scales is not None else torch.ones(num_rows, k, dtype=dtype, device=rows.device)
    out = (picked * (weights * kept).unsqueeze(-1)).sum(dim=1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.to(dtype)
    return out.to(expanded_permuted_rows.dtype)


def npu_moe_gating_top_k(
    x: torch.Tensor,
    k: int,
    *,
    bias: torch.Tensor | None = None,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped top-k gating (DeepSeek-V3's): norm the logits, pick the k_group best expert
    groups by the biased scores, then the k best experts within them; y is the unbiased
    norm of those experts (sigmoid: renormalised to sum 1), times routed_scaling_factor.

    Returns (y [rows, k] in x's dtype, expert_idx [rows, k] int32, norm_out [rows, E]
    float32: written only with out_flag=True).

    Facts:
    - torch_npu docs (op-plugin 7.x; an older version marks norm_type 0 "not yet supported": its dumps hold norm_type 1, the same formula): npu_moe_gating_top_k(x, k, *, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0, eps=1e-20) -> (Tensor, Tensor, Tensor); x 2-D float16/bfloat16/float32; renorm only 0.
    - torch_npu docs (equivalent computation): norm = softmax (norm_type 0) or sigmoid (1) in float32; scores = norm + bias; group score = max (group_select_mode 0) or sum of the top 2 (1) per group; the k_group best groups kept (stable order), the others -inf; expert_idx = the k best scores (stable order); y = norm at expert_idx, divided by (sum + eps) for sigmoid, times routed_scaling_factor; normOut is the norm, float32.

    Choices:
    - The norm in float32 (float64 for float64 x); normOut in float32 (float64 on a float64 bench) and, with out_flag False, not written by the kernel (written_rows names it, not judged).
    """
    if renorm != 0:
        raise Unsupported(f"renorm={renorm}: the docs support only 0")
    if norm_type not in (0, 1):
        raise ValueError(f"norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")
    rows, experts = x.shape
    if group_count < 1 or experts % group_count:
        raise ValueError(f"group_count={group_count} must divide the {experts} experts")
    xc = to_compute(x)
    norm = torch.softmax(xc, dim=-1) if norm_type == 0 else torch.sigmoid(xc)
    scores = norm + to_compute(bias) if bias is not None else norm
    grouped = scores.reshape(rows, group_count, -1)
    group_score = grouped.amax(-1) if group_select_mode == 0 else torch.topk(grouped, 2, dim=-1).values.sum(-1)
    best_groups = torch.sort(group_score, dim=-1, descending=True, stable=True).indices[:, :k_group]
    keep = torch.zeros(rows, group_count, dtype=torch.bool, device=x.device).scatter(1, best_groups, True)
    masked = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).reshape(rows, experts)
    expert_idx = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :k]
    y = torch.gather(norm, 1, expert_idx)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    norm_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return y.to(x.dtype), expert_idx.to(torch.int32), norm.to(norm_dtype)


def _gating_written(x: torch.Tensor, k: int, **kwargs: object) -> tuple[dict[int, int], dict[int, int], str]:
    """normOut is written only with out_flag=True."""
    return ({} if kwargs.get("out_flag") else {2: 0}), {}, "(out_flag=False)"


def _dynamic_quant(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic int8 quantisation: scale = max |row| / 127, round half to even."""
    scale = rows.abs().amax(dim=-1) / 127.0
    quantised = torch.round(rows / torch.where(scale > 0, scale, 1.0).unsqueeze(-1)).clamp(-128, 127).to(torch.int8)
    return quantised, scale


def npu_moe_init_routing_v2(  # noqa: PLR0915  torch_npu's operator, its steps in the order of its documentation; a split would scatter that order
    x: torch.Tensor,
    expert_idx: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    active_num: int = -1,
    expert_capacity: int = -1,
    expert_num: int = -1,
    drop_pad_mode: int = 0,
    expert_tokens_num_type: int = 0,
    expert_tokens_num_flag: bool = False,
    quant_mode: int = 0,
    active_expert_range: list[int] | None = None,
    row_idx_type: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs of the active experts by expert, gather their rows,
    count the tokens per expert; optionally quantise the rows dynamically.

    Returns (expanded_x, expanded_row_idx int32, expert_token_cumsum_or_count int64,
    expanded_scale float32): drop-less, expanded_x is [rows * k, H] whose first
    `available` rows (pairs of an expert in active_expert_range) are written; drop-pad,
    [expert_num, expert_capacity, H] with empty slots zero. ``written_rows`` names the rest.

    Facts:
    - torch_npu docs (op-plugin 7.x): npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, int active_num=-1, int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, int quant_mode=0, int[2] active_expert_range=[], int row_idx_type=0) -> (Tensor, Tensor, Tensor, Tensor).
    - torch_npu docs: expert_idx sorted (sorted_expert_idx, sorted_row_idx); expanded_row_idx maps expanded_x to x (row_idx_type 0 gather, 1 scatter); the first available_idx_num rows of expanded_x and expanded_row_idx are valid, available_idx_num = the pairs whose expert lies in active_expert_range; expert_tokens_num_type 0 cumsum, 1 count (shape [expert_end - expert_start]), 2 key_value ([expert_num, 2], the non-zero (expert, count) pairs at the head in order); quant_mode -1 none, 1 dynamic (0 static: not supported); expanded_scale without scale is meaningless.
    - CANN's test golden of the kernel (ops-transformer moe_init_routing_v2): a stable argsort of the flattened expert_idx with experts below the range moved last; row_idx_type 0: expanded_row_idx[sorted[i]] = i for the available pairs, -1 elsewhere; 1: the sorted flat positions; expanded_x[i] = x[sorted[i] // k]; non-quant expanded_scale[i] = scale[sorted[i] // k]; dynamic quant multiplies by scale (one row, or a row per active expert) before scale = max|row| / 127; drop-pad keeps each expert's first expert_capacity pairs in slots e * capacity + j.

    Choices:
    - Rows and scales past the available pairs, the counts without expert_tokens_num_flag, the key_value pairs past the non-zero experts and expanded_scale without scale are zeros here and named by written_rows (not judged); active_num > 0 caps the rows gathered.
    - Dynamic quantisation rounds half to even; quant_mode 0, offset and int8 x raise Unsupported.
    """
    if quant_mode == 0:
        raise Unsupported("quant_mode=0 (static quantisation) is documented as not supported")
    if offset is not None or not x.is_floating_point():
        raise Unsupported("npu_moe_init_routing_v2 with an offset or int8 x: the docs call its outputs meaningless")
    k = expert_idx.shape[1]
    total = expert_idx.numel()
    start, end = _expert_range(expert_idx, expert_num, active_expert_range)
    if drop_pad_mode == 1:
        start, end = 0, expert_num
    flat = expert_idx.reshape(-1).long()
    active = (flat >= start) & (flat < end)
    available = int(active.sum())
    keys = torch.where(flat < start, torch.iinfo(torch.int32).max, flat)
    order = torch.sort(keys, stable=True)
    sorted_experts, positions = order.values, order.indices
    counts = torch.bincount(sorted_experts[:available] - start, minlength=end - start)[: end - start]
    expert_tokens = _expert_tokens(counts, start, expert_num, expert_tokens_num_type, expert_tokens_num_flag)
    compute = (
        torch.float64
        if x.dtype == torch.float64 or (scale is not None and scale.dtype == torch.float64)
        else torch.float32
    )
    if drop_pad_mode == 1:
        slots = torch.full((expert_num * expert_capacity,), -1, dtype=torch.long)
        rank = torch.arange(available) - torch.searchsorted(sorted_experts[:available], sorted_experts[:available])
        kept = rank < expert_capacity
        slots[sorted_experts[:available][kept] * expert_capacity + rank[kept]] = positions[:available][kept]
        expanded_row_idx = torch.full((total,), -1, dtype=torch.long)
        filled = slots >= 0
        expanded_row_idx[slots[filled]] = torch.arange(slots.numel())[filled]
        source_rows = slots.clamp(min=0) // k
        slot_experts = torch.arange(slots.numel()) // max(expert_capacity, 1)
    else:
        used = available if active_num <= 0 else min(active_num, available)
        if row_idx_type == 1:
            expanded_row_idx = torch.cat([positions[:available], positions.new_zeros(total - available)])
        else:
            expanded_row_idx = torch.full((total,), -1, dtype=torch.long)
            expanded_row_idx[positions[:available]] = torch.arange(available)
        filled = torch.arange(total) < used
        source_rows = torch.cat([positions[:used] // k, positions.new_zeros(total - used)])
        slot_experts = torch.cat([sorted_experts[:used] - start, sorted_experts.new_zeros(total - used)])
    gathered = torch.where(filled.unsqueeze(-1), x[source_rows], x.new_zeros(()))
    expanded_scale = torch.zeros(gathered.shape[0], dtype=compute)
    if quant_mode == 1:
        values = gathered.to(compute)
        if scale is not None:
            smooth = scale.to(compute)
            values = values * (
                smooth.reshape(1, -1) if smooth.shape[0] == 1 else smooth[slot_experts.clamp(0, smooth.shape[0] - 1)]
            )
        expanded_x, expanded_scale = _dynamic_quant(values)
        expanded_x, expanded_scale = (
            torch.where(filled.unsqueeze(-1), expanded_x, 0).to(torch.int8),
            expanded_scale * filled,
        )
    else:
        expanded_x = gathered
        if scale is not None:
            expanded_scale = torch.where(filled, scale.to(compute)[source_rows], 0.0)
    if drop_pad_mode == 1:
        expanded_x = expanded_x.reshape(expert_num, expert_capacity, -1)
    return expanded_x, expanded_row_idx.to(torch.int32), expert_tokens, expanded_scale


def _expert_range(expert_idx: torch.Tensor, expert_num: int, active_expert_range: list[int] | None) -> tuple[int, int]:
    """[start, end) of the active experts: active_expert_range, else every expert."""
    if active_expert_range:
        return int(active_expert_range[0]), int(active_expert_range[1])
    return 0, expert_num if expert_num > 0 else int(expert_idx.max()) + 1


def _expert_tokens(counts: torch.Tensor, start: int, expert_num: int, kind: int, flag: bool) -> torch.Tensor:
    """expert_token_cumsum_or_count: cumulative (0), counts (1), or the non-zero
    (expert, count) pairs at the head of an [expert_num, 2] tensor (2)."""
    if kind == 2:
        nonzero = torch.nonzero(counts).flatten()
        pairs = torch.stack([nonzero + start, counts[nonzero]], dim=1)
        return torch.cat([pairs, pairs.new_zeros(max(expert_num, pairs.shape[0]) - pairs.shape[0], 2)]).to(torch.int64)
    if kind not in (0, 1):
        raise ValueError(f"expert_tokens_num_type must be 0, 1 or 2, got {kind}")
    return (counts.cumsum(0) if kind == 0 else counts).to(torch.int64)


def _v2_written(
    x: torch.Tensor, expert_idx: torch.Tensor, **kwargs: object
) -> tuple[dict[int, int], dict[int, int], str]:
    """The rows past the available pairs; unrequested counts; the key_value pairs past
    the non-zero experts; expanded_scale without scale."""
    if kwargs.get("drop_pad_mode", 0) == 1:
        rows: dict[int, int] = {}
    else:
        num, given = kwargs.get("expert_num", -1), kwargs.get("active_expert_range")
        start, end = _expert_range(
            expert_idx, num if isinstance(num, int) else -1, list(given) if isinstance(given, (list, tuple)) else None
        )
        flat = expert_idx.reshape(-1)
        available = int(((flat >= start) & (flat < end)).sum())
        active_num = kwargs.get("active_num", -1)
        used = available if not isinstance(active_num, int) or active_num <= 0 else min(active_num, available)
        rows = {0: used, 3: used}
        if kwargs.get("row_idx_type", 0) == 1:
            rows[1] = available
        if kwargs.get("expert_tokens_num_type", 0) == 2:
            rows[2] = int((torch.bincount(flat[(flat >= start) & (flat < end)].long() - start) > 0).sum())
    if not kwargs.get("expert_tokens_num_flag"):
        rows[2] = 0
    if kwargs.get("scale") is None and kwargs.get("quant_mode", 0) != 1:
        rows[3] = 0
    return rows, {}, "(past the pairs of the active experts, or not requested)"


COMPANIONS = {
    "npu_moe_init_routing": Companions(fit_generated=_fit_generated_row_idx),
    "npu_moe_gating_top_k": Companions(written_rows=_gating_written),
    "npu_moe_init_routing_v2": Companions(written_rows=_v2_written),
}
