"""Which elements of a call's output share one rounded quantity: the bias tests' groups.

A correct kernel rounds a normaliser once and every element it scales inherits that
rounding: a softmax row's sum, a layer_norm (rms_norm) row's mean and 1/sigma, a
batch_norm channel's batch statistics, a group_norm group's, a division by a scalar's
one reciprocal (x * (1 / y), as torch's own CPU kernel and many accelerators divide), a
cross_entropy sample's log-sum-exp, an attention query's softmax sum.
Two correct kernels that round it differently differ by a sign shared across the group,
so the standards' sign tests count groups, not elements (standards/bias.py, measured
cases there). GROUPS maps an API to the function that numbers each element's group,
from the call's arguments read by torch's names and positions (a MindSpore call's torch
twin translates its own, as for the terms). The ids have the shape of the first
argument: the forward output of these APIs and the gradient of that input have it too;
an output of another shape (a normalisation's weight gradient) is not grouped.
An API not in the table is not grouped: its elements are independent draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import torch

from pytest_msprobe.run.replay import Inputs, Run
from pytest_msprobe.run.terms import argument, torch_form

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.dump.values import Value
    from pytest_msprobe.run.replay import Side


def collapsed(shape: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """Each element's group: its index with `dims` (the reduced ones) collapsed."""
    reduced = {d % len(shape) for d in dims} if shape else set()
    kept = [1 if d in reduced else size for d, size in enumerate(shape)]
    return torch.arange(math.prod(kept)).reshape(kept).expand(shape)


def _softmax_dim(x: torch.Tensor, dim: int | None) -> int:
    """torch's dim for a softmax called without one (its legacy rule)."""
    if dim is not None:
        return dim
    return 0 if x.dim() in (0, 1, 3) else 1


def _rows(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """softmax and its kin: one group per row along `dim` (its sum)."""
    x = args[0]
    return collapsed(tuple(x.shape), (_softmax_dim(x, argument(args, kwargs, 1, "dim")),))


def _normalized_rows(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """layer_norm, rms_norm: one group per row over the trailing normalized_shape."""
    x, normalized = args[0], argument(args, kwargs, 1, "normalized_shape")
    count = 1 if isinstance(normalized, int) else len(normalized)
    return collapsed(tuple(x.shape), tuple(range(x.dim() - count, x.dim())))


def _channels(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """batch_norm: one group per channel (dim 1), its statistics over the batch."""
    x = args[0]
    return collapsed(tuple(x.shape), tuple(d for d in range(x.dim()) if d != 1))


def _instances(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """instance_norm: one group per (sample, channel)."""
    x = args[0]
    return collapsed(tuple(x.shape), tuple(range(2, x.dim())))


def _norm_groups(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """group_norm: one group per (sample, group of channels)."""
    x, groups = args[0], int(argument(args, kwargs, 1, "num_groups"))
    ids = torch.arange(x.shape[0] * groups).reshape(x.shape[0], groups, 1)
    return ids.expand(x.shape[0], groups, x[0].numel() // groups).reshape(x.shape)


GroupsOf: TypeAlias = "Callable[[list[Value], dict[str, Value]], torch.Tensor | None]"


def _in_float32(grouped: GroupsOf) -> GroupsOf:
    """`grouped` for float32/float64 inputs only. A correct kernel forms these APIs'
    shared quantity in float32 whatever the dtype (torch's opmath, the GPU's), so in
    float16/bfloat16 its rounding is far below an ULP of D and the elements are
    independent draws; a kernel that rounds it to D is a defect the element count's sign
    test must see: torch's cross_entropy gradient taken from a log_softmax rounded to
    bfloat16/float16 (torch_findings.py), -0.27 to -0.72 ULP of bias on 3 real dumps,
    which grouped by samples passed."""

    def numbered(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor | None:
        x = args[0]
        return grouped(args, kwargs) if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64) else None

    return numbered


def _classes(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """cross_entropy: one group per sample, over the class dim (1; 0 for one unbatched
    sample): its gradient is the sample's softmax, all of it scaled by the one log-sum-exp.
    Measured on an H200 against torch's CPU kernel (benchmarks/RESULTS-cuda.md): correct
    float32 gradients differ by 0.3-0.5 ULP of bias, z 5-12 by elements."""
    x = args[0]
    return collapsed(tuple(x.shape), (1 if x.dim() >= 2 else 0,))


def _queries(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor:
    """scaled_dot_product_attention: one group per row of the query's shape. A query's
    output row and its gradient's row share that query's softmax sum; where the key or
    value has the query's shape (self-attention), a row of their gradients shares one
    column of the probabilities. An output of another shape is not grouped."""
    q = args[0]
    return collapsed(tuple(q.shape), (-1,))


def _by_a_scalar(args: list[Value], kwargs: dict[str, Value]) -> torch.Tensor | None:
    """A division by one number: one group (its reciprocal); none by a tensor."""
    x, y = args[0], argument(args, kwargs, 1, "other")
    if not isinstance(x, torch.Tensor):
        return None
    if isinstance(y, (int, float)) or (isinstance(y, torch.Tensor) and y.numel() == 1):
        return torch.zeros(x.shape, dtype=torch.int64)
    return None


GROUPS: dict[str, GroupsOf] = {
    **dict.fromkeys(("softmax", "log_softmax", "softmin", "_softmax", "_log_softmax"), _rows),
    **dict.fromkeys(("layer_norm", "rms_norm"), _normalized_rows),
    "batch_norm": _channels,
    "instance_norm": _instances,
    "group_norm": _norm_groups,
    "cross_entropy": _in_float32(_classes),
    "scaled_dot_product_attention": _in_float32(_queries),
    **dict.fromkeys(("div", "div_", "divide", "true_divide", "__truediv__", "__itruediv__", "__div__"), _by_a_scalar),
}


def groups_of(name: CallName, bench: Side, inputs: Inputs) -> torch.Tensor | None:
    """The group ids of the call's grouped outputs, None where its API has none (or its
    arguments are of a form the table does not read: its elements stay independent)."""
    numbered = GROUPS.get(name.operator)
    if numbered is None or not inputs.args or not isinstance(inputs.args[0], torch.Tensor):
        return None
    args, kwargs = (
        torch_form(bench, list(inputs.args), dict(inputs.kwargs)) if isinstance(bench, Run) else (list(inputs.args), dict(inputs.kwargs))
    )
    try:
        return numbered(args, kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError):
        return None
