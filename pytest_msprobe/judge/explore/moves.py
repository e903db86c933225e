"""How exploration moves a floating tensor's values (judge/explore/neighbourhood.py builds the
variants from them): REGIMES, one of which hypothesis draws for every tensor of a
generated example, and EDGES, the extremes where naive kernels break, tried first on the
dumped call's first floating tensor as explicit examples. Each maps the values (float64)
to new ones, with a description; none changes a shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from pytest_msprobe.standards.dtypes import Array

# --- regimes: one drawn per tensor of a generated example ---------------------------


@dataclass(frozen=True)
class Regime:
    """A way to move a floating tensor's values: draws its parameters, then maps the
    values (float64) to new ones, with a description."""

    name: str
    make: Callable[[st.DrawFn, Array, torch.dtype, np.random.Generator], tuple[Array, str]]


def _finite_max(values: Array) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size else 0.0


def _keep_dumped(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    return values, ""


def _scale(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    """Times 2**k: k as large as the dtype's range allows, or as small (subnormals)."""
    largest = _finite_max(values)
    if largest == 0:
        return values, "all zero: nothing to scale"
    info = torch.finfo(dtype)
    top = math.floor(math.log2(info.max / largest)) - 1
    bottom = math.floor(math.log2(info.smallest_normal * info.eps / largest)) + 1
    k = draw(st.integers(min(bottom, 0), max(top, 0)))
    return values * 2.0**k, f"scaled by 2**{k}" if k else ""


KEPT_BITS = 4  # bits of their spread that offset values keep


def _offset(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    """Plus a common offset of 2**j times the values' spread: what cancels in a variance
    or a difference. j runs to D's mantissa bits less KEPT_BITS: the values keep that
    many bits of their spread; past it the offset's rounding leaves an almost constant
    input, a different (degenerate) call."""
    spread = spread_of(values)
    top = min(mantissa_bits(dtype) - KEPT_BITS, math.floor(math.log2(torch.finfo(dtype).max / 4 / spread)))
    j = draw(st.integers(0, max(top, 0)))
    offset = (-1.0 if draw(st.booleans()) else 1.0) * spread * 2.0**j
    return values + offset, f"shifted by {offset:+.4g} (2**{j} times the spread)"


def _extreme(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    """The largest |value| at the dtype's largest finite value, less 2**-j of it."""
    largest = _finite_max(values)
    if largest == 0:
        return values, "all zero: nothing to scale"
    info = torch.finfo(dtype)
    j = draw(st.integers(1, mantissa_bits(dtype)))
    target = info.max * (1.0 - 2.0**-j)
    return values * (
        target / largest
    ), f"scaled to max |x| = {target:.4g} (the largest {dtype_name(dtype)} is {info.max:.4g})"


def _tiny(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    """The largest |value| near the smallest normal one: the rest subnormal or zero."""
    largest = _finite_max(values)
    if largest == 0:
        return values, "all zero: nothing to scale"
    info = torch.finfo(dtype)
    j = draw(st.integers(-4, 8))
    target = info.smallest_normal * 2.0**j
    return values * (
        target / largest
    ), f"scaled to max |x| = {target:.4g} (subnormals below {info.smallest_normal:.4g})"


def _zeros(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    share = draw(st.sampled_from((0.5, 1.0, 0.125)))
    chosen = rng.random(values.shape) < share
    signs = np.where(rng.random(values.shape) < 0.5, -0.0, 0.0)
    return np.where(chosen, signs, values), f"{share:.0%} of the elements set to +0.0 or -0.0"


def _specials(draw: st.DrawFn, values: Array, dtype: torch.dtype, rng: np.random.Generator) -> tuple[Array, str]:
    """Whole rows (of the last dimension) set to the non-finite value the dumped tensor
    holds: an all-masked row of an attention mask."""
    special = values[~np.isfinite(values)]
    if not special.size or values.ndim == 0 or not values.shape[-1]:
        return values, ""
    rows = values.reshape(-1, values.shape[-1]).copy()
    count = draw(st.integers(1, rows.shape[0]))
    rows[rng.choice(rows.shape[0], size=count, replace=False)] = special[0]
    return rows.reshape(values.shape), f"{count} of {rows.shape[0]} rows set to {special[0]}"


REGIMES = tuple(
    Regime(name, make)
    for name, make in (
        ("dumped", _keep_dumped),
        ("scaled", _scale),
        ("offset", _offset),
        ("extreme", _extreme),
        ("tiny", _tiny),
        ("zeros", _zeros),
        ("specials", _specials),
    )
)


# --- edges: the extremes explored first --------------------------------------------
#
# An edge moves the call's first floating tensor (the data a kernel computes on: the
# logits, the normalised x) to one extreme where naive kernels break. Every edge is
# tried first, at the dumped shapes with the other tensors as dumped: hypothesis's
# explicit examples (Neighbourhood.edge_variants); the generated examples then move
# every tensor by the regimes above. Each maps the values (float64) to new ones, with
# a description.
Edge = Callable[[Array, torch.dtype], tuple[Array, str]]


def _exp_threshold(dtype: torch.dtype) -> float:
    """ln of the dtype's largest value: where exp(x) overflows."""
    return math.log(torch.finfo(dtype).max)


def _to_largest(values: Array, target: float) -> Array:
    largest = _finite_max(values)
    return values * (target / largest) if largest else np.full_like(values, target)


def _logits(factor: float) -> Edge:
    """Scaled to max |x| = factor times exp's overflow threshold: a softmax's exact
    result fits at any scale; exp(x) without the row's max subtracted does not."""

    def edge(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
        target = factor * _exp_threshold(dtype)
        return _to_largest(
            values, target
        ), f"scaled to max |x| = {target:.4g} ({factor:g}x ln of the largest {dtype_name(dtype)})"

    return edge


# Bits of their spread that the values keep at the largest offset edge: fewer than the
# draws keep (KEPT_BITS), still no constant row (four levels per spread).
EDGE_KEPT_BITS = 2


def _largest_offset(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """A common offset 2**(D's mantissa bits - EDGE_KEPT_BITS) times the values' spread:
    where a variance by moments, E[x^2] - E[x]^2, has lost every bit in every dtype.
    Its error grows as the offset squared, a correct kernel's sensitivity to the
    inputs' rounding (the judge's excuse, 16 times it) as the offset: the naive
    formula's error passes that excuse only beyond ~2**5 spreads, which the draws
    reach in float16 and float32 but not in bfloat16 (7 mantissa bits: 2**3)."""
    spread = spread_of(values)
    top = max(min(mantissa_bits(dtype) - EDGE_KEPT_BITS, math.floor(math.log2(torch.finfo(dtype).max / 4 / spread))), 0)
    return values + spread * 2.0**top, f"shifted by {spread * 2.0**top:+.4g} (2**{top} times the spread)"


def _dominant(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """One element of each row (the last dimension's first) at twice exp's overflow
    threshold: a saturated softmax row, an outlier under a normalisation."""
    if values.ndim == 0 or not values.shape[-1]:
        return values, ""
    moved = values.copy()
    moved[..., 0] = 2 * _exp_threshold(dtype)
    return moved, f"each row's first element set to {2 * _exp_threshold(dtype):.4g}"


def _equal_rows(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """Every element of a row equal to its first (a variance of exactly 0), kept masked
    where the row was."""
    if values.ndim == 0 or not values.shape[-1]:
        return values, ""
    return np.where(np.isfinite(values), values[..., :1], values), "each row's elements equal to its first"


def _subnormal_rows(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """Every other row scaled to max |x| = D's smallest normal value / 16 (the whole row
    subnormal: 1 / x overflows), the other rows as they were: rows of very different
    scales in one call."""
    if values.ndim == 0 or not values.shape[-1] or not _finite_max(values):
        return values, ""
    rows = values.reshape(-1, values.shape[-1]).copy()
    rows[::2] *= torch.finfo(dtype).smallest_normal / 16 / _finite_max(values)
    return rows.reshape(values.shape), "every other row scaled to max |x| = the smallest normal value / 16 (subnormal)"


def _mask_causally(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """A causal mask (-inf above the diagonal of the last two dimensions) over logits at
    twice exp's overflow threshold: masked attention scores."""
    if values.ndim < 2:
        return values, ""
    scaled, _ = _logits(2.0)(values, dtype)
    rows, columns = values.shape[-2:]
    future = np.triu(np.ones((rows, columns), dtype=bool), 1)
    return np.where(
        future, -np.inf, scaled
    ), f"-inf above the diagonal (a causal mask), the rest scaled to max |x| = {2 * _exp_threshold(dtype):.4g}"


def _epsilon_scale(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """Scaled to max |x| = D's epsilon: where 1 + x, exp(x) and cos(x) round to 1, so that
    exp(x) - 1, log(1 + x) and 1 - cos(x) keep no bit of their result."""
    target = torch.finfo(dtype).eps
    return _to_largest(values, target), f"scaled to max |x| = {target:.4g} ({dtype_name(dtype)}'s epsilon)"


def _left_tail(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """Every value at most -3/4 ln(1 / D's epsilon), spread by 1: exp(x) is below
    eps**(3/4), where 1 + tanh(x / 2) (a sigmoid) or 1 + erf(x / sqrt 2) (a gelu) has
    cancelled most of its bits while the result still counts as more than a small value."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return values, ""
    top = -3 / 4 * math.log(1 / torch.finfo(dtype).eps)
    return (values - finite.max()) / spread_of(values) + top, f"moved to max x = {top:.4g} (spread by 1 below it)"


def _near_largest(values: Array, dtype: torch.dtype) -> tuple[Array, str]:
    """Scaled to max |x| = D's largest value / 4: a sum of five overflows before a mean
    divides it, while a difference of two (x - max(x) in a softmax) still fits."""
    target = torch.finfo(dtype).max / 4
    return _to_largest(
        values, target
    ), f"scaled to max |x| = {target:.4g} (a quarter of the largest {dtype_name(dtype)})"


EDGES: dict[str, Edge] = {
    "logits past exp's overflow": _logits(1.0625),
    "logits at twice exp's overflow": _logits(2.0),
    "largest offset": _largest_offset,
    "a dominant element per row": _dominant,
    "equal rows": _equal_rows,
    "subnormal rows": _subnormal_rows,
    "masked rows": _mask_causally,
    "epsilon scale": _epsilon_scale,
    "left tail": _left_tail,
    "a quarter of the largest value": _near_largest,
}


def mantissa_bits(dtype: torch.dtype) -> int:
    return -math.frexp(torch.finfo(dtype).eps)[1] + 1


def spread_of(values: Array) -> float:
    """The finite values' standard deviation, else their largest |value|, else 1."""
    finite = values[np.isfinite(values)]
    return (float(finite.std()) if finite.size > 1 else 0.0) or _finite_max(values) or 1.0


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
