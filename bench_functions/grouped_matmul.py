"""CPU reference of ``torch_npu.npu_grouped_matmul``: every expert's GEMM of a MoE layer.

A grouped kernel writes only the rows its ``group_list`` covers; the rest of a single
output tensor is whatever the device memory held. ``written_rows`` says which rows those
are, so that the plugin judges only what the kernel wrote (msprobe 26.2 trims the same
outputs by ``group_list`` before comparing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ._common import Unsupported, compute_dtype, one_node
from .gelu import fast_gelu
from .registry import Companions

#: act_type -> the activation the kernel applies to each product (torch_npu docs)
ACTIVATIONS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    0: lambda y: y,
    1: torch.relu,
    2: lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    4: fast_gelu,
    5: torch.nn.functional.silu,
}
QUANTISED_OUTPUT = (torch.int8, torch.int32)


@dataclass(frozen=True)
class Group:
    """One matmul of the call: which weight it uses and which span of the grouped axis."""

    weight: int
    start: int
    size: int


def _int_list(value: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.dim() != 1:
            raise ValueError(
                f"group_list must be a 1-D integer tensor here, got {value.dtype} of shape {tuple(value.shape)}"
            )
        return [int(v) for v in value.tolist()]
    return [int(v) for v in value]


def groups_of(group_list: torch.Tensor | Sequence[int], group_list_type: int | None, length: int) -> list[Group]:
    """The groups ``group_list`` describes along a grouped axis of ``length`` elements.

    A Python list is always cumulative (torch_npu: group_list_type only applies to a
    tensor); a tensor is cumulative (0), counts (1) or ``[[weight index, count], ...]`` (2).
    """
    is_tensor = isinstance(group_list, torch.Tensor)
    kind = (group_list_type or 0) if is_tensor else 0
    if kind == 2:
        assert isinstance(group_list, torch.Tensor)  # kind 2 is read only from a tensor
        if group_list.dim() != 2 or group_list.shape[1] != 2 or group_list.is_floating_point():
            raise ValueError(
                f"group_list_type=2 needs an integer group_list of shape [E, 2] ([[weight index, count], ...]), got {tuple(group_list.shape)}"
            )
        indices, sizes = _int_list(group_list[:, 0]), _int_list(group_list[:, 1])
    elif kind in (0, 1):
        values = _int_list(group_list)
        if kind == 0:
            if any(b < a for a, b in zip([0, *values], values, strict=False)):
                raise ValueError(
                    f"group_list {values} is cumulative (group_list_type=0) but not non-negative and non-decreasing; "
                    "a statistics dump generates it at random: dump with task tensor to replay this call"
                )
            sizes = [b - a for a, b in zip([0, *values], values, strict=False)]
        else:
            sizes = values
        indices = list(range(len(sizes)))
    else:
        raise ValueError(
            f"group_list_type must be 0 (cumulative), 1 (counts) or 2 ([index, count] pairs), got {group_list_type!r}"
        )
    if any(size < 0 for size in sizes):
        raise ValueError(f"group_list gives negative group sizes {sizes}")
    if sum(sizes) > length:
        raise ValueError(f"group_list covers {sum(sizes)} rows where the grouped axis has only {length}")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [Group(index, start, size) for index, start, size in zip(indices, starts, sizes, strict=True)]


def _per_group(values: Sequence[torch.Tensor] | None, count: int, what: str) -> list[torch.Tensor | None]:
    """One tensor per weight: a list of them, or one tensor stacked over the groups."""
    if not values:
        return [None] * count
    if len(values) == count:
        return list(values)
    if len(values) == 1 and values[0].shape[0] == count:
        return list(values[0].unbind(0))
    raise ValueError(f"{what} holds {len(values)} tensors for {count} weights")


def _weights(weight: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if len(weight) == 1 and weight[0].dim() == 3:
        return list(weight[0].unbind(0))
    if any(w.dim() != 2 for w in weight):
        raise ValueError(f"weight must be 2-D tensors or one 3-D tensor, got shapes {[tuple(w.shape) for w in weight]}")
    return list(weight)


def _float_scale(scale: torch.Tensor) -> torch.Tensor:
    """A quantisation scale as float64: int64 scales carry float32 bits in their low word
    (torch_npu's example packs them so)."""
    if scale.dtype == torch.int64:
        return (scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32).double()
    return scale.double()


@dataclass(frozen=True)
class Params:
    """The per-weight parameters of one matmul."""

    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    antiquant_scale: torch.Tensor | None = None
    antiquant_offset: torch.Tensor | None = None


def _dequantise(w: torch.Tensor, p: Params, dtype: torch.dtype) -> torch.Tensor:
    """Formula 4's (weight + antiquant_offset) * antiquant_scale: per channel ([n]) or
    per group of rows of k ([G, n])."""
    assert p.antiquant_scale is not None
    scale = p.antiquant_scale.to(dtype)
    offset = p.antiquant_offset.to(dtype) if p.antiquant_offset is not None else torch.zeros_like(scale)
    if scale.dim() == 2:  # per group: G groups of k / G rows each
        rows = w.shape[0] // scale.shape[0]
        scale, offset = scale.repeat_interleave(rows, 0), offset.repeat_interleave(rows, 0)
    return (w.to(dtype) + offset) * scale


def _product(
    x: torch.Tensor,
    w: torch.Tensor,
    p: Params,
    per_token: torch.Tensor | None,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One group's result before the output dtype: formulas 1 to 4 of the docs."""
    if x.is_floating_point():
        dtype = compute_dtype(x)
        weight = _dequantise(w, p, dtype) if not w.is_floating_point() else w.to(dtype)
        y = torch.matmul(x.to(dtype), weight)
        return act(y + p.bias.to(dtype) if p.bias is not None else y)
    # int8 x and weight: exact integer products in float64 (|sums| < 2**53)
    y = torch.matmul(x.double(), w.double())
    if p.scale is None:  # int32 output: the bare product (+ int32 bias)
        return y + p.bias.double() if p.bias is not None else y
    int_bias = p.bias is not None and not p.bias.is_floating_point()
    if int_bias:
        assert p.bias is not None
        y = y + p.bias.double()
    y = y * _float_scale(p.scale)
    if per_token is not None:
        y = y * per_token.double().reshape(-1, *([1] * (y.dim() - 1)))
    if p.bias is not None and not int_bias:
        y = y + p.bias.double()
    if p.offset is not None:
        y = y + p.offset.double()
    return act(y)


def _output_dtype(x: torch.Tensor, output_dtype: torch.dtype | None, has_scale: bool) -> torch.dtype:
    if x.is_floating_point():
        return x.dtype
    if output_dtype is not None:
        return output_dtype
    return torch.int8 if has_scale else torch.int32


def _to_output(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype in QUANTISED_OUTPUT:
        info = torch.iinfo(dtype)
        return torch.round(y).clamp(info.min, info.max).to(dtype)
    return y.to(dtype)


def npu_grouped_matmul(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
    bias: Sequence[torch.Tensor] | None = None,
    scale: Sequence[torch.Tensor] | None = None,
    offset: Sequence[torch.Tensor] | None = None,
    antiquant_scale: Sequence[torch.Tensor] | None = None,
    antiquant_offset: Sequence[torch.Tensor] | None = None,
    per_token_scale: Sequence[torch.Tensor] | None = None,
    group_list: torch.Tensor | Sequence[int] | None = None,
    activation_input: Sequence[torch.Tensor] | None = None,
    activation_quant_scale: Sequence[torch.Tensor] | None = None,
    activation_quant_offset: Sequence[torch.Tensor] | None = None,
    split_item: int = 0,
    group_type: int | None = None,
    group_list_type: int = 0,
    act_type: int = 0,
    output_dtype: torch.dtype | None = None,
    tuning_config: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """y_i = x_i @ weight_i + bias_i for each group i; returns a list of tensors.

    Where x is one tensor and group_list splits its rows (group_type 0, or a Python
    group_list), group i is x's rows group_list describes; where x is a list, x_i is its
    i-th tensor. With group_type 2 (k-axis grouping, MindSpeed's weight gradient) x is
    [M, K] and weight [K, N], and y is [E, M, N] with y_i = x[:, K_i] @ weight[K_i, :].
    split_item 0/1 return one tensor per group, 2/3 one tensor of the groups' rows
    concatenated; rows of that tensor past group_list's total are not written by the
    kernel (here: zeros; ``written_rows`` names them).

    Facts:
    - torch_npu docs (op-plugin 7.x, torch_npu-npu_grouped_matmul.md): npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None, activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0, output_dtype=None, tuning_config=None) -> List[Tensor]. The PyTorch 2.1 signature of torch_npu 6.0 (no per_token_scale, group_type, group_list_type, act_type) is a subset: a dump of it selects the same formulas, with a Python group_list read cumulatively.
    - torch_npu docs: formula 1 y_i = x_i @ weight_i + bias_i; formula 2 y_i = (x_i @ weight_i + bias_i) * scale_i + offset_i with int32 bias, (x_i @ weight_i) * scale_i + bias_i with floating bias; formula 3 (x_i @ weight_i + bias_i) * scale_i * per_token_scale_i, floating bias added after the scales; formula 4 y_i = x_i @ ((weight_i + antiquant_offset_i) * antiquant_scale_i) + bias_i.
    - torch_npu 6.0.RC1-RC3 docs (PyTorch 2.1 signature): split_item 0/2 take one x per weight, 1/3 a single x split by a cumulative List[int] group_list; y has one tensor per weight for split_item 0/1, one for 2/3, as in 7.x. Which x a dump holds is read from the list itself, so a dump of either version selects the same computation.
    - torch_npu docs: group_list is a non-decreasing cumulative list for a List[int]; for a tensor group_list_type 0 = cumulative, 1 = per-group counts, 2 = [[groupIdx, groupSize], ...] (int8 only); group_type -1 no grouping, 0 m-axis, 1 n-axis (not supported by any NPU); weight 2-D per group or one 3-D [E, K, N] tensor; split_item 0/1 give one output per weight, 2/3 one output.
    - torch_npu docs: act_type 0 none, 1 RELU, 2 GELU_TANH, 4 FAST_GELU, 5 SILU; output dtype is x's for float16/bfloat16/float32 x (output_dtype None or equal), output_dtype for int8 x.
    - act_type follows torch_npu 7.0.0's page (hiascend Pytorch/700 apiref, npu_grouped_matmul) and op-plugin 7.3.0's torch_npu-npu_grouped_matmul.md: they list its values and formulas 1 to 4 without an activation term, and name no mode it is restricted to in the parts read; 6.0.RC1-RC3 and 6.0.0 have no act_type.
    - MindSpeed (mindspeed/lite/ops/grouped_matmul.py): forward npu_grouped_matmul([x], w_t, group_list, split_item=2, group_type=0); backward grad_x = npu_grouped_matmul([grad], w, split_item=2, group_type=0), grad_w = npu_grouped_matmul([x.T], [grad], split_item=3, group_type=2) (k-axis grouping over the tokens).

    Choices:
    - Products in float32 for float16/bfloat16/float32 x (float64 for float64), rounded once to the output dtype; int8 products exactly in float64; an int64 scale is read as the float32 bits of its low word (torch_npu's packing).
    - int8/int32 outputs are rounded half to even and saturated; a floating output_dtype with floating x is x's dtype (the docs allow only that), so the raised bench keeps its precision.
    - Rows of a single output past group_list's total are zeros here and named by written_rows; a group of size 0 of group_type 2 gives a zero matrix.
    - act_type applies to each group's result after bias, scales and offset, in every mode but the bare int32 product (int8 x, no scale), which raises Unsupported: no documented formula gives an activation of an int32 accumulator.
    - group_type 1, int4 x/weight (packed in int32) and the reserved activation_* arguments raise Unsupported; backward by autograd (grad_x = grad @ w^T per group, grad_w_i = x_i^T @ grad_i, MindSpeed's formulas).
    """
    if group_type == 1:
        raise Unsupported("group_type=1 (n-axis grouping) is documented as supported by no NPU")
    if activation_input or activation_quant_scale or activation_quant_offset:
        raise Unsupported("activation_input / activation_quant_* are reserved arguments (docs: only None)")
    act = ACTIVATIONS.get(act_type)
    if act is None:
        raise Unsupported(f"act_type={act_type} is not one of the documented activations {sorted(ACTIVATIONS)}")
    xs, ws, bs = list(x), list(weight), list(bias or [])
    if act_type and not xs[0].is_floating_point() and not scale:
        raise Unsupported(
            f"act_type={act_type} on the bare int32 product (int8 x, no scale): the documented formulas apply an activation "
            "to a dequantised or floating result only, so the activation of an int32 accumulator is not replayed"
        )
    if any(t.dtype == torch.int32 for t in (*xs, *ws)):
        raise Unsupported(
            "int4 x or weight (packed into int32 by npu_quantize): its packing and NZ layout are not reproduced"
        )
    split = (len(xs), len(xs) + len(ws))

    def compute(*flat: torch.Tensor) -> list[torch.Tensor]:
        return _matmul_per_group(
            list(flat[: split[0]]),
            list(flat[split[0] : split[1]]),
            list(flat[split[1] :]),
            act=act,
            scale=scale,
            offset=offset,
            antiquant_scale=antiquant_scale,
            antiquant_offset=antiquant_offset,
            per_token_scale=per_token_scale,
            group_list=group_list,
            split_item=split_item,
            group_type=group_type,
            group_list_type=group_list_type,
            output_dtype=output_dtype,
        )

    if not xs[0].is_floating_point():
        return compute(*xs, *ws, *bs)
    return list(one_node(compute, [*xs, *ws, *bs]))


def _matmul_per_group(
    xs: list[torch.Tensor],
    weight: list[torch.Tensor],
    bias: list[torch.Tensor],
    *,
    act: Callable[[torch.Tensor], torch.Tensor],
    scale: Sequence[torch.Tensor] | None,
    offset: Sequence[torch.Tensor] | None,
    antiquant_scale: Sequence[torch.Tensor] | None,
    antiquant_offset: Sequence[torch.Tensor] | None,
    per_token_scale: Sequence[torch.Tensor] | None,
    group_list: torch.Tensor | Sequence[int] | None,
    split_item: int,
    group_type: int | None,
    group_list_type: int,
    output_dtype: torch.dtype | None,
) -> list[torch.Tensor]:
    """The documented formulas, group by group (see npu_grouped_matmul)."""
    if group_type == 2:
        return [_matmul_split_k(xs, weight, bias, group_list, group_list_type, act)]
    weights = _weights(weight)
    n = len(weights)
    per_weight = [
        Params(*p)
        for p in zip(
            _per_group(bias, n, "bias"),
            _per_group(scale, n, "scale"),
            _per_group(offset, n, "offset"),
            _per_group(antiquant_scale, n, "antiquant_scale"),
            _per_group(antiquant_offset, n, "antiquant_offset"),
            strict=True,
        )
    ]
    tokens = list(per_token_scale or [])
    out_dtype = _output_dtype(xs[0], output_dtype, scale is not None and len(scale) > 0)
    if len(xs) == 1 and group_list is not None:
        groups = groups_of(group_list, group_list_type, xs[0].shape[0])
        parts = [xs[0][g.start : g.start + g.size] for g in groups]
        part_tokens = [tokens[0][g.start : g.start + g.size] if tokens else None for g in groups]
        picked = [g.weight for g in groups]
    else:
        if len(xs) != n:
            raise ValueError(f"x holds {len(xs)} tensors for {n} weights and no group_list splits it")
        parts, part_tokens, picked = xs, [tokens[i] if tokens else None for i in range(n)], list(range(n))
    if any(not 0 <= i < n for i in picked):
        raise ValueError(f"group_list names weights {sorted(set(picked))} where the call has {n} (0..{n - 1})")
    ys = [
        _product(part, weights[i], per_weight[i], tok, act)
        for part, i, tok in zip(parts, picked, part_tokens, strict=True)
    ]
    if split_item in (0, 1):
        return [_to_output(y, out_dtype) for y in ys]
    if split_item not in (2, 3):
        raise ValueError(f"split_item must be 0, 1, 2 or 3, got {split_item!r}")
    y = torch.cat([y.reshape(-1, y.shape[-1]) for y in ys])
    if len(xs) == 1 and y.shape[0] < xs[0].shape[0]:  # rows past group_list's total: not written
        y = torch.cat([y, y.new_zeros(xs[0].shape[0] - y.shape[0], y.shape[1])])
    return [_to_output(y, out_dtype)]


def _matmul_split_k(
    xs: list[torch.Tensor],
    weights: list[torch.Tensor],
    bias: Sequence[torch.Tensor] | None,
    group_list: torch.Tensor | Sequence[int] | None,
    group_list_type: int,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """group_type 2: x [M, K] and weight [K, N] split along K -> [E, M, N]."""
    if len(xs) != 1 or len(weights) != 1 or group_list is None:
        raise ValueError("group_type=2 takes one x [M, K], one weight [K, N] and a group_list over K")
    if bias:
        raise Unsupported("group_type=2 with a bias is not documented")
    a, b = xs[0], weights[0]
    dtype = compute_dtype(a)
    groups = groups_of(group_list, group_list_type, a.shape[1])
    ys = [
        act(torch.matmul(a[:, g.start : g.start + g.size].to(dtype), b[g.start : g.start + g.size].to(dtype)))
        for g in groups
    ]
    return torch.stack(ys).to(a.dtype)


def written_rows(
    x: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], **kwargs: object
) -> tuple[dict[int, int], dict[int, int], str]:
    """Which leading rows the kernel writes: ({output position: rows}, {input tensor
    position: rows of its gradient}, why the rest is not), positions counted over the
    flattened outputs and the call's flattened tensor arguments; a position not named
    is written in full.

    A single x split by group_list (group_type 0 or a Python list) with a single output
    (split_item 2/3): the output's rows, and x's gradient rows, past the total."""
    group_list = kwargs.get("group_list")
    if len(x) != 1 or group_list is None or kwargs.get("group_type") == 2 or kwargs.get("split_item", 0) not in (2, 3):
        return {}, {}, ""
    list_type = kwargs.get("group_list_type", 0)
    groups = groups_of(group_list, list_type if isinstance(list_type, int) else 0, x[0].shape[0])  # type: ignore[arg-type]
    total = sum(g.size for g in groups)
    if total >= x[0].shape[0]:
        return {}, {}, ""
    return {0: total}, {0: total}, "past group_list's total"


def fitted_counts(counts: torch.Tensor, length: int) -> torch.Tensor:
    """Generated group sizes made non-negative and scaled down to cover at most `length`."""
    counts = counts.clamp(min=0)
    total = int(counts.sum())
    return counts if total <= length else counts * length // total


def fit_generated(
    x: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], **kwargs: object
) -> tuple[torch.Tensor | None, str]:
    """A statistics dump records only group_list's Max/Min/Mean/Norm, so the replay
    generates one at random within them; made here, in place, into a group_list the
    kernel can read: sorted where it is cumulative, sizes scaled down to the rows where
    they are counts, each x's rows where x is a list, and weight indices within the
    weights where it holds [index, count] pairs. -> (the tensor changed, what was done),
    or (None, "") where nothing needed doing."""
    group_list = kwargs.get("group_list")
    kind = kwargs.get("group_list_type", 0) or 0
    if (
        not isinstance(group_list, torch.Tensor)
        or group_list.is_floating_point()
        or group_list.dim() != (2 if kind == 2 else 1)
    ):
        return None, ""
    length = x[0].shape[1] if kwargs.get("group_type") == 2 else x[0].shape[0]
    if kind == 2:
        fitted = group_list.clone()
        fitted[:, 0] = group_list[:, 0].clamp(0, len(_weights(weight)) - 1)
        fitted[:, 1] = fitted_counts(group_list[:, 1], length)
        how = "weight indices within the weights and sizes within the rows"
    elif kind not in (0, 1):
        return None, ""
    elif len(x) > 1:
        counts = torch.tensor([t.shape[0] for t in x], dtype=group_list.dtype)
        fitted = counts.cumsum(0) if kind == 0 else counts
        how = "set to the rows of each x"
    elif kind == 0:
        fitted = fitted_counts(torch.diff(group_list.sort().values, prepend=group_list.new_zeros(1)), length).cumsum(0)
        how = "sorted into a cumulative group_list"
    else:
        fitted, how = fitted_counts(group_list, length), "made non-negative sizes within the rows"
    if fitted.shape != group_list.shape or torch.equal(fitted, group_list):
        return None, ""
    group_list.copy_(fitted)
    return group_list, how


COMPANIONS = {"npu_grouped_matmul": Companions(written_rows=written_rows, fit_generated=fit_generated)}
