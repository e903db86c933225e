"""What a fused pass computes (PassSpec), the constants its chunks need (Plan), and one
chunk's quantities that several metrics read (Chunk).

Why a Chunk: |d - b|, rel_err, the ULP errors, the bench rounded to D and the small
elements are each read by several metrics (accumulators.py); each is computed once per
chunk, on first use, into a buffer of its own reused by every chunk of the thread, so a
metric costs its own ufuncs and nothing else, and no metric depends on another's order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import numpy as np

from .chunks import CHUNK, bench_in_d, d_buffer_dtype, diff_into, pow2_into

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from .dtypes import Array, DtypeInfo

__all__ = ["PassSpec", "Plan", "Chunk", "Offend", "TopSource"]

#: the scores the five worst elements are found by
Offend = Literal["rel", "score", "scaled", "ulp"]
#: which error the top check maximises (fast.plan)
TopSource = Literal["scaled", "own", "separate"]


@dataclass(frozen=True, slots=True)
class PassSpec:
    """What one fused pass computes; a field left at its default is not computed."""

    rel_below: tuple[float, ...] = ()  # RelBelow: #(rel_err < x) for each x
    threshold: tuple[float, float, float] | None = None  # (rtol, small, atol): ThresholdCounts
    abs_scaled: tuple[float, float] | None = None  # (floor x rms, ulps x eps), with threshold: BeyondScaled
    benchmark: tuple[float, float] | None = None  # (small, atol): BenchmarkSums
    benchmark_ideal: bool = False  # with benchmark: IdealSums, the same of the bench rounded to D
    ulp_threshold: float | None = None  # T: UlpSums, max/sum/#(> T) of the own-ULP error
    signs: Literal["balance", "scale"] | None = (
        None  # SignCounts: #(d > b_D), #(d < b_D); "scale": also outward, inward
    )
    scaled_rms: float | None = None  # rms: ScaledSums, the ULP error at max(|b|, rms)
    top: tuple[float, float] | None = None  # (q, floor x rms): TopError, the max ULP error over |b| >= q
    thousandth_scaled: tuple[float, float] | None = None  # (rms, ulps x eps): ThousandthScaled
    legacy: bool = False  # LegacySums: the cosine's sums and max_abs_err
    offend: Offend | None = None  # Worst: the five worst elements by this score
    sample: int = 1  # sums of the statistics (ScaledSums', BiasTotals) over every sample-th chunk
    bias_q: float | None = None  # q: BiasTotals over the sampled chunks
    near_zero: tuple[float, float] | None = None  # with bias_q: (small, small_atol) (near_zero.py)
    sumsq: bool = False  # BenchSquares: sum of b**2 (fast.run_with_rms)

    def __post_init__(self) -> None:
        """Refuse a metric whose input metric is not asked for (it would read nothing)."""
        lacking = {
            "abs_scaled needs threshold": self.abs_scaled is not None and self.threshold is None,
            "benchmark_ideal needs benchmark": self.benchmark_ideal and self.benchmark is None,
            "bias_q needs near_zero": self.bias_q is not None and self.near_zero is None,
            "offend='score' needs threshold": self.offend == "score" and self.threshold is None,
            "offend='scaled' needs scaled_rms": self.offend == "scaled" and self.scaled_rms is None,
        }
        if any(lacking.values()):
            raise ValueError("PassSpec: " + "; ".join(what for what, missing in lacking.items() if missing))


@dataclass(frozen=True)
class Plan:
    """A pass's spec and the constants its chunks need, derived once (fast.plan). ULP
    errors are computed in units of 2**-m ULP (chunks.pow2_into): each clamp is a ULP
    floor times `unit` = 2**m."""

    spec: PassSpec
    info: DtypeInfo
    tiny: float
    unit: float
    own_clamp: float  # the own ULP's: D's smallest
    scaled_clamp: float  # ScaledSums': ulp(rms) (unused without scaled_rms)
    top_clamp: float  # TopError's: ulp(floor x rms) (unused without top)
    top_source: TopSource
    finite_source: Literal["own", "scaled", "abs_err"]  # FiniteCheck's sink of inf/NaN
    top_seen: list[float]  # the largest TopError any thread has found: a chunk
    # whose largest error is below it cannot change it
    offend_seen: list[float]  # Top's bound, shared by the threads


class Chunk:
    """One chunk of (device, bench) and the quantities the metrics share, each computed
    on first use into a buffer of its own (reused by every chunk of the thread).
    `tmp1`, `tmp2`, `product` and `mask1..4` are scratch: an accumulator's own, within
    one `add`."""

    def __init__(self, plan: Plan, d_dtype: DTypeLike) -> None:
        self.plan = plan
        self.buffers = _Buffers.allocate(d_buffer_dtype(d_dtype, plan.info))
        self.offset = self.size = 0
        self.sampled = False
        self.device = self.bench = self.diff = self.abs_b = self.buffers.diff  # until the first load
        self._forget()

    def load(self, offset: int, device: Array, bench: Array) -> None:
        """The next chunk: d - b and |b| (in float64), which every metric reads."""
        if device.size != self.buffers.diff.size:  # the last chunk, shorter
            self.buffers = self.buffers.fit(device.size)
        buf = self.buffers
        self.offset, self.size, self.device, self.bench = offset, device.size, device, bench
        self.sampled = (offset // CHUNK) % self.plan.spec.sample == 0
        self.diff, self.abs_b = buf.diff, np.abs(diff_into(device, bench, buf.diff, buf.abs_b), out=buf.abs_b)
        self._forget()

    def _forget(self) -> None:
        """The shared quantities of the chunk before: none is computed yet."""
        self._abs_err: Array | None = None
        self._rel_err: Array | None = None
        self._own: tuple[Array, float] | None = None
        self._scaled: tuple[Array, float] | None = None
        self._score: Array | None = None
        self._bench_d: Array | None = None
        self._abs_b_min: float | None = None
        self._threshold_small: tuple[Array, int] | None = None
        self._benchmark_small: tuple[Array | None, Array | None, int] | None = None

    def abs_err(self) -> Array:
        if self._abs_err is None:
            self._abs_err = np.abs(self.diff, out=self.buffers.abs_err)
        return self._abs_err

    def rel_err(self) -> Array:
        if self._rel_err is None:
            abs_err = self.abs_err()
            np.add(self.abs_b, self.plan.tiny, out=self.buffers.quantity_tmp)
            self._rel_err = np.divide(abs_err, self.buffers.quantity_tmp, out=self.buffers.rel_err)
        return self._rel_err

    def abs_b_min(self) -> float:
        if self._abs_b_min is None:
            self._abs_b_min = float(self.abs_b.min())
        return self._abs_b_min

    def bench_d(self) -> Array:
        """The bench rounded to D, in D's numpy dtype."""
        if self._bench_d is None:
            self._bench_d = bench_in_d(self.bench, self.plan.info, self.buffers.bench_d)
        return self._bench_d

    def own_ulp_err(self) -> tuple[Array, float]:
        """|d - b| in units of 2**-m ULP of D at |b|, and its maximum."""
        if self._own is None:
            scale = pow2_into(self.abs_b, self.buffers.quantity_tmp, self.plan.own_clamp)
            err = np.divide(self.diff, scale, out=self.buffers.own_ulp_err)
            np.abs(err, out=err)
            self._own = err, float(err.max())
        return self._own

    def scaled_ulp_err(self) -> tuple[Array, float]:
        """|d - b| in units of 2**-m ULP of D at max(|b|, rms), and its maximum."""
        if self._scaled is None:
            abs_err = self.abs_err()
            scale = pow2_into(self.abs_b, self.buffers.quantity_tmp, self.plan.scaled_clamp)
            err = np.divide(abs_err, scale, out=self.buffers.scaled_ulp_err)
            self._scaled = err, float(err.max())
        return self._scaled

    def threshold_small(self) -> tuple[Array, int]:
        """The absolute-threshold rule's small elements (|b| <= small) and their count."""
        if self._threshold_small is None:
            assert self.plan.spec.threshold is not None
            mask = np.less_equal(self.abs_b, self.plan.spec.threshold[1], out=self.buffers.threshold_small)
            self._threshold_small = mask, int(np.count_nonzero(mask))
        return self._threshold_small

    def threshold_score(self) -> Array:
        """rel_err / rtol, abs_err / atol at the small elements: > 1 fails the rule."""
        if self._score is None:
            assert self.plan.spec.threshold is not None
            rtol, _, atol = self.plan.spec.threshold
            small, n_small = self.threshold_small()
            abs_err, rel_err = self.abs_err(), self.rel_err()
            score = np.divide(rel_err, rtol, out=self.buffers.score)
            if n_small:
                np.copyto(score, np.divide(abs_err, atol, out=self.buffers.quantity_tmp), where=small)
            self._score = score
        return self._score

    def benchmark_small(self) -> tuple[Array | None, Array | None, int]:
        """The benchmark standard's small elements, the normal ones (both None where none
        is small: the min, a reduction, is cheaper than a mask and its count), #small."""
        if self._benchmark_small is None:
            assert self.plan.spec.benchmark is not None
            small = self.plan.spec.benchmark[0]
            found: tuple[Array | None, Array | None, int] = (None, None, 0)
            if self.abs_b_min() <= small:
                mask = np.less_equal(self.abs_b, small, out=self.buffers.benchmark_small)
                n_small = int(np.count_nonzero(mask))
                if n_small:
                    found = mask, np.logical_not(mask, out=self.buffers.benchmark_normal), n_small
            self._benchmark_small = found
        return self._benchmark_small


@dataclass(frozen=True)
class _Buffers:
    """A thread's arrays of CHUNK elements (np.empty: a buffer no metric writes costs no
    memory traffic)."""

    diff: Array
    abs_b: Array
    abs_err: Array
    rel_err: Array
    own_ulp_err: Array
    scaled_ulp_err: Array
    score: Array
    quantity_tmp: Array  # the quantities' own scratch
    tmp1: Array
    tmp2: Array
    product: Array  # dot's
    bench_d: Array
    threshold_small: Array
    benchmark_small: Array
    benchmark_normal: Array
    mask1: Array
    mask2: Array
    mask3: Array
    mask4: Array

    @classmethod
    def allocate(cls, d_dtype: DTypeLike) -> _Buffers:
        dtypes: dict[str, DTypeLike] = {
            "bench_d": d_dtype,
            "threshold_small": bool,
            "benchmark_small": bool,
            "benchmark_normal": bool,
        }
        dtypes |= {f"mask{i}": bool for i in range(1, 5)}
        return cls(**{f.name: np.empty(CHUNK, dtypes.get(f.name, np.float64)) for f in fields(cls)})

    def fit(self, size: int) -> _Buffers:
        return type(self)(**{f.name: getattr(self, f.name)[:size] for f in fields(self)})
