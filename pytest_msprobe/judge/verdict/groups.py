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

Groups only where they are true: a group's elements share a sign only where the shared
quantity is rounded at (or near) the output's precision. In float32 and float64 it is
(the kernel's opmath is D). In float16 and bfloat16 a correct kernel forms it in float32,
2**-13 ULP of D, and its elements are independent draws -- except where ATen's own CPU
kernel measurably rounds it at D (batch statistics, layer_norm's backward row sums with
a 16-bit weight, group_norm's backward): GROUPS says per API why, with the measurement.
Counting elements there, a 16-bit normalisation that truncates is caught on any tensor
of 64 elements or more, whatever its row count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import torch

from pytest_msprobe.judge.verdict.terms import Param, argument, torch_form
from pytest_msprobe.run.replay import Inputs, Run

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.run.replay import Side


def collapse(shape: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """Each element's group: its index with `dims` (the reduced ones) collapsed."""
    reduced = {d % len(shape) for d in dims} if shape else set()
    kept = [1 if d in reduced else size for d, size in enumerate(shape)]
    return torch.arange(math.prod(kept)).reshape(kept).expand(shape)


def _softmax_dim(x: torch.Tensor, dim: int | None) -> int:
    """torch's dim for a softmax called without one (its legacy rule)."""
    if dim is not None:
        return dim
    return 0 if x.dim() in (0, 1, 3) else 1


def _rows(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """softmax and its kin: one group per row along `dim` (its sum)."""
    x = args[0]
    return collapse(tuple(x.shape), (_softmax_dim(x, argument(args, kwargs, 1, "dim")),))


def _normalized_rows(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """layer_norm, rms_norm: one group per row over the trailing normalized_shape."""
    x, normalized = args[0], argument(args, kwargs, 1, "normalized_shape")
    count = 1 if isinstance(normalized, int) else len(normalized)
    return collapse(tuple(x.shape), tuple(range(x.dim() - count, x.dim())))


def _channels(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """batch_norm: one group per channel (dim 1), its statistics over the batch."""
    x = args[0]
    return collapse(tuple(x.shape), tuple(d for d in range(x.dim()) if d != 1))


def _instances(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """instance_norm: one group per (sample, channel)."""
    x = args[0]
    return collapse(tuple(x.shape), tuple(range(2, x.dim())))


def _norm_groups(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """group_norm: one group per (sample, group of channels)."""
    x, groups = args[0], int(argument(args, kwargs, 1, "num_groups"))
    ids = torch.arange(x.shape[0] * groups).reshape(x.shape[0], groups, 1)
    return ids.expand(x.shape[0], groups, x[0].numel() // groups).reshape(x.shape)


GroupsOf: TypeAlias = "Callable[[list[Param], dict[str, Param]], torch.Tensor | None]"
#: whether a 16-bit call's shared quantity is rounded at D: (args, kwargs, direction, weight)
SharedIn16: TypeAlias = "Callable[[list[Param], dict[str, Param], str], bool]"

HALF_DTYPES = (torch.float16, torch.bfloat16)


def _never(args: list[Param], kwargs: dict[str, Param], direction: str) -> bool:
    """softmax and its kin, rms_norm, cross_entropy, attention, a division by a scalar:
    correct kernels (ATen's opmath, CUDA's, CANN's) form the shared quantity in float32,
    2**-13 ULP of float16 at most, so a 16-bit output's elements are independent draws.
    Measured on ATen's CPU kernels against float64 rounded to D: softmax forward and
    backward, rms_norm forward and backward, x / 7 and x / a scalar tensor, 64 x 256
    bfloat16 and float16, 0-2 of 16384 elements differ; and a kernel that rounds it to D
    is a defect the elements' test must see (torch's cross_entropy gradient taken from a
    log_softmax rounded to D, judge/defects/model_reproducers.py: -0.27 to -0.72 ULP on 3 real dumps,
    which grouped by samples passed)."""
    return False


def _backward_with_half_weight(args: list[Param], kwargs: dict[str, Param], direction: str) -> bool:
    """layer_norm: the forward rounds once (0 of 16384 elements differ); ATen's CPU
    backward forms each row's two sums in the weight's dtype, so with a 16-bit weight a
    row's input gradient shares a rounding at D (measured, 64 rows of 256, bfloat16:
    element z -14.1, row z -1.5, per-row sign sums -119..+105; float16 +11.5 / +1.3);
    with a float32 weight none (z 1.0)."""
    weight = argument(args, kwargs, 2, "weight")
    return direction == "backward" and isinstance(weight, torch.Tensor) and weight.dtype in HALF_DTYPES


def _backward(args: list[Param], kwargs: dict[str, Param], direction: str) -> bool:
    """group_norm: the forward rounds once (2 of 18432 elements differ); ATen's CPU
    backward rounds each group's sums at D (8 x 16 x 12 x 12, 4 groups: element z -9.9,
    group z -0.7 in bfloat16; -4.9 / -0.4 in float16)."""
    return direction == "backward"


def _training(args: list[Param], kwargs: dict[str, Param], direction: str) -> bool:
    """batch_norm: with batch statistics (training) ATen's CPU kernel rounds each
    channel's statistics at D, forward and backward (8 x 16 x 12 x 12 bfloat16: element
    z -21.4 forward, -25.3 backward; channel z -1.0, -1.1; per-channel sign sums up to
    909 of 1152); with running statistics (eval) it rounds once (0 differ)."""
    return bool(argument(args, kwargs, 5, "training"))


def _always(args: list[Param], kwargs: dict[str, Param], direction: str) -> bool:
    """instance_norm: always its batch statistics, rounded at D per instance as
    batch_norm's (element z -6.7 bfloat16, -13.6 float16; instance z -1.0, -2.3)."""
    return True


def _cross_entropy_classes(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """cross_entropy: one group per sample, over the class dim (1; 0 for one unbatched
    sample): its gradient is the sample's softmax, all of it scaled by the one log-sum-exp.
    Measured on an H200 against torch's CPU kernel (studies/verdicts-on-a-cuda-gpu.md): correct
    float32 gradients differ by 0.3-0.5 ULP of bias, z 5-12 by elements."""
    x = args[0]
    return collapse(tuple(x.shape), (1 if x.dim() >= 2 else 0,))


def _queries(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor:
    """scaled_dot_product_attention: one group per row of the query's shape. A query's
    output row and its gradient's row share that query's softmax sum; where the key or
    value has the query's shape (self-attention), a row of their gradients shares one
    column of the probabilities. An output of another shape is not grouped."""
    q = args[0]
    return collapse(tuple(q.shape), (-1,))


def _by_a_scalar(args: list[Param], kwargs: dict[str, Param]) -> torch.Tensor | None:
    """A division by one number: one group (its reciprocal); none by a tensor."""
    x, y = args[0], argument(args, kwargs, 1, "other")
    if not isinstance(x, torch.Tensor):
        return None
    if isinstance(y, (int, float)) or (isinstance(y, torch.Tensor) and y.numel() == 1):
        return torch.zeros(x.shape, dtype=torch.int64)
    return None


#: API -> (its groups, whether they are true in 16-bit). In float32 and float64 a correct
#: kernel rounds the shared quantity at D (its opmath is D), so the groups always hold;
#: in 16-bit only where the second function says its shared quantity is rounded at D.
GROUPS: dict[str, tuple[GroupsOf, SharedIn16]] = {
    **dict.fromkeys(("softmax", "log_softmax", "softmin", "_softmax", "_log_softmax"), (_rows, _never)),
    "layer_norm": (_normalized_rows, _backward_with_half_weight),
    "rms_norm": (_normalized_rows, _never),
    "batch_norm": (_channels, _training),
    "instance_norm": (_instances, _always),
    "group_norm": (_norm_groups, _backward),
    "cross_entropy": (_cross_entropy_classes, _never),
    "scaled_dot_product_attention": (_queries, _never),
    **dict.fromkeys(
        ("div", "div_", "divide", "true_divide", "__truediv__", "__itruediv__", "__div__"), (_by_a_scalar, _never)
    ),
}


def torch_arguments(bench: Side, inputs: Inputs) -> tuple[list[Param], dict[str, Param]]:
    """The call's arguments by torch's names and positions, which the tables read (a
    MindSpore call's torch twin translates its own: judge/verdict/terms.py torch_form)."""
    if isinstance(bench, Run):
        return torch_form(bench, list(inputs.args), dict(inputs.kwargs))
    return list(inputs.args), dict(inputs.kwargs)


def groups_of(name: CallName, bench: Side, inputs: Inputs) -> torch.Tensor | None:
    """The group ids of the call's grouped outputs, None where its API has none (or its
    arguments are of a form the table does not read: its elements stay independent)."""
    entry = GROUPS.get(name.operator)
    if entry is None or not inputs.args or not isinstance(inputs.args[0], torch.Tensor):
        return None
    numbered, shared_in_half = entry
    args, kwargs = torch_arguments(bench, inputs)
    try:
        if args[0].dtype in HALF_DTYPES and not shared_in_half(args, kwargs, name.direction):
            return None
        return numbered(args, kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError, AttributeError):
        return None
