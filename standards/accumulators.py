"""The fused pass's metrics (fast.py), one accumulator each, over one chunk loop.

Why so: a metric is one small class here, one field of PassSpec and one result class
(pass_results.py); the loop (`accumulate`) knows none of them. Each accumulator is made
for one thread's share of a pass (init), takes that share's chunks in order (`add`),
and hands over its totals as a frozen partial result (`finish`), which `merge`s with
the other thread's. The per-element quantities several metrics read come from
pass_plan.Chunk, computed once per chunk: asking for a metric adds its own ufuncs and
nothing else, and a pass is still one read of the data.

Exactness: every per-element quantity is metrics.Pair's float64 formula, and the totals
are added chunk by chunk, then thread by thread, in a fixed order: a pass is
deterministic, its counts and maxima equal the plain path's, its sums differ from them
only in summation order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from .chunks import CHUNK, BiasSums, chunks, dot, pow2_into
from .pass_plan import Chunk, Offend, PassSpec, Plan
from .pass_results import (
    BenchmarkSums,
    BenchSquares,
    BeyondScaled,
    BiasTotals,
    FiniteCheck,
    IdealSums,
    LegacySums,
    Partial,
    PassResult,
    RelBelow,
    ScaledSums,
    SignCounts,
    ThousandthScaled,
    ThresholdCounts,
    TopError,
    TopK,
    UlpSums,
    Worst,
)

if TYPE_CHECKING:
    from .dtypes import Array

__all__ = ["accumulate", "merge_partials"]


class Accumulator(Protocol):
    """One metric over one thread's share of a pass: made for the pass's plan and the
    share's `size` (init), fed each chunk in order (`add`), its totals handed over as a
    Partial (`finish`), whose `merge` joins the other thread's."""

    def __init__(self, plan: Plan, size: int) -> None: ...

    def add(self, chunk: Chunk) -> None: ...

    def finish(self) -> Partial: ...


class _Finiteness:
    """FiniteCheck, from an error the pass computes anyway: the max ULP error where one
    is asked (inf/NaN make it inf/NaN), else the sum of |d - b| (so may a finite overflow:
    the plain path then judges, correctly, only slower)."""

    def __init__(self, plan: Plan, size: int) -> None:
        self.source = plan.finite_source
        self.total = self.max_abs_b = 0.0

    def add(self, chunk: Chunk) -> None:
        self.max_abs_b = max(self.max_abs_b, float(chunk.abs_b.max()))
        if self.source == "own":
            self.total += chunk.own_ulp_err()[1]
        elif self.source == "scaled":
            self.total += chunk.scaled_ulp_err()[1]
        else:
            self.total += float(chunk.abs_err().sum())

    def finish(self) -> FiniteCheck:
        return FiniteCheck(self.total, self.max_abs_b)


class _BenchSquares:
    def __init__(self, plan: Plan, size: int) -> None:
        self.total = 0.0

    def add(self, chunk: Chunk) -> None:
        self.total += dot(chunk.abs_b, chunk.abs_b, chunk.buffers.product)

    def finish(self) -> BenchSquares:
        return BenchSquares(self.total)


class _RelBelow:
    def __init__(self, plan: Plan, size: int) -> None:
        self.counts = dict.fromkeys(plan.spec.rel_below, 0)

    def add(self, chunk: Chunk) -> None:
        rel_err, below = chunk.rel_err(), chunk.buffers.mask1
        for limit in self.counts:
            np.less(rel_err, limit, out=below)
            self.counts[limit] += int(np.count_nonzero(below))

    def finish(self) -> RelBelow:
        return RelBelow(self.counts)


class _Legacy:
    def __init__(self, plan: Plan, size: int) -> None:
        self.d_squares = self.b_squares = self.d_dot_b = self.max_abs_err = 0.0

    def add(self, chunk: Chunk) -> None:
        d64, product = chunk.buffers.tmp1, chunk.buffers.product
        np.copyto(d64, chunk.device, casting="safe")
        self.d_squares += dot(d64, d64, product)
        self.b_squares += dot(chunk.abs_b, chunk.abs_b, product)
        self.d_dot_b += dot(d64, chunk.bench, product)
        self.max_abs_err = max(self.max_abs_err, float(chunk.abs_err().max()))

    def finish(self) -> LegacySums:
        return LegacySums(self.d_squares, self.b_squares, self.d_dot_b, self.max_abs_err)


class _Threshold:
    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.threshold is not None
        self.rtol, _, self.atol = plan.spec.threshold
        self.n_small = self.rel_bad = self.abs_bad = 0

    def add(self, chunk: Chunk) -> None:
        small, n_small = chunk.threshold_small()
        bad = chunk.buffers.mask2
        self.n_small += n_small
        if n_small:
            np.greater(chunk.abs_err(), self.atol, out=bad)
            self.abs_bad += int(np.count_nonzero(bad & small))
            np.greater(chunk.rel_err(), self.rtol, out=bad)
            self.rel_bad += int(np.count_nonzero(bad & ~small))
        else:
            np.greater(chunk.rel_err(), self.rtol, out=bad)
            self.rel_bad += int(np.count_nonzero(bad))

    def finish(self) -> ThresholdCounts:
        return ThresholdCounts(self.n_small, self.rel_bad, self.abs_bad)


class _BeyondScaled:
    """Where the rule fails (score > 1), is |d - b| also over ulps x eps x max(|b|, floor x rms)?"""

    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.abs_scaled is not None
        self.floor, self.factor = plan.spec.abs_scaled
        self.count = 0

    def add(self, chunk: Chunk) -> None:
        buf = chunk.buffers
        failed = np.greater(chunk.threshold_score(), 1.0, out=buf.mask2)
        if failed.any():
            allowed = np.maximum(chunk.abs_b, self.floor, out=buf.tmp1)
            allowed *= self.factor
            beyond = np.greater(chunk.abs_err(), allowed, out=buf.mask3)
            self.count += int(np.count_nonzero(failed & beyond))

    def finish(self) -> BeyondScaled:
        return BeyondScaled(self.count)


def _normal_sums(
    err: Array, rel: Array, normal: Array | None, scratch: Array, product: Array
) -> tuple[float, float, float]:
    """sum(err**2), max(rel), sum(rel) over a chunk's normal elements: the 0/1 mask
    `normal` (None: all are) multiplies them into `scratch` (which may be err itself),
    cheaper than selecting."""
    if normal is not None:
        err = np.multiply(err, normal, out=scratch)
    squares = dot(err, err, product)
    if normal is not None:
        rel = np.multiply(rel, normal, out=scratch)
    return squares, float(rel.max()), float(rel.sum())


class _Benchmark:
    result: ClassVar[type[BenchmarkSums]] = BenchmarkSums

    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.benchmark is not None
        self.atol = plan.spec.benchmark[1]
        self.n_small = self.small_bad = 0
        self.squares = self.rel_max = self.rel_sum = 0.0

    def errors(self, chunk: Chunk) -> tuple[Array, Array, Array]:
        """(abs_err, rel_err, scratch for the normal sums)."""
        return chunk.abs_err(), chunk.rel_err(), chunk.buffers.tmp1

    def add(self, chunk: Chunk) -> None:
        small, normal, n_small = chunk.benchmark_small()
        abs_err, rel_err, scratch = self.errors(chunk)
        self.n_small += n_small
        if small is not None:
            bad = np.greater(abs_err, self.atol, out=chunk.buffers.mask1)
            self.small_bad += int(np.count_nonzero(np.logical_and(bad, small, out=bad)))
        if n_small == chunk.size:  # no normal element
            return
        squares, rel_max, rel_sum = _normal_sums(abs_err, rel_err, normal, scratch, chunk.buffers.product)
        self.squares += squares
        self.rel_max = max(self.rel_max, rel_max)
        self.rel_sum += rel_sum

    def finish(self) -> BenchmarkSums:
        return self.result(self.n_small, self.small_bad, self.squares, self.rel_max, self.rel_sum)


class _IdealBenchmark(_Benchmark):
    """The benchmark sums of the bench rounded to D (the ratios' floors)."""

    result: ClassVar[type[BenchmarkSums]] = IdealSums

    def errors(self, chunk: Chunk) -> tuple[Array, Array, Array]:
        abs_err, rel_err = chunk.buffers.tmp1, chunk.buffers.tmp2
        np.subtract(chunk.bench_d(), chunk.bench, out=abs_err, dtype=np.float64)
        np.abs(abs_err, out=abs_err)
        np.add(chunk.abs_b, chunk.plan.tiny, out=rel_err)
        np.divide(abs_err, rel_err, out=rel_err)
        return abs_err, rel_err, abs_err


class _ThousandthScaled:
    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.thousandth_scaled is not None
        self.rms, self.factor = plan.spec.thousandth_scaled
        self.count = 0

    def add(self, chunk: Chunk) -> None:
        buf = chunk.buffers
        allowed = np.maximum(chunk.abs_b, self.rms, out=buf.tmp1)
        allowed *= self.factor
        within = np.less(chunk.abs_err(), allowed, out=buf.mask1)
        np.logical_or(within, np.less(chunk.rel_err(), 0.001, out=buf.mask2), out=within)
        self.count += int(np.count_nonzero(within))

    def finish(self) -> ThousandthScaled:
        return ThousandthScaled(self.count)


class _Ulp:
    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.ulp_threshold is not None
        self.unit, self.over = plan.unit, plan.spec.ulp_threshold / plan.unit
        self.max = self.total = 0.0
        self.count = 0

    def add(self, chunk: Chunk) -> None:
        err, err_max = chunk.own_ulp_err()
        self.max = max(self.max, err_max)
        self.total += float(err.sum())
        self.count += int(np.count_nonzero(np.greater(err, self.over, out=chunk.buffers.mask1)))

    def finish(self) -> UlpSums:
        return UlpSums(self.max * self.unit, self.total * self.unit, self.count)


class _Scaled:
    def __init__(self, plan: Plan, size: int) -> None:
        self.unit = plan.unit
        self.max = self.total = 0.0
        self.count = 0

    def add(self, chunk: Chunk) -> None:
        err, err_max = chunk.scaled_ulp_err()
        self.max = max(self.max, err_max)
        if chunk.sampled:
            self.total += float(err.sum())
            self.count += chunk.size

    def finish(self) -> ScaledSums:
        return ScaledSums(self.max * self.unit, self.total * self.unit, self.count)


class _TopError:
    """The single-run rule's top check: the max ULP error over |b| >= q."""

    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.top is not None
        self.q, self.plan = plan.spec.top[0], plan
        self.max = 0.0

    def errors(self, chunk: Chunk) -> tuple[Array, float]:
        """Where the floors allow, the error another metric computed (fast.plan)."""
        if self.plan.top_source == "scaled":
            return chunk.scaled_ulp_err()
        if self.plan.top_source == "own":
            return chunk.own_ulp_err()
        buf = chunk.buffers
        err = np.divide(chunk.abs_err(), pow2_into(chunk.abs_b, buf.tmp1, self.plan.top_clamp), out=buf.tmp2)
        return err, float(err.max())

    def add(self, chunk: Chunk) -> None:
        err, err_max = self.errors(chunk)
        seen = self.plan.top_seen
        if err_max > max(self.max, seen[0]):  # else no top element beats it
            upper = np.greater_equal(chunk.abs_b, self.q, out=chunk.buffers.mask1)
            self.max = max(self.max, float(np.multiply(err, upper, out=chunk.buffers.tmp2).max()))  # errors are >= 0
            seen[0] = max(seen[0], self.max)

    def finish(self) -> TopError:
        return TopError(self.max * self.plan.unit)


class _Signs:
    def __init__(self, plan: Plan, size: int) -> None:
        self.scale = plan.spec.signs == "scale"
        self.up = self.down = self.outward = self.inward = 0

    def add(self, chunk: Chunk) -> None:
        buf, count = chunk.buffers, np.count_nonzero
        bench_d = chunk.bench_d()
        up = np.greater(chunk.device, bench_d, out=buf.mask1)
        down = np.less(chunk.device, bench_d, out=buf.mask2)
        n_up, n_down = int(count(up)), int(count(down))
        self.up += n_up
        self.down += n_down
        if not self.scale:
            return
        positive, both = np.greater(chunk.bench, 0, out=buf.mask3), buf.mask4
        up_pos = int(count(np.logical_and(up, positive, out=both)))
        down_pos = int(count(np.logical_and(down, positive, out=both)))
        if chunk.abs_b_min() > 0.0:  # no b == 0: b < 0 wherever not b > 0
            up_neg, down_neg = n_up - up_pos, n_down - down_pos
        else:
            negative = np.less(chunk.bench, 0, out=buf.mask3)
            up_neg = int(count(np.logical_and(up, negative, out=both)))
            down_neg = int(count(np.logical_and(down, negative, out=both)))
        self.outward += up_pos + down_neg
        self.inward += down_pos + up_neg

    def finish(self) -> SignCounts:
        return SignCounts(self.up, self.down, self.outward, self.inward)


class _Bias:
    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.bias_q is not None and plan.spec.near_zero is not None
        self.sums = BiasSums(plan.info, plan.spec.bias_q, size, plan.spec.near_zero)

    def add(self, chunk: Chunk) -> None:
        if chunk.sampled:
            self.sums.add(chunk.device, chunk.bench_d(), chunk.bench, chunk.diff, chunk.abs_b)

    def finish(self) -> BiasTotals:
        return BiasTotals(tuple(self.sums.sums))


#: each offender score's source
_SCORES: dict[Offend, Callable[[Chunk], Array]] = {
    "rel": Chunk.rel_err,
    "score": Chunk.threshold_score,
    "scaled": lambda chunk: chunk.scaled_ulp_err()[0],
    "ulp": lambda chunk: chunk.own_ulp_err()[0],
}


class _Worst:
    def __init__(self, plan: Plan, size: int) -> None:
        assert plan.spec.offend is not None
        self.score = _SCORES[plan.spec.offend]
        self.top = TopK(shared=plan.offend_seen)

    def add(self, chunk: Chunk) -> None:
        self.top.update(self.score(chunk), chunk.offset)

    def finish(self) -> Worst:
        return Worst(tuple(self.top.items))


#: every metric, in the order each chunk meets them, and whether a pass asks for it
ACCUMULATORS: tuple[tuple[type[Accumulator], Callable[[PassSpec], bool]], ...] = (
    (_Finiteness, lambda spec: True),
    (_BenchSquares, lambda spec: spec.sumsq),
    (_RelBelow, lambda spec: bool(spec.rel_below)),
    (_Legacy, lambda spec: spec.legacy),
    (_Threshold, lambda spec: spec.threshold is not None),
    (_BeyondScaled, lambda spec: spec.abs_scaled is not None),
    (_Benchmark, lambda spec: spec.benchmark is not None),
    (_IdealBenchmark, lambda spec: spec.benchmark is not None and spec.benchmark_ideal),
    (_ThousandthScaled, lambda spec: spec.thousandth_scaled is not None),
    (_Ulp, lambda spec: spec.ulp_threshold is not None),
    (_Scaled, lambda spec: spec.scaled_rms is not None),
    (_TopError, lambda spec: spec.top is not None),
    (_Signs, lambda spec: spec.signs is not None),
    (_Bias, lambda spec: spec.bias_q is not None),
    (_Worst, lambda spec: spec.offend is not None),
)


def accumulate(d: Array, b: Array, lo: int, hi: int, plan: Plan) -> list[Partial]:
    """The partial results of the asked metrics over elements [lo, hi): one thread's share."""
    with np.errstate(all="ignore"):
        chunk = Chunk(plan, d.dtype)
        metrics = [kind(plan, hi - lo) for kind, wanted in ACCUMULATORS if wanted(plan.spec)]
        for offset, device, bench in chunks(d, b, range(lo, hi, CHUNK)):
            chunk.load(offset, device, bench)
            for metric in metrics:
                metric.add(chunk)
        return [metric.finish() for metric in metrics]


def merge_partials(shares: list[list[Partial]]) -> PassResult:
    """The threads' partial results merged, in the order of their shares."""
    totals = shares[0]
    for share in shares[1:]:
        totals = [total.merge(part) for total, part in zip(totals, share, strict=True)]
    return PassResult({type(total): total for total in totals})
