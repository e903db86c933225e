"""CPU reference of ``torch_npu.npu_dequant_swiglu_quant``: the int32 output of a
quantised grouped matmul dequantised, through SwiGLU, and quantised again per token."""

from __future__ import annotations

import torch

from ._common import Unsupported
from .grouped_matmul import fitted_counts, groups_of
from .registry import Companions


def _group_rows(tensor: torch.Tensor | None, sizes: list[int], rows: int) -> torch.Tensor | None:
    """A per-group tensor [groups, n] repeated to one row per token ([n] or [1, n]: shared)."""
    if tensor is None:
        return None
    if tensor.dim() == 1 or tensor.shape[0] == 1:
        return tensor.reshape(1, -1).expand(rows, -1)
    repeated = tensor.repeat_interleave(torch.tensor(sizes, device=tensor.device), dim=0)
    return torch.cat([repeated, repeated.new_zeros(rows - repeated.shape[0], tensor.shape[-1])])


def npu_dequant_swiglu_quant(
    x: torch.Tensor,
    *,
    weight_scale: torch.Tensor | None = None,
    activation_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    quant_scale: torch.Tensor | None = None,
    quant_offset: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    activate_left: bool = False,
    quant_mode: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out int8 [tokens, H], scale [tokens]): x dequantised (x * weight_scale *
    activation_scale, int32 x), swiglu, times quant_scale, then dynamically quantised per
    token (scale = max |row| / 127, out = round(row / scale)).

    Facts:
    - torch_npu docs (op-plugin 7.x): npu_dequant_swiglu_quant(Tensor x, *, Tensor? weight_scale=None, Tensor? activation_scale=None, Tensor? bias=None, Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? group_index=None, bool activate_left=False, int quant_mode=0) -> (Tensor, Tensor); x [TokensNum, 2H] int32 or bfloat16; weight_scale [groupNum, 2H] float32; activation_scale [TokensNum] float32; quant_scale [groupNum, H]; group_index int64 counts (count mode only); out int8 [TokensNum, H], scale float32 [TokensNum].
    - torch_npu docs: dequant x = x * weight_scale, x = x * activation_scale; activate_left=True: swish(first half) * second half, False: swish(second half) * first half; optional smooth quant out = out * quant_scale; quant_mode 0 static, 1 dynamic (the only mode with group_index); bias and quant_offset have no effect with group_index.
    - torch_npu docs: rows of out and scale past group_index's sum are not cleared (garbage, possibly inf/nan).

    Choices:
    - Dynamic quantisation as torch_npu's npu_dynamic_quant documents it (scale = row max |.| / 127, round half to even, saturate to int8); an int32 bias is added to x before the dequantisation.
    - quant_mode 0 (static) raises Unsupported: the docs give no formula for its scale; arithmetic in the scales' dtype (float32; float64 on a float64 bench).
    """
    if quant_mode != 1:
        raise Unsupported("quant_mode=0 (static quantisation): the docs give no formula for it")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (2H), got {x.shape[-1]}")
    rows = x.shape[0]
    floats = [t for t in (weight_scale, activation_scale, quant_scale) if t is not None and t.is_floating_point()]
    dtype = (
        torch.float64 if any(t.dtype == torch.float64 for t in floats) or x.dtype == torch.float64 else torch.float32
    )
    sizes = [g.size for g in groups_of(group_index, 1, rows)] if group_index is not None else [rows]
    y = x.to(dtype)
    if bias is not None and group_index is None:
        y = y + bias.to(dtype)
    ws = _group_rows(weight_scale, sizes, rows)
    if ws is not None:
        y = y * ws.to(dtype)
    if activation_scale is not None:
        y = y * activation_scale.reshape(rows, 1).to(dtype)
    first, second = y.chunk(2, dim=-1)
    gate, up = (first, second) if activate_left else (second, first)
    out = torch.nn.functional.silu(gate) * up
    qs = _group_rows(quant_scale, sizes, rows)
    if qs is not None:
        out = out * qs.to(dtype)
    scale = out.abs().amax(dim=-1) / 127.0
    quantised = torch.round(out / torch.where(scale > 0, scale, 1.0).unsqueeze(-1)).clamp(-128, 127).to(torch.int8)
    return quantised, scale


def written_rows(x: torch.Tensor, **kwargs: object) -> tuple[dict[int, int], dict[int, int], str]:
    """Both outputs' rows past group_index's sum are not written."""
    group_index = kwargs.get("group_index")
    if not isinstance(group_index, torch.Tensor):
        return {}, {}, ""
    total = sum(g.size for g in groups_of(group_index, 1, x.shape[0]))
    if total >= x.shape[0]:
        return {}, {}, ""
    return {0: total, 1: total}, {}, "past group_index's sum"


def fit_generated(x: torch.Tensor, **kwargs: object) -> tuple[torch.Tensor | None, str]:
    """A statistics dump's generated group_index (counts) made non-negative and within
    x's rows, in place (see grouped_matmul.fit_generated)."""
    group_index = kwargs.get("group_index")
    if not isinstance(group_index, torch.Tensor) or group_index.dim() != 1 or group_index.is_floating_point():
        return None, ""
    fitted = fitted_counts(group_index, x.shape[0])
    if torch.equal(fitted, group_index):
        return None, ""
    group_index.copy_(fitted)
    return group_index, "made non-negative sizes within the rows"


COMPANIONS = {"npu_dequant_swiglu_quant": Companions(written_rows=written_rows, fit_generated=fit_generated)}
