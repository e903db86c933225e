"""Chunked passes for one standard each, cheaper than the fused pass (fast.py) for what
they answer: the thousandth share by a float32 pre-test, the binary comparison in D, and
the bias sums of the statistical sample alone. Each walks the same chunks (chunks.py)
in the same two threads, and declines (None) where an element is not finite, leaving
the pair to the plain path as the fused pass does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .chunks import CHUNK, BiasSums, bench_in_d, chunks, d_buffer_dtype, diff_into, in_halves, in_threads, threads
from .fast import raw_views

if TYPE_CHECKING:
    from .dtypes import Array
    from .metrics import Pair

__all__ = ["thousandth_count", "binary_scan", "sampled_bias"]

#: relative margin of the float32 pre-test of thousandth_count (see there)
_TH_MARGIN = 2.0**-10


def sampled_bias(pair: Pair, q: float, sample: int) -> list[float] | None:
    """BiasSums over every `sample`-th chunk only, converted from the raw arrays (the
    other chunks are never read), the chunks shared by two threads: the bias statistics
    without a full pass. None where a sampled chunk holds an inf/NaN (the plain path's
    sample then differs)."""
    d, b = raw_views(pair)
    info = pair.info
    starts = list(range(0, d.size, CHUNK * sample))

    def work(part: list[int]) -> list[float] | None:
        sums = BiasSums(info, q, d.size, pair.near_zero_limits)
        cap = min(CHUNK, d.size)
        bench_d_buf = np.empty(cap, d_buffer_dtype(d.dtype, info))
        diff, abs_b = np.empty(cap), np.empty(cap)
        for _, device, bench in chunks(d, b, part):
            m = device.size
            diff, abs_b = diff[:m], abs_b[:m]
            bench64 = diff_into(device, bench, diff, abs_b)
            bench_d = bench_in_d(bench, info, bench_d_buf)
            # inf/NaN on either side make the sum inf/NaN (so may a finite overflow: then
            # the plain path judges, correctly, only slower)
            if not (
                math.isfinite(float(diff.sum()))
                and math.isfinite(float(bench_d.max()))
                and math.isfinite(float(bench_d.min()))
            ):
                return None
            sums.add(device, bench_d, bench, diff, np.abs(bench64, out=abs_b))
        return sums.sums

    halves = [starts[::2], starts[1::2]] if len(starts) >= 4 and threads() > 1 else [starts]
    parts = in_threads(work, halves)
    if any(part is None for part in parts):
        return None
    return [sum(values) for values in zip(*parts, strict=False)]


def thousandth_count(  # noqa: C901  the fused hot loop: a split would add a pass or a call per chunk
    pair: Pair, limit: float = 0.001, bias_q: float | None = None, sample: int = 1
) -> tuple[int, list[float] | None] | None:
    """(#elements with rel_err < limit, exactly as metrics.Pair counts them; with bias_q,
    the BiasSums of the statistical sample -- every `sample`-th chunk, as sampled_bias
    takes it -- added while each sampled chunk is in cache, else None); None: not all
    finite (or D is float64), take another path.

    Most elements are decided in float32 (D is float32/float16/bfloat16): with b32 = b
    rounded to float32 and r = d / b32 in float32, 1 - c < r < 1 + c with c = (1 -
    2**-10) * limit (the bounds rounded to float32: within 2**-24 of c) implies rel_err <
    limit in float64 -- b32 is within 2**-24 |b| of b, the division within 2**-24
    relative, together < 2e-4 of limit for limit = 0.001, far inside the 2**-10 margin
    (and below float32's normal range the bench's `tiny` dominates). Every other element
    -- including every inf/NaN on either side, a bench that rounds to 0 or overflows
    float32 (r is then NaN, inf or 0) -- is judged by the float64 formula itself, so the
    count is exact, and is checked for finiteness there. Cost: one float32 pass of five
    cheap ufuncs (the bench's conversion, the division, two comparisons and their and;
    2**24 float32 elements 10-16 ms on two threads, was ~26 ms with seven ufuncs and a
    reduction); fp16/bf16 add a max/min of the bench per chunk (does it overflow D?).
    The sample's bias sums in the same pass save a second read of those chunks and a
    second dispatch to the threads (the thousandth standard alone: 24-26 -> ~17 ms).
    """
    if pair.info.name == "float64" or not 2.0**-24 / limit < _TH_MARGIN / 2:
        return None
    d, b = raw_views(pair)
    n = d.size
    info = pair.info
    c1 = limit * (1 - _TH_MARGIN)
    lo_r, hi_r = np.float32(1.0 - c1), np.float32(1.0 + c1)
    bmax = float(info.max_finite) if info.name != "float32" else None
    tiny = pair.tiny
    same_d = d.dtype == np.float32

    def work(lo: int, hi: int) -> tuple[int, bool, float, list[float] | None]:
        with np.errstate(all="ignore"):
            bench32, ratio = np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32)
            within, below_hi = np.empty(CHUNK, bool), np.empty(CHUNK, bool)
            bias = None
            if bias_q is not None:
                bias = BiasSums(info, bias_q, min(CHUNK, n), pair.near_zero_limits)
                diff, abs_b = np.empty(min(CHUNK, n)), np.empty(min(CHUNK, n))
                bench_d_buf = np.empty(min(CHUNK, n), d_buffer_dtype(d.dtype, info))
            count, finite, babs = 0, True, 0.0
            for o, device, bench in chunks(d, b, range(lo, hi, CHUNK)):
                m = device.size
                if m != CHUNK:
                    bench32, ratio, within, below_hi = bench32[:m], ratio[:m], within[:m], below_hi[:m]
                np.copyto(bench32, bench, casting="unsafe")  # cheaper than the division casting
                if same_d:
                    np.divide(device, bench32, out=ratio)
                else:
                    np.divide(device, bench32, out=ratio, dtype=np.float32)
                np.greater(ratio, lo_r, out=within)
                np.less(ratio, hi_r, out=below_hi)
                np.logical_and(within, below_hi, out=within)
                if bmax is not None:  # NaN in the bench: undecided below
                    babs = max(babs, float(bench.max()), -float(bench.min()))
                k = int(np.count_nonzero(within))
                chunk_finite = True
                if k < m:  # undecided: the float64 formula
                    k_undecided, chunk_finite = _count_undecided(device, bench, within, tiny, limit)
                    finite = finite and chunk_finite
                    k += k_undecided
                count += k
                if bias is not None and chunk_finite and (o // CHUNK) % sample == 0:
                    diff_m, abs_b_m = diff[:m], abs_b[:m]
                    bench64 = diff_into(device, bench, diff_m, abs_b_m)
                    bench_d = bench32 if info.name == "float32" else bench_in_d(bench, info, bench_d_buf)
                    bias.add(device, bench_d, bench, diff_m, np.abs(bench64, out=abs_b_m))
            return count, finite, babs, bias.sums if bias is not None else None

    parts = in_halves(work, n)
    if not all(p[1] for p in parts) or (bmax is not None and not max(p[2] for p in parts) <= bmax):
        pair.fused_nonfinite = True
        return None
    pair.mark_all_finite()
    sums = [sum(values) for values in zip(*(p[3] for p in parts), strict=False)] if bias_q is not None else None
    return sum(p[0] for p in parts), sums


def _count_undecided(device: Array, bench: Array, decided: Array, tiny: float, limit: float) -> tuple[int, bool]:
    """(#elements the float32 pre-test left undecided with rel_err < limit by the float64
    formula, are they all finite: d finite, b finite in float32, as the pre-test's)."""
    idx = np.flatnonzero(~decided)
    d64 = device[idx].astype(np.float64)
    b64 = bench[idx].astype(np.float64)
    finite = bool(np.isfinite(d64).all()) and bool(np.isfinite(bench[idx].astype(np.float32)).all())
    rel = np.abs(d64 - b64) / (np.abs(b64) + tiny)
    return int(np.count_nonzero(rel < limit)), finite


def binary_scan(pair: Pair, k: int = 5) -> tuple[int, list[int]]:
    """(#elements with d != b rounded to D, NaN matching NaN; the first k such indices)."""
    d, b = raw_views(pair)
    info = pair.info

    def work(lo: int, hi: int) -> tuple[int, list[int]]:
        with np.errstate(all="ignore"):
            bench_d_buf = np.empty(CHUNK, d_buffer_dtype(d.dtype, info))
            differ_buf = np.empty(CHUNK, bool)
            count, first = 0, list[int]()
            for o, device, bench in chunks(d, b, range(lo, hi, CHUNK)):
                bench_d = bench_in_d(bench, info, bench_d_buf)
                differ = differ_buf[: device.size]
                np.not_equal(device, bench_d, out=differ)
                c = int(np.count_nonzero(differ))
                if c:
                    differ &= ~(np.isnan(device) & np.isnan(bench_d))
                    c = int(np.count_nonzero(differ))
                    if c and len(first) < k:
                        first.extend(int(i) + o for i in np.flatnonzero(differ)[: k - len(first)])
                count += c
            return count, first

    parts = in_halves(work, d.size)
    return sum(c for c, _ in parts), [i for _, f in parts for i in f][:k]
