"""A call's arguments in float64 (Arguments) and the intermediates a backward's
definition (derivatives.yaml's formula) computes from them (BACKWARD_INTERMEDIATES),
with the magnitude tests both the overflow excuses (judge/explore/overflow_excuses.py) and the
known torch defects' regimes (judge/defects/regimes.py) read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested


@dataclass(frozen=True)
class Arguments:
    """A backward's forward arguments, incoming gradients and forward result, floating
    tensors in float64: what BACKWARD_INTERMEDIATES' formulas read."""

    args: list[Nested]
    kwargs: dict[str, Nested]
    grads: list[torch.Tensor]
    result: torch.Tensor

    def tensor(self, position: int, keyword: str) -> torch.Tensor | None:
        value = self.args[position] if position < len(self.args) else self.kwargs.get(keyword)
        return value if isinstance(value, torch.Tensor) and value.is_floating_point() else None


def widen(value: Nested) -> Nested:
    """A floating tensor in float64, as Arguments holds it; anything else as it is."""
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _atan2_backward(call: Arguments) -> list[torch.Tensor]:
    """atan2_backward (FunctionsManual.cpp): grad * other * recip, grad * -self * recip,
    recip = 1 / (self * self + other * other)."""
    y, x, g = call.tensor(0, "input"), call.tensor(1, "other"), call.grads[0]
    return [] if y is None or x is None else [y * y + x * x, g * x, g * y]


def _std_backward(call: Arguments) -> list[torch.Tensor]:
    """std_backward (FunctionsManual.cpp): var_backward(grad / (result * 2))."""
    return [call.result * 2]


def _layer_norm_backward(call: Arguments) -> list[torch.Tensor]:
    """The input gradient rstd (g w - mean(g w) - x_hat mean(g w x_hat)): the row sums of
    g w (their partial sums bounded by sum |g w|)."""
    shape, weight = (
        call.args[1] if len(call.args) > 1 else call.kwargs.get("normalized_shape"),
        call.tensor(2, "weight"),
    )
    if not isinstance(shape, (list, tuple)) or weight is None:
        return []
    products = (call.grads[0] * weight).abs()
    return [products.sum(tuple(range(-len(shape), 0)))]


def _rms_norm_backward(call: Arguments) -> list[torch.Tensor]:
    """rms_norm is composite (x rsqrt(mean(x**2) + eps) w): its backward chains
    derivatives.yaml's formulas, rsqrt's -grad result**3 / 2 (rstd**3) with grad the row
    sums of g w x."""
    shape, x, weight = (
        call.args[1] if len(call.args) > 1 else call.kwargs.get("normalized_shape"),
        call.tensor(0, "input"),
        call.tensor(2, "weight"),
    )
    eps = call.args[3] if len(call.args) > 3 else call.kwargs.get("eps")
    if not isinstance(shape, (list, tuple)) or x is None:
        return []
    dims = tuple(range(-len(shape), 0))
    rstd = (x.square().mean(dims) + (eps if isinstance(eps, float) else torch.finfo(torch.float32).eps)).rsqrt()
    products = call.grads[0] * x * (weight if weight is not None else 1)
    return [rstd**3, products.abs().sum(dims)]


def _pairwise_distance_backward(call: Arguments) -> list[torch.Tensor]:
    """pairwise_distance is norm(x1 - x2 + eps): norm_backward (derivatives.yaml) divides
    by the norm, the forward's result, which sums the squares of x1 - x2."""
    x1, x2 = call.tensor(0, "x1"), call.tensor(1, "x2")
    return [] if x1 is None or x2 is None else [x1 - x2, (x1 - x2).square().sum(-1), call.result]


def _cosine_embedding_loss_backward(call: Arguments) -> list[torch.Tensor]:
    """cosine_embedding_loss is composite (aten's Loss.cpp: cos = x1 . x2 / sqrt(m1 m2),
    m = sum(x**2) + 1e-12): its backward chains div's and sqrt's formulas, the product
    m1 m2, x1 . x2's gradient g / sqrt(m1 m2) and the denominator's g (x1 . x2) / (m1 m2)
    over 2 sqrt(m1 m2)."""
    x1, x2, target = (
        call.tensor(0, "input1"),
        call.tensor(1, "input2"),
        call.args[2] if len(call.args) > 2 else call.kwargs.get("target"),
    )
    if x1 is None or x2 is None or not isinstance(target, torch.Tensor):
        return []
    dim = target.dim()
    squares = ((x1 * x1).sum(dim) + 1e-12) * ((x2 * x2).sum(dim) + 1e-12)
    return [squares, call.grads[0] / squares.sqrt(), call.grads[0] * (x1 * x2).sum(dim) / squares / squares.sqrt()]


def _group_norm_backward(call: Arguments) -> list[torch.Tensor]:
    """layer_norm's over each (sample, group of channels), the weight per channel: the
    group sums of |g w| (the definition's mean(g w) and mean(g w x_hat))."""
    x, groups, weight = (
        call.args[0],
        call.args[1] if len(call.args) > 1 else call.kwargs.get("num_groups"),
        call.tensor(2, "weight"),
    )
    if not isinstance(x, torch.Tensor) or not isinstance(groups, int) or weight is None:
        return []
    products = (call.grads[0] * weight.reshape([1, -1] + [1] * (x.dim() - 2))).abs()
    return [products.reshape(x.shape[0], groups, -1).sum(-1)]


#: A backward's definition is derivatives.yaml's formula: the intermediates it computes in
#: the dtype, from the forward's arguments, the incoming gradients and the forward's exact
#: result (float64), per API. Each excuses an example where it overflows the dtype or
#: falls below its smallest normal value.
BACKWARD_INTERMEDIATES: dict[str, Callable[[Arguments], list[torch.Tensor]]] = {
    "atan2": _atan2_backward,
    "std": _std_backward,
    "layer_norm": _layer_norm_backward,
    "rms_norm": _rms_norm_backward,
    "pairwise_distance": _pairwise_distance_backward,
    "cosine_embedding_loss": _cosine_embedding_loss_backward,
    "group_norm": _group_norm_backward,
}


def underflows(values: torch.Tensor, tiny: float) -> bool:
    """Whether a finite nonzero value lies below `tiny` (the dtype's smallest normal value):
    there it keeps fewer bits than the dtype has, or none."""
    magnitudes = values.abs()[torch.isfinite(values) & (values != 0)]
    return bool(magnitudes.numel()) and float(magnitudes.min()) < tiny


def magnitude(values: torch.Tensor, with_infinities: bool) -> float:
    """The largest |value|, infinities counted or left out; NaN never counts (0 where
    nothing does)."""
    if not values.is_floating_point():
        return float(values.abs().max()) if values.numel() else 0.0
    counted = values[~torch.isnan(values) if with_infinities else torch.isfinite(values)]
    return float(counted.abs().max()) if counted.numel() else 0.0
