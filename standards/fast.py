"""The fused, chunked path of the shipped standards for large, all-finite outputs.

Why: judging a 2**24-element output the plain way (metrics.Pair) makes float64 copies
of both sides, the bench rounded to D, and a dozen full-size temporaries (abs_err,
rel_err, masks, ULPs), each a pass over memory that also pays first-touch page faults.
Here every quantity a standard needs is computed in ONE pass over cache-sized chunks
(chunks.py), in two threads, and only sums, counts and maxima leave the chunk loop:
`run(pair, PassSpec(...))` asks for the metrics a standard needs (one accumulator each,
accumulators.py) and returns their totals (pass_results.py).
The single-run rule's statistical sums are taken on its sampled chunks only
(single_run.py, 4.), and its RMS is guessed and checked in the same pass
(`run_with_rms`). The five worst elements are found by a second pass (`worst`) only for a
verdict that is not a pass, where a message shows them; likewise the extra checks a
verdict needs only past a limit (ulp's top-decile check, thousandth's scaled share).
No float64 copy of the device output, no boolean-index copies, no full sort. Passes
other than this one, for one standard each, are in scans.py.

Exactness: every per-element quantity is computed by the same float64 formula as in
metrics.Pair (d - b, |b| + tiny, the ULP of D from the exponent bits, comparisons of d
with the bench rounded to D in D), so counts, maxima and verdicts are identical; sums
and means differ only in summation order (a few units of 1e-16 relative).

When: a floating output with n >= FAST_MIN_N, D in float64/float32/float16/bfloat16,
with or without a reference. With one, benchmark and ulp take the device's spec metrics
from one pass (benchmark also the floors' -- the bench rounded to D, `benchmark_ideal` --
in the same pass); a baseline's metrics are read as recorded, a reference output's
computed by a second pass over (bench, reference), or by metrics.Pair when that pass
declines; the ratio judgement is the plain path's code. The others' reference mode only
names the verdict's kind. The pass also checks that every element is
finite (and the bench does not overflow D); otherwise it gives up (`None`) and the
standard takes the plain path, which handles inf/NaN agreement. The plain path is kept
for small outputs (no fixed overhead for the plugin's usual tiny tensors) and is the
reference the fast path is tested against (tests/standards/test_fast_path.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .accumulators import accumulate, merge_partials
from .chunks import CHUNK, in_halves, raw
from .dtypes import Array, DtypeInfo
from .pass_plan import PassSpec, Plan, TopSource
from .pass_results import BenchSquares, FiniteCheck, PassResult, Worst

if TYPE_CHECKING:
    from .metrics import Pair
    from .reference import Reference
    from .verdict import Offender

__all__ = ["FAST_MIN_N", "CHUNK", "PassSpec", "PassResult", "run", "raw_views", "fast_ok"]

#: outputs smaller than this take the plain path (tests lower it to exercise this one)
FAST_MIN_N = 1 << 16
#: the quantile of |b| is estimated on at most this many evenly strided elements
#: (both paths: single_run.py reads it here)
QUANTILE_SAMPLE = 2**16
#: the rel_err limits of the legacy shares (legacy.py), counted by a pass that fuses them
LEGACY_REL_LIMITS = (0.01, 0.001, 0.0001)
_FAST_DTYPES = ("float64", "float32", "float16", "bfloat16")


def raw_views(pair: Pair) -> tuple[Array, Array]:
    """(device, bench) flat numpy arrays in their own dtypes, cached on the pair."""
    return pair.memoise("fast_raw", lambda: (raw(pair.device_src), raw(pair.bench_src)))


def fast_ok(pair: Pair, reference: Reference | None = None) -> bool:
    """May this pair take the fused path? The shipped standards ask without their
    reference (all have a fused reference mode); passing one keeps the old answer, no.
    A pair with terms (a conditioned re-judgement, only of calls the cheap rule failed)
    takes the plain path."""
    if reference is not None or pair.exact is not None or pair.n < FAST_MIN_N or pair.terms_src is not None:
        return False
    if pair.info.name not in _FAST_DTYPES or pair.device_src is None:
        return False
    return pair.device_dtype in _FAST_DTYPES and pair.bench_dtype in _FAST_DTYPES


def _ulp_scalar(x: float, info: DtypeInfo) -> float:
    """ULP of D at |x| (metrics.ulp_of for one value)."""
    from .metrics import ulp_of

    return float(ulp_of(np.array([abs(float(x))]), info)[0])


def plan(spec: PassSpec, info: DtypeInfo, tiny: float) -> Plan:
    """The pass's constants. ulp(max(|b|, y)) = max(ulp(|b|), ulp(y)): the scaled error
    and the top check's are |d - b| over the own ULP floored at ulp(rms), resp.
    ulp(floor x rms); over |b| >= q every own ULP is >= ulp(q), so where the floors are
    no larger the top check's error IS the scaled (or own) error there, and is not
    computed again."""
    unit = 2.0**info.mantissa_bits
    ulp_floor = 2.0 ** (info.e_min - info.mantissa_bits)
    need_own = spec.ulp_threshold is not None or spec.offend == "ulp"
    scaled_floor = max(ulp_floor, _ulp_scalar(spec.scaled_rms, info)) if spec.scaled_rms is not None else None
    top_floor = ulp_floor
    top_source: TopSource = "separate"
    if spec.top is not None:
        top_floor = max(ulp_floor, _ulp_scalar(spec.top[1], info))
        u_q = _ulp_scalar(spec.top[0], info)
        if scaled_floor is not None and max(scaled_floor, top_floor) <= u_q:
            top_source = "scaled"
        elif need_own and top_floor <= u_q:
            top_source = "own"
    return Plan(
        spec=spec,
        info=info,
        tiny=tiny,
        unit=unit,
        own_clamp=ulp_floor * unit,
        scaled_clamp=(scaled_floor if scaled_floor is not None else ulp_floor) * unit,
        top_clamp=top_floor * unit,
        top_source=top_source,
        finite_source="own" if need_own else "scaled" if scaled_floor is not None else "abs_err",
        top_seen=[0.0],
        offend_seen=[0.0],
    )


def run(pair: Pair, spec: PassSpec) -> PassResult | None:
    """One fused pass computing what `spec` asks; None if not all finite.

    Adds the legacy metrics' sums when the registry announced it will want them
    (pair.want_legacy), and keeps the result for legacy.py (pair.fused_legacy).
    """
    if pair.want_legacy and pair.fused_legacy is None:
        spec = replace(spec, legacy=True, rel_below=tuple(sorted(set(spec.rel_below) | set(LEGACY_REL_LIMITS))))
    d, b = raw_views(pair)
    constants = plan(spec, pair.info, pair.tiny)
    res = merge_partials(in_halves(lambda lo, hi: accumulate(d, b, lo, hi, constants), d.size))
    finite = res.of(FiniteCheck)
    if not (math.isfinite(finite.total) and finite.max_abs_b <= pair.info.max_finite):
        pair.fused_nonfinite = True
        return None
    pair.mark_all_finite()
    if spec.legacy:
        pair.fused_legacy = res
    return res


def worst(pair: Pair, spec: PassSpec) -> tuple[Offender, ...]:
    """The five worst elements by spec.offend ("rel", "score", "ulp", "scaled"): a second
    pass, run only for a verdict that is not a pass (its message shows them)."""
    res = run(pair, spec)
    return offenders(pair, res.of(Worst).items) if res is not None else ()


def bench_sumsq(pair: Pair) -> float:
    """sum(b**2) over the bench in float64 (kept on the pair)."""
    if pair.bench_square_sum is None:
        _, b = raw_views(pair)
        if b.dtype == np.float64:
            pair.bench_square_sum = float(np.dot(b, b))
        else:
            total = 0.0
            for o in range(0, b.size, 1 << 20):
                c = b[o : o + (1 << 20)].astype(np.float64)
                total += float(np.dot(c, c))
            pair.bench_square_sum = total
    return pair.bench_square_sum


def rms_or_none(pair: Pair) -> float | None:
    """RMS of the bench, when the plain formula is safe (no over/underflow); else None."""
    n = pair.n
    s = bench_sumsq(pair)
    if not (math.isfinite(s) and n * 1e-300 < s < 1e300):
        return None
    return float(math.sqrt(s / n))


def run_with_rms(pair: Pair, spec: PassSpec, scaled: bool, top: tuple[float, float] | None = None) -> PassResult | None:
    """run(pair, spec) with the single-run rule's scales of the bench's RMS: scaled_rms
    = rms if `scaled`, top = (q, f * rms) for top = (q, f). The pass reads them only
    through ULPs of D (`plan`), so any RMS in the same binades gives the same result.

    So rather than a pass over the whole bench first (bench_sumsq: a read of it from
    memory), the RMS is guessed from the quantile sample, the exact sum of squares is
    computed in the pass itself, and the pass is repeated with the exact RMS only where
    the guess's ULPs differ from it (an RMS within the guess's error of a power of two).
    """

    def with_rms(rms: float) -> PassSpec:
        out = replace(spec, scaled_rms=rms) if scaled else spec
        return replace(out, top=(top[0], top[1] * rms)) if top is not None else out

    known = pair.bench_square_sum is not None
    guess = rms_or_none(pair) if known else _sample_rms(pair)
    if guess is None:
        return None
    res = run(pair, replace(with_rms(guess), sumsq=not known))
    if res is None or known:
        return res
    pair.bench_square_sum = res.of(BenchSquares).total
    rms = rms_or_none(pair)
    if rms is None:
        return None
    factors = ([1.0] if scaled else []) + ([top[1]] if top is not None else [])
    if all(_ulp_scalar(f * guess, pair.info) == _ulp_scalar(f * rms, pair.info) for f in factors):
        return res
    return run(pair, with_rms(rms))


def _sample_rms(pair: Pair) -> float:
    """RMS of the quantile sample of |b|: a guess at the bench's (1.0 if it overflows)."""
    with np.errstate(all="ignore"):
        rms = float(np.sqrt(np.mean(np.square(_abs_b_sample(pair)))))
    return rms if math.isfinite(rms) and rms > 0 else 1.0


def _abs_b_sample(pair: Pair) -> Array:
    """|b| at every (n // QUANTILE_SAMPLE)-th element in float64: the plain path's
    quantile sample (cached)."""

    def compute() -> Array:
        _, b = raw_views(pair)
        step = max(1, b.size // QUANTILE_SAMPLE)
        sample: Array = np.abs(b[::step]).astype(np.float64, copy=False)
        return sample

    return pair.memoise("fast_abs_b_sample", compute)


def abs_b_quantiles(pair: Pair, qs: Iterable[float]) -> list[float]:
    """Quantiles ('lower') of |b| on the strided sample the plain path uses (all finite)."""
    sample = _abs_b_sample(pair)
    n = sample.size
    # numpy's 'lower' quantile is the order statistic floor((n - 1) * q)
    ks = [int(np.floor((n - 1) * np.float64(q))) for q in qs]
    return [float(v) for v in _kth_values(sample, ks)]


def _kth_values(x: Array, ks: list[int]) -> list[float]:
    """Exact k-th smallest values (0-based) of x, without partitioning all of x.

    A sorted strided subsample brackets each rank; only the elements inside the bracket
    are partitioned. If the bracket misses (odd data), the full partition is used.
    """
    n = x.size
    if n <= 1 << 16:
        part = np.partition(x, ks)
        return [part[k] for k in ks]
    sub = np.sort(x[::32])
    margin = 4.0 * math.sqrt(sub.size) + 8
    out: list[float] = []
    for k in ks:
        r = k / n * sub.size
        lo = sub[max(0, int(r - margin))]
        hi = sub[min(sub.size - 1, int(r + margin) + 1)]
        below = int(np.count_nonzero(x < lo))
        window = x[(x >= lo) & (x <= hi)]
        j = k - below
        if 0 <= j < window.size:
            out.append(np.partition(window, j)[j])
        else:
            out.append(np.partition(x, k)[k])
    return out


def offenders(pair: Pair, items: Iterable[tuple[float, int]]) -> tuple[Offender, ...]:
    """Offender tuples from (score, flat index) pairs."""
    from .verdict import Offender

    d, b = raw_views(pair)
    shape = pair.shape or ()
    return tuple(
        Offender(tuple(int(x) for x in np.unravel_index(i, shape)) if shape else (), float(d[i]), float(b[i]))
        for s, i in items
        if s > 0
    )
