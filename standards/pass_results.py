"""What a fused pass hands back: one frozen partial result per metric, which merges with
the same metric's over another share of the elements, and PassResult, which finds each
by its type.

Why by type: a metric added to accumulators.py brings its own result class here and
needs no field on PassResult; reading one the pass was not asked for raises KeyError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

import numpy as np

if TYPE_CHECKING:
    from .dtypes import Array

__all__ = ["PassResult", "Partial", "TopK"]


class Partial(Protocol):
    """One metric's totals over a share of the elements."""

    def merge(self, other: Self) -> Self: ...


P = TypeVar("P", bound=Partial)


@dataclass(frozen=True)
class FiniteCheck:
    """A sum that is finite only if every error is (each inf/NaN's sink), and the largest
    |b|: the pass judges only all-finite pairs whose bench does not overflow D."""

    total: float
    max_abs_b: float

    def merge(self, other: Self) -> Self:
        return type(self)(self.total + other.total, max(self.max_abs_b, other.max_abs_b))


@dataclass(frozen=True)
class BenchSquares:
    """sum(b**2) in float64."""

    total: float

    def merge(self, other: Self) -> Self:
        return type(self)(self.total + other.total)


@dataclass(frozen=True)
class RelBelow:
    """#(rel_err < x) for each asked x."""

    counts: Mapping[float, int]

    def merge(self, other: Self) -> Self:
        return type(self)({x: n + other.counts[x] for x, n in self.counts.items()})


@dataclass(frozen=True)
class LegacySums:
    """sum(d**2), sum(b**2), sum(d * b) (the cosine) and max |d - b|."""

    d_squares: float
    b_squares: float
    d_dot_b: float
    max_abs_err: float

    def merge(self, other: Self) -> Self:
        return type(self)(
            self.d_squares + other.d_squares,
            self.b_squares + other.b_squares,
            self.d_dot_b + other.d_dot_b,
            max(self.max_abs_err, other.max_abs_err),
        )


@dataclass(frozen=True)
class Counted:
    """One count."""

    count: int

    def merge(self, other: Self) -> Self:
        return type(self)(self.count + other.count)


class BeyondScaled(Counted):
    """#elements beyond both the absolute-threshold rule and its scaled tolerance."""


class ThousandthScaled(Counted):
    """#elements with |d - b| < ulps x eps x max(|b|, rms) or rel_err < 0.001."""


@dataclass(frozen=True)
class ThresholdCounts:
    """The absolute-threshold rule's #small elements, #normal ones with rel_err > rtol,
    #small ones with abs_err > atol."""

    n_small: int
    rel_bad: int
    abs_bad: int

    def merge(self, other: Self) -> Self:
        return type(self)(self.n_small + other.n_small, self.rel_bad + other.rel_bad, self.abs_bad + other.abs_bad)


@dataclass(frozen=True)
class BenchmarkSums:
    """The benchmark metrics' totals: #small elements, #small ones with abs_err > atol,
    and over the normal ones sum(abs_err**2), max and sum of rel_err."""

    n_small: int
    small_bad: int
    squares: float
    rel_max: float
    rel_sum: float

    def merge(self, other: Self) -> Self:
        return type(self)(
            self.n_small + other.n_small,
            self.small_bad + other.small_bad,
            self.squares + other.squares,
            max(self.rel_max, other.rel_max),
            self.rel_sum + other.rel_sum,
        )


class IdealSums(BenchmarkSums):
    """BenchmarkSums of the bench rounded to D as the device (benchmark.py's `_ideal`)."""


@dataclass(frozen=True)
class ErrorSums:
    """Max, sum and a count of an ULP error: UlpSums' count is #(> T); ScaledSums' sum and
    count are over the sampled chunks."""

    max: float
    total: float
    count: int

    def merge(self, other: Self) -> Self:
        return type(self)(max(self.max, other.max), self.total + other.total, self.count + other.count)


class UlpSums(ErrorSums):
    """The own-ULP error's."""


class ScaledSums(ErrorSums):
    """The ULP error's at max(|b|, rms)."""


@dataclass(frozen=True)
class TopError:
    """The max ULP error at max(|b|, floor x rms) over the elements with |b| >= q."""

    max: float

    def merge(self, other: Self) -> Self:
        return type(self)(max(self.max, other.max))


@dataclass(frozen=True)
class SignCounts:
    """#(d > b_D), #(d < b_D); #outward (d - b_D has the sign of b), #inward ("scale")."""

    up: int
    down: int
    outward: int
    inward: int

    def merge(self, other: Self) -> Self:
        return type(self)(
            self.up + other.up, self.down + other.down, self.outward + other.outward, self.inward + other.inward
        )


@dataclass(frozen=True)
class BiasTotals:
    """chunks.BiasSums' totals over the sampled chunks."""

    sums: tuple[float, ...]

    def merge(self, other: Self) -> Self:
        return type(self)(tuple(a + b for a, b in zip(self.sums, other.sums, strict=False)))


@dataclass(frozen=True)
class Worst:
    """The five largest (score, flat index), largest first."""

    items: tuple[tuple[float, int], ...]

    def merge(self, other: Self) -> Self:
        top = TopK()
        top.merge(self.items)
        top.merge(other.items)
        return type(self)(tuple(top.items))


@dataclass(frozen=True)
class PassResult:
    """What one pass computed: each asked metric's totals, found by their type."""

    parts: Mapping[type[Partial], Partial]

    def of(self, kind: type[P]) -> P:
        part = self.parts.get(kind)
        if not isinstance(part, kind):
            raise KeyError(f"this pass was not asked for {kind.__name__} (see PassSpec)")
        return part


class TopK:
    """The k largest positive scores seen and their flat indices.

    `shared` ([x]), shared by the threads of one pass: the k-th largest score any of them
    has kept, so a score below it can be in no thread's answer (a thread starting afresh
    would otherwise keep, and partition, nearly every element of its first chunks)."""

    def __init__(self, k: int = 5, shared: list[float] | None = None) -> None:
        self.k = k
        self.items: list[tuple[float, int]] = []
        self.shared = shared if shared is not None else [0.0]

    def thr(self) -> float:
        return self.items[-1][0] if len(self.items) >= self.k else 0.0

    def update(self, score: Array, offset: int) -> None:
        thr, floor = self.thr(), self.shared[0]
        if score.size == 0 or not (score.max() > thr and score.max() >= floor):
            return
        idx = np.flatnonzero(score > thr if floor <= thr else score >= floor)
        if idx.size > 4 * self.k:
            part = np.argpartition(score[idx], -self.k)[-self.k :]
            idx = idx[part]
        self.merge([(float(score[i]), int(i) + offset) for i in idx])
        if len(self.items) >= self.k:
            self.shared[0] = max(self.shared[0], self.items[-1][0])

    def merge(self, items: Iterable[tuple[float, int]]) -> None:
        self.items = sorted(self.items + list(items), key=lambda t: (-t[0], t[1]))[: self.k]
