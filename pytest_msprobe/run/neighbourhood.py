"""Inputs near a dumped call's: the hypothesis strategy that judge/explore.py searches.

A dump holds one training step's inputs; a kernel that is wrong only for large logits,
a large common offset, tiny or huge magnitudes, other lengths or masked rows passes
that step. A variant keeps what makes the call the same call (the API, the structure of
its arguments, every non-tensor argument, every dtype) and moves its tensors:

- values: the dumped ones, resampled from them, scaled by a power of two (up to the
  dtype's largest finite value, down into its subnormals), near the largest finite
  value, near the smallest normal one, shifted by a large common offset, with signed
  zeros, and, for tensors whose dumped values hold -inf/+inf/NaN (masks), whole rows
  of those;
- shapes: every dimension of one dumped size becomes another size (0 where the
  framework's kernels take empty tensors, 1, shorter, longer) in every tensor at once, and in the shape arguments (a torch.Size, a list of
  sizes), so tensors that had to agree still agree;
- integer and boolean tensors keep their dumped values, or are resampled from them
  where the shape changed: indexes stay within the dumped ones' range, masks stay masks.

A variant is a record of the call (the dump's, its tensors renamed) plus its tensors in
memory: decoded as any record is (dump/values.py), and, when it fails, written as a
one-call dump (dump/writer.py) that reproduces it exactly. Hypothesis shrinks toward the
dumped call: the first regime is "dumped", sizes toward 0 and 1, exponents toward 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from hypothesis import reject
from hypothesis import strategies as st

from pytest_msprobe.dump.values import TENSOR_TYPES, TensorLeaf
from pytest_msprobe.dump.writer import tensor_entry
from pytest_msprobe.errors import CallSkip

if TYPE_CHECKING:
    from hypothesis.vendor.pretty import RepresentationPrinter

    from pytest_msprobe.dump.index import Json, Record

# An explored call may grow to this many times its dumped elements (or this floor).
GROWTH, FLOOR_ELEMENTS = 4, 1 << 14


@dataclass(frozen=True)
class Variant:
    """One explored input: the records to decode and the tensors they name."""

    forward: Record
    backward: Record | None
    tensors: dict[str, torch.Tensor]
    described: dict[str, str]  # data_name -> how its values were made
    explicit: bool = False  # an explicit example (Neighbourhood.edge_variants): hypothesis does not shrink it

    def provided(self) -> dict[str, tuple[torch.Tensor, str]]:
        """What dump.values.DecodeContext takes as in-memory tensors."""
        return {name: (tensor, self.described[name]) for name, tensor in self.tensors.items()}

    def __repr__(self) -> str:  # hypothesis names examples by repr: short, no tensors
        return "Variant(" + "; ".join(self.described.values()) + ")"

    def _repr_pretty_(self, printer: RepresentationPrinter, cycle: bool) -> None:
        """hypothesis prints a dataclass field by field, not by its __repr__, and prints
        every explicit example (the edges) as it runs it: the tensors' reprs cost as much
        as judging the example did."""
        printer.text(repr(self))


@dataclass(frozen=True)
class Regime:
    """A way to move a floating tensor's values: draws its parameters, then maps the
    values (float64) to new ones, with a description."""

    name: str
    make: Callable[[st.DrawFn, np.ndarray, torch.dtype, np.random.Generator], tuple[np.ndarray, str]]


def _finite_max(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size else 0.0


def _dumped(
    draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
    return values, ""


def _scaled(
    draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
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


def _offset(
    draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
    """Plus a common offset of 2**j times the values' spread: what cancels in a variance
    or a difference. j runs to D's mantissa bits less KEPT_BITS: the values keep that
    many bits of their spread; past it the offset's rounding leaves an almost constant
    input, a different (degenerate) call."""
    spread = _spread(values)
    top = min(_mantissa_bits(dtype) - KEPT_BITS, math.floor(math.log2(torch.finfo(dtype).max / 4 / spread)))
    j = draw(st.integers(0, max(top, 0)))
    offset = (-1.0 if draw(st.booleans()) else 1.0) * spread * 2.0**j
    return values + offset, f"shifted by {offset:+.4g} (2**{j} times the spread)"


def _extreme(
    draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
    """The largest |value| at the dtype's largest finite value, less 2**-j of it."""
    largest = _finite_max(values)
    if largest == 0:
        return values, "all zero: nothing to scale"
    info = torch.finfo(dtype)
    j = draw(st.integers(1, _mantissa_bits(dtype)))
    target = info.max * (1.0 - 2.0**-j)
    return values * (
        target / largest
    ), f"scaled to max |x| = {target:.4g} (the largest {_dtype_name(dtype)} is {info.max:.4g})"


def _tiny(draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator) -> tuple[np.ndarray, str]:
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


def _zeros(draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    share = draw(st.sampled_from((0.5, 1.0, 0.125)))
    chosen = rng.random(values.shape) < share
    signs = np.where(rng.random(values.shape) < 0.5, -0.0, 0.0)
    return np.where(chosen, signs, values), f"{share:.0%} of the elements set to +0.0 or -0.0"


def _specials(
    draw: st.DrawFn, values: np.ndarray, dtype: torch.dtype, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
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
        ("dumped", _dumped),
        ("scaled", _scaled),
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
Edge = Callable[[np.ndarray, torch.dtype], tuple[np.ndarray, str]]


def _exp_threshold(dtype: torch.dtype) -> float:
    """ln of the dtype's largest value: where exp(x) overflows."""
    return math.log(torch.finfo(dtype).max)


def _to_largest(values: np.ndarray, target: float) -> np.ndarray:
    largest = _finite_max(values)
    return values * (target / largest) if largest else np.full_like(values, target)


def _logits(factor: float) -> Edge:
    """Scaled to max |x| = factor times exp's overflow threshold: a softmax's exact
    result fits at any scale; exp(x) without the row's max subtracted does not."""

    def edge(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
        target = factor * _exp_threshold(dtype)
        return _to_largest(
            values, target
        ), f"scaled to max |x| = {target:.4g} ({factor:g}x ln of the largest {_dtype_name(dtype)})"

    return edge


# Bits of their spread that the values keep at the largest offset edge: fewer than the
# draws keep (KEPT_BITS), still no constant row (four levels per spread).
EDGE_KEPT_BITS = 2


def _largest_offset(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """A common offset 2**(D's mantissa bits - EDGE_KEPT_BITS) times the values' spread:
    where a variance by moments, E[x^2] - E[x]^2, has lost every bit in every dtype.
    Its error grows as the offset squared, a correct kernel's sensitivity to the
    inputs' rounding (the judge's excuse, 16 times it) as the offset: the naive
    formula's error passes that excuse only beyond ~2**5 spreads, which the draws
    reach in float16 and float32 but not in bfloat16 (7 mantissa bits: 2**3)."""
    spread = _spread(values)
    top = max(
        min(_mantissa_bits(dtype) - EDGE_KEPT_BITS, math.floor(math.log2(torch.finfo(dtype).max / 4 / spread))), 0
    )
    return values + spread * 2.0**top, f"shifted by {spread * 2.0**top:+.4g} (2**{top} times the spread)"


def _dominant(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """One element of each row (the last dimension's first) at twice exp's overflow
    threshold: a saturated softmax row, an outlier under a normalisation."""
    if values.ndim == 0 or not values.shape[-1]:
        return values, ""
    moved = values.copy()
    moved[..., 0] = 2 * _exp_threshold(dtype)
    return moved, f"each row's first element set to {2 * _exp_threshold(dtype):.4g}"


def _equal_rows(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """Every element of a row equal to its first (a variance of exactly 0), kept masked
    where the row was."""
    if values.ndim == 0 or not values.shape[-1]:
        return values, ""
    return np.where(np.isfinite(values), values[..., :1], values), "each row's elements equal to its first"


def _subnormal_rows(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """Every other row scaled to max |x| = D's smallest normal value / 16 (the whole row
    subnormal: 1 / x overflows), the other rows as they were: rows of very different
    scales in one call."""
    if values.ndim == 0 or not values.shape[-1] or not _finite_max(values):
        return values, ""
    rows = values.reshape(-1, values.shape[-1]).copy()
    rows[::2] *= torch.finfo(dtype).smallest_normal / 16 / _finite_max(values)
    return rows.reshape(values.shape), "every other row scaled to max |x| = the smallest normal value / 16 (subnormal)"


def _masked(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
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


def _epsilon_scale(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """Scaled to max |x| = D's epsilon: where 1 + x, exp(x) and cos(x) round to 1, so that
    exp(x) - 1, log(1 + x) and 1 - cos(x) keep no bit of their result."""
    target = torch.finfo(dtype).eps
    return _to_largest(values, target), f"scaled to max |x| = {target:.4g} ({_dtype_name(dtype)}'s epsilon)"


def _left_tail(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """Every value at most -3/4 ln(1 / D's epsilon), spread by 1: exp(x) is below
    eps**(3/4), where 1 + tanh(x / 2) (a sigmoid) or 1 + erf(x / sqrt 2) (a gelu) has
    cancelled most of its bits while the result still counts as more than a small value."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return values, ""
    top = -3 / 4 * math.log(1 / torch.finfo(dtype).eps)
    return (values - finite.max()) / _spread(values) + top, f"moved to max x = {top:.4g} (spread by 1 below it)"


def _near_largest(values: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, str]:
    """Scaled to max |x| = D's largest value / 4: a sum of five overflows before a mean
    divides it, while a difference of two (x - max(x) in a softmax) still fits."""
    target = torch.finfo(dtype).max / 4
    return _to_largest(
        values, target
    ), f"scaled to max |x| = {target:.4g} (a quarter of the largest {_dtype_name(dtype)})"


EDGES: dict[str, Edge] = {
    "logits past exp's overflow": _logits(1.0625),
    "logits at twice exp's overflow": _logits(2.0),
    "largest offset": _largest_offset,
    "a dominant element per row": _dominant,
    "equal rows": _equal_rows,
    "subnormal rows": _subnormal_rows,
    "masked rows": _masked,
    "epsilon scale": _epsilon_scale,
    "left tail": _left_tail,
    "a quarter of the largest value": _near_largest,
}


def _mantissa_bits(dtype: torch.dtype) -> int:
    return -math.frexp(torch.finfo(dtype).eps)[1] + 1


def _spread(values: np.ndarray) -> float:
    """The finite values' standard deviation, else their largest |value|, else 1."""
    finite = values[np.isfinite(values)]
    return (float(finite.std()) if finite.size > 1 else 0.0) or _finite_max(values) or 1.0


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Neighbourhood:
    """The variants of one call: built from its records and its decoded dumped inputs
    (their leaves, in the order decoding found them)."""

    def __init__(  # noqa: PLR0913  the space's fields, with defaults
        self,
        forward: Record,
        backward: Record | None,
        leaves: list[TensorLeaf],
        max_elements: int,
        resizable: bool = True,
        smallest_size: int = 0,
    ) -> None:
        self.forward, self.backward, self.leaves = forward, backward, leaves
        found = _count_tensors(self._recorded())
        if found != len(leaves):
            raise CallSkip(f"cannot explore: the records hold {found} tensors, decoding found {len(leaves)}")
        self.sizes = sorted({size for leaf in leaves for size in leaf.tensor.shape if size > 1}) if resizable else []
        self.smallest_size = smallest_size  # 0 where the framework's kernels take empty tensors
        dumped = sum(leaf.tensor.numel() for leaf in leaves)
        self.max_elements = min(max_elements, max(GROWTH * dumped, FLOOR_ELEMENTS))
        floats = [leaf for leaf in leaves if leaf.tensor.is_floating_point()]
        has_specials = any(not torch.isfinite(leaf.tensor).all() for leaf in floats)
        self.regimes = tuple(regime for regime in REGIMES if regime.name != "specials" or has_specials)
        self.edged = next((position for position, leaf in enumerate(leaves) if leaf.tensor.is_floating_point()), None)

    def _recorded(self) -> list[Json]:
        recorded: list[Json] = [self.forward.get("input_args", []), self.forward.get("input_kwargs", {})]
        return recorded + ([self.backward.get("input", [])] if self.backward is not None else [])

    def variants(self) -> st.SearchStrategy[Variant]:
        return st.composite(self._draw)()

    def _draw(self, draw: st.DrawFn) -> Variant:
        sizes = self._draw_sizes(draw)
        seed = draw(st.integers(0, 2**16 - 1))
        shared = draw(st.sampled_from(self.regimes))
        separate = draw(st.booleans())
        tensors: dict[str, torch.Tensor] = {}
        described: dict[str, str] = {}
        for position, leaf in enumerate(self.leaves):
            shape = tuple(sizes.get(size, size) for size in leaf.tensor.shape)
            rng = np.random.default_rng([seed, position])
            regime = draw(st.sampled_from(self.regimes)) if separate else shared
            tensor, how = _leaf_values(draw, leaf, shape, seed, regime, rng)
            name = f"explore.{position}.pt"
            tensors[name], described[name] = tensor, f"{leaf.path}: {_dtype_name(tensor.dtype)} {list(shape)}, {how}"
        total = sum(tensor.numel() for tensor in tensors.values())
        if total > self.max_elements:
            reject()  # larger than exploring this call may make it
        return self._variant(tensors, described, sizes)

    def edge_variants(self) -> list[Variant]:
        """The dumped call with its first floating tensor at each edge (EDGES), the other
        tensors and every shape as dumped: hypothesis's explicit examples, run first.
        Each is the smallest variant at its edge (hypothesis shrinks toward the dumped
        shapes and values), so one that fails is already minimal."""
        if self.edged is None:
            return []
        masked = not bool(torch.isfinite(self.leaves[self.edged].tensor).all())
        # a mask only where the dumped tensor holds one: -inf means nothing to a matmul
        edges = [edge for edge in EDGES if edge != "masked rows" or masked]
        return [self._moved({self.edged: _edged(self.leaves[self.edged], edge)}) for edge in edges]

    def near_variants(self) -> list[Variant]:
        """The dumped call with its second floating tensor moved near its first (of the
        same shape): x2 = x1 + 2**-k spread(x1) z, z a fixed standard normal draw, for k =
        half D's mantissa bits and all of them. The angle between them is then about
        sqrt(eps) or eps, where 1 - cos(x1, x2) is ~eps or ~eps**2: computed as 1 - cos
        in D it keeps no bit. Explicit examples, as the edges are (none where the call
        has no such pair)."""
        floats = [position for position, leaf in enumerate(self.leaves) if leaf.tensor.is_floating_point()]
        if len(floats) < 2 or self.leaves[floats[0]].tensor.shape != self.leaves[floats[1]].tensor.shape:
            return []
        first, second = (self.leaves[position] for position in floats[:2])
        values = first.tensor.double().numpy()
        noise = np.random.default_rng(0).standard_normal(values.shape) * _spread(values)
        bits = _mantissa_bits(first.tensor.dtype)
        variants = []
        for k in (bits // 2, bits):
            near = _tensor(values + noise * 2.0**-k, tuple(values.shape), second.tensor.dtype)
            how = f"as dumped, at the edge 'small angles': the first argument plus 2**-{k} of its spread times a normal draw"
            variants.append(self._moved({floats[1]: (near, how)}))
        return variants

    def _moved(self, moved: dict[int, tuple[torch.Tensor, str]]) -> Variant:
        """The dumped call with the leaves at `moved`'s positions replaced: an explicit example."""
        tensors, described = {}, {}
        for position, leaf in enumerate(self.leaves):
            name = f"explore.{position}.pt"
            tensor, how = moved.get(position, (leaf.tensor, "as dumped"))
            tensors[name], described[name] = (
                tensor,
                f"{leaf.path}: {_dtype_name(tensor.dtype)} {list(tensor.shape)}, {how}",
            )
        return self._variant(tensors, described, {}, explicit=True)

    def _variant(
        self, tensors: dict[str, torch.Tensor], described: dict[str, str], sizes: dict[int, int], explicit: bool = False
    ) -> Variant:
        """The records of the call with `tensors` in place of its own, in decoding order."""
        rename = iter(tensors)

        def replace(value: Record) -> Record:
            name = next(rename)
            return tensor_entry(
                tensors[name], name, kind=value["type"], requires_grad=bool(value.get("requires_grad", False))
            )

        forward = {
            **self.forward,
            "input_args": _mapped(self.forward.get("input_args", []), replace, sizes),
            "input_kwargs": _mapped(self.forward.get("input_kwargs", {}), replace, sizes),
        }
        backward = None
        if self.backward is not None:
            backward = {**self.backward, "input": _mapped(self.backward.get("input", []), replace, sizes)}
        return Variant(forward, backward, tensors, described, explicit)

    def _draw_sizes(self, draw: st.DrawFn) -> dict[int, int]:
        """Dumped size -> its size in this variant (every dimension of that size)."""
        if not self.sizes or not draw(st.booleans()):
            return {}
        return {size: draw(st.integers(self.smallest_size, 2 * size)) for size in self.sizes}


def _leaf_values(  # noqa: PLR0913  hypothesis' draw, the leaf and the variant's regime, seed and rng; each read
    draw: st.DrawFn, leaf: TensorLeaf, shape: tuple[int, ...], seed: int, regime: Regime, rng: np.random.Generator
) -> tuple[torch.Tensor, str]:
    """The leaf's tensor in this variant: the dumped one where nothing moves it."""
    dumped = leaf.tensor
    same = shape == tuple(dumped.shape) and seed == 0
    floating = dumped.is_floating_point()
    if same and (regime.name == "dumped" or not floating):
        return dumped, "as dumped"
    source = "as dumped" if same else f"resampled from the dumped values (seed {seed})"
    if not floating:
        return _tensor(_resampled(dumped.numpy(), shape, rng), shape, dumped.dtype), source
    wide = dumped.double().numpy()
    moved, how = regime.make(draw, wide if same else _resampled(wide, shape, rng), dumped.dtype, rng)
    return _tensor(moved, shape, dumped.dtype), ", ".join(filter(None, (source, how)))


def _edged(leaf: TensorLeaf, edge: str) -> tuple[torch.Tensor, str]:
    """The leaf's floating tensor moved to an edge (EDGES)."""
    dumped = leaf.tensor
    moved, how = EDGES[edge](dumped.double().numpy(), dumped.dtype)
    return _tensor(
        moved, tuple(dumped.shape), dumped.dtype
    ), f"as dumped, at the edge {edge!r}: {how or 'nothing to move'}"


def _tensor(values: Json, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """numpy values (a 0-d result may be a numpy scalar) as a tensor of `shape`."""
    return torch.from_numpy(np.array(values).reshape(shape)).to(dtype)


def _resampled(values: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Elements drawn with replacement from the dumped ones (zeros if it had none)."""
    flat = values.reshape(-1)
    if not flat.size:
        return np.zeros(shape, dtype=values.dtype)
    return flat[rng.integers(0, flat.size, size=shape)] if math.prod(shape) else np.zeros(shape, dtype=values.dtype)


def _count_tensors(value: Json) -> int:
    if isinstance(value, list):
        return sum(_count_tensors(item) for item in value)
    if isinstance(value, dict):
        return 1 if value.get("type") in TENSOR_TYPES else sum(_count_tensors(item) for item in value.values())
    return 0


def _mapped(value: Json, replace: Callable[[Record], Record], sizes: dict[int, int]) -> Json:
    """The recorded value with its tensors replaced (in decoding order) and its shape
    arguments resized."""
    if isinstance(value, list):
        if sizes and value and all(_is_int(item) for item in value):
            return [{**item, "value": sizes.get(item["value"], item["value"])} for item in value]
        return [_mapped(item, replace, sizes) for item in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if kind in TENSOR_TYPES:
        return replace(value)
    if kind == "torch.Size" and isinstance(value.get("value"), list):
        return {**value, "value": [sizes.get(size, size) for size in value["value"]]}
    if kind is None:
        return {key: _mapped(item, replace, sizes) for key, item in value.items()}
    return value


def _is_int(item: object) -> bool:
    return isinstance(item, dict) and item.get("type") == "int" and isinstance(item.get("value"), int)
