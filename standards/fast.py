"""The fused, chunked path of the shipped standards for large, all-finite outputs.

Why: judging a 2**24-element output the plain way (metrics.Pair) makes float64 copies
of both sides, the bench rounded to D, and a dozen full-size temporaries (abs_err,
rel_err, masks, ULPs), each a pass over memory that also pays first-touch page faults.
Here every quantity a standard needs is computed in ONE pass over cache-sized chunks
(CHUNK elements, a few float64 buffers per thread, reused by every chunk), in two
threads (numpy releases the GIL inside ufuncs; no BLAS call inside: its own threads
contend with ours, see `_dot`), and only sums, counts and maxima leave the chunk loop.
The single-run rule's statistical sums are taken on its sampled chunks only
(single_run.py, 4.), and its RMS is guessed and checked in the same pass
(`run_with_rms`). The five worst elements are found by a second pass (`worst`) only for a
verdict that is not a pass, where a message shows them; likewise the extra checks a
verdict needs only past a limit (ulp's top-decile check, thousandth's scaled share).
No float64 copy of the device output, no boolean-index copies, no full sort.

Exactness: every per-element quantity is computed by the same float64 formula as in
metrics.Pair (d - b, |b| + tiny, the ULP of D from the exponent bits, comparisons of d
with the bench rounded to D in D), so counts, maxima and verdicts are identical; sums
and means differ only in summation order (a few units of 1e-16 relative).

When: a floating output with n >= FAST_MIN_N, D in float64/float32/float16/bfloat16,
with or without a reference. With one, benchmark and ulp take the device's spec metrics
from one pass (benchmark also the floors' -- the bench rounded to D, `bm_ideal` -- in the
same pass); a baseline's metrics are read as recorded, a reference output's computed by a
second pass over (bench, reference), or by metrics.Pair when that pass declines; the
ratio judgement is the plain path's code. The others' reference mode only names the
verdict's kind. The pass also checks that every element is
finite (and the bench does not overflow D); otherwise it gives up (`None`) and the
standard takes the plain path, which handles inf/NaN agreement. The plain path is kept
for small outputs (no fixed overhead for the plugin's usual tiny tensors) and is the
reference the fast path is tested against (tests/standards/test_fast_path.py).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import numpy as np
import torch

from .dtypes import Array, DtypeInfo

if TYPE_CHECKING:
    from .metrics import Pair
    from .reference import Reference
    from .verdict import Offender

__all__ = ["FAST_MIN_N", "CHUNK", "run", "raw_views", "fast_ok"]

#: outputs smaller than this take the plain path (tests lower it to exercise this one)
FAST_MIN_N = 1 << 16
#: elements per chunk (measured on this 2-core EPYC, two threads: 2**16 and 2**17 within
#: +-10% of each other, 2**15 1.5x and 2**14 3x slower -- each ufunc call re-takes the GIL)
CHUNK = 1 << 16
#: the quantile of |b| is estimated on at most this many evenly strided elements
#: (both paths: single_run.py reads it here)
QUANTILE_SAMPLE = 2**16
_EXP_MASK = np.int64(0x7FF0000000000000)
_FAST_DTYPES = ("float64", "float32", "float16", "bfloat16")
#: clip of signed ULP errors in the bias statistics (keeps cancellation noise bounded)
BIAS_CLIP = 64.0

#: what one pass computed, by name (see `_work_inner`): counts, sums and maxima, lists of
#: them, offenders; Any: each key's value has its own type, read by the standard that asked
Result: TypeAlias = dict[str, Any]

_T = TypeVar("_T")

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _after_fork_in_child() -> None:
    """A forked child has no pool threads: start a fresh pool when next needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _threads() -> int:
    return min(2, os.cpu_count() or 1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="msprobe-std")
        return _pool


def _in_halves(work: Callable[[int, int], _T], n: int) -> list[_T]:
    """work(lo, hi) over [0, n): in two threads, chunk-aligned halves, when n is large.
    (Measured: 16 smaller tasks, to balance a core shared with another process, were
    5-15% slower than halves on every standard.)"""
    if n >= 4 * CHUNK and _threads() > 1:
        step = -(-n // 2 // CHUNK) * CHUNK
        pool = _get_pool()
        return [f.result() for f in [pool.submit(work, lo, min(lo + step, n)) for lo in range(0, n, step)]]
    return [work(0, n)]


def _raw(x: Array | torch.Tensor) -> Array:
    """A flat numpy view (no copy where possible) in a numpy dtype holding x exactly."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)  # exact
        return t.contiguous().reshape(-1).numpy()
    return np.ascontiguousarray(x).reshape(-1)


def raw_views(pair: Pair) -> tuple[Array, Array]:
    """(device, bench) flat numpy arrays in their own dtypes, cached on the pair."""
    return pair.cached("fast_raw", lambda: (_raw(pair.device_src), _raw(pair.bench_src)))


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


class _Spec:
    """What one pass computes; attributes left None are skipped."""

    def __init__(self, **kw: object) -> None:
        self.rel_lt: tuple[float, ...] = ()  # count rel_err < x for each x
        self.thr: tuple[float, float, float] | None = None  # (rtol, small, atol): n_small, rel_bad, abs_bad
        self.bm: tuple[float, float] | None = None  # (small, atol): benchmark metrics
        self.bm_ideal = False  # with bm: the same of the bench rounded to D
        self.ulp_t: float | None = None  # T: max/sum/count(> T) of own-ULP error
        self.signs: bool | str = False  # pos, neg, outward, inward vs bench rounded to D
        # ("eb": pos, neg only; outward, inward stay 0)
        self.scaled_rms: float | None = None  # rms: scaled ULP error at max(|b|, rms)
        self.top: tuple[float, float] | None = None  # (q, floor*rms): max own-ULP error over |b| >= q
        self.th_scaled: tuple[float, float] | None = None  # allowed factor (ulps*eps) with rms: thousandth
        self.abs_scaled: tuple[float, float] | None = None  # (floor*rms, ulps*eps) for absolute threshold
        self.legacy = False  # cosine sums and max_abs_err
        self.offend: str | None = None  # "rel" | "score" | "scaled" | "ulp"
        self.sample = 1  # sums of statistics over every sample-th chunk
        self.bias: float | None = None  # q: BiasSums over the sampled chunks
        self.sumsq = False  # sum of b**2 (run_with_rms)
        self.top_seen = [0.0]  # the largest top error any thread has found: a
        # chunk whose max is below cannot change it
        self.offend_seen = [0.0]  # _Top's bound, shared by the threads
        for k, v in kw.items():
            setattr(self, k, v)


def _bench_in_d(bc: Array, info: DtypeInfo, buf: Array) -> Array:
    if info.name == "float64":
        return bc
    if info.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(bc)).to(torch.bfloat16).to(torch.float32).numpy()
    out = buf[: bc.size]
    np.copyto(out, bc, casting="unsafe")
    return out


def _diff_into(dc: Array, bc: Array, diff: Array, b8: Array) -> Array:
    """diff = d - b and b8 = b in float64, exactly as np.subtract(dc, bc, dtype=float64),
    but each operand cast by copyto first: a ufunc casting its inputs itself is 3-4x
    slower (2**16 float32 - float64 elements: 77 us vs 10 + 20 us). -> b in float64 (bc
    itself where it is float64, else b8 filled)."""
    if bc.dtype == np.float64:
        b8 = bc
    else:
        np.copyto(b8, bc)
    if dc.dtype == np.float64:
        np.subtract(dc, b8, out=diff)
    else:
        np.copyto(diff, dc)
        np.subtract(diff, b8, out=diff)
    return b8


def sampled_bias(pair: Pair, q: float, sample: int) -> list[float] | None:
    """BiasSums over every `sample`-th chunk only, converted from the raw arrays (the
    other chunks are never read), the chunks shared by two threads: the bias statistics
    without a full pass. None where a sampled chunk holds an inf/NaN (the plain path's
    sample then differs)."""
    d, b = raw_views(pair)
    info = pair.info
    starts = list(range(0, d.size, CHUNK * sample))

    def work(part: list[int]) -> list[float] | None:
        sums = BiasSums(info, q, d.size)
        cap = min(CHUNK, d.size)
        buf = np.empty(cap, d.dtype if info.name != "bfloat16" else np.float32)
        diff, ab = np.empty(cap), np.empty(cap)
        for o in part:
            dc, bc = d[o : o + CHUNK], b[o : o + CHUNK]
            m = dc.size
            diff, ab = diff[:m], ab[:m]
            b8 = _diff_into(dc, bc, diff, ab)
            bd = _bench_in_d(bc, info, buf)
            # inf/NaN on either side make the sum inf/NaN (so may a finite overflow: then
            # the plain path judges, correctly, only slower)
            if not (math.isfinite(float(diff.sum())) and math.isfinite(float(bd.max())) and math.isfinite(float(bd.min()))):
                return None
            sums.add(dc, bd, bc, diff, np.abs(b8, out=ab))
        return sums.sums

    halves = [starts[::2], starts[1::2]] if len(starts) >= 4 and _threads() > 1 else [starts]
    parts = [future.result() for future in [_get_pool().submit(work, half) for half in halves]] if len(halves) > 1 else [work(starts)]
    if any(part is None for part in parts):
        return None
    return [sum(values) for values in zip(*parts, strict=False)]


def _ulp_scalar(x: float, info: DtypeInfo) -> float:
    """ULP of D at |x| (metrics.ulp_of for one value)."""
    from .metrics import ulp_of

    return float(ulp_of(np.array([abs(float(x))]), info)[0])


def _pow2_into(abs_vals: Array, out: Array, clamp: float) -> Array:
    """max(2**floor(log2|x|), clamp) from the exponent bits of float64 x (sign ignored).

    With clamp = 2**e_min this is the ULP of D times 2**m (metrics.ulp_of: a subnormal x
    gives 0, clamped to 2**e_min); with a larger clamp 2**k, the same at max(|x|, 2**k), as
    the ULP is monotone (the single-run rule's coarser scales). Errors are divided by it,
    i.e. measured in units of 2**-m ULP, and their maxima and sums scaled by 2**m once:
    (a / 2**e) * 2**m is a / 2**(e - m) exactly (power-of-two scalings), unless a quotient
    is subnormal (an error below ~2**-1000 ULP, which moves no maximum and no sum). One
    ufunc fewer per ULP computation than 2**(e - m) itself.
    """
    bits = out.view(np.int64)
    np.bitwise_and(abs_vals.view(np.int64), _EXP_MASK, out=bits)
    if out.size and float(out.min()) < clamp:  # a reduction is 4x cheaper than maximum
        np.maximum(out, clamp, out=out)
    return out


class BiasSums:
    """The single-run rule's bias counts and sums over the sampled blocks of elements
    (single_run.py: which blocks, and `bias_statistics`, which turns them into metrics).
    Both paths `add` the same blocks, with their own arrays: d and b_D (the bench rounded
    to D) in D's dtype or float64, b in its own, d - b and |b| in float64.

    sums = [#(d > b_D), #(d < b_D), #outward (d - b_D has the sign of b), #inward,
            #upper (|b| >= q), sum of the clipped signed own-ULP errors over the upper
            elements, the same times sign(b), the sum of their squares]
    """

    def __init__(self, info: DtypeInfo, q: float, size: int) -> None:
        self.info, self.q = info, q
        self.unit = 2.0**info.mantissa_bits  # ULPs per 2**e (_pow2_into)
        self.clamp = 2.0**info.e_min
        cap = min(CHUNK, size)  # the largest block
        self.signed, self.w, self.tmp = (np.empty(cap) for _ in range(3))
        self.masks = [np.empty(cap, bool) for _ in range(5)]
        self.sums: list[float] = [0, 0, 0, 0, 0, 0.0, 0.0, 0.0]

    def add(self, d: Array, b_d: Array, b: Array, diff: Array, abs_b: Array) -> None:
        """One block (at most CHUNK elements, all finite).

        Measured per 2**16-element block (numpy 1.26): comparisons and logical ops on
        masks and mask counts are cheap (2-9 us), float64 ufuncs with a scalar or a cast
        are not (minimum/maximum 30-50 us, a bool operand cast inside multiply 50 us); so
        the b < 0 mask is derived where no b is 0, the clip runs only where an error is
        past it, and the signed sums are two masked sums, not three.
        """
        m = d.size
        signed, w, prod = self.signed[:m], self.w[:m], self.tmp[:m]
        up, down, pos, neg, tmp = (x[:m] for x in self.masks)
        count, s = np.count_nonzero, self.sums
        np.greater(d, b_d, out=up)
        np.less(d, b_d, out=down)
        np.greater(b, 0, out=pos)
        n_up, n_down = int(count(up)), int(count(down))
        s[0] += n_up
        s[1] += n_down
        up_pos = int(count(np.logical_and(up, pos, out=tmp)))
        down_pos = int(count(np.logical_and(down, pos, out=tmp)))
        no_zero = float(abs_b.min()) > 0.0
        if no_zero:  # b < 0 wherever not b > 0
            up_neg, down_neg = n_up - up_pos, n_down - down_pos
        else:
            np.less(b, 0, out=neg)
            up_neg = int(count(np.logical_and(up, neg, out=tmp)))
            down_neg = int(count(np.logical_and(down, neg, out=tmp)))
        s[2] += up_pos + down_neg
        s[3] += down_pos + up_neg
        np.divide(diff, _pow2_into(abs_b, w, self.clamp), out=signed)  # exact
        lim = BIAS_CLIP / self.unit
        if not -lim <= float(signed.min()) <= float(signed.max()) <= lim:
            np.minimum(signed, lim, out=signed)
            np.maximum(signed, -lim, out=signed)
        upper = np.greater_equal(abs_b, self.q, out=up)
        n_upper = int(count(upper))
        s[4] += n_upper
        if n_upper == 0:
            return
        np.copyto(w, upper)  # masked sums as dot products
        total = self.unit * _dot(signed, w, prod)
        s[5] += total
        s[7] += self.unit * self.unit * _dot(prod, signed, prod)
        if no_zero or self.q > 0.0:  # every upper element is > 0 or < 0
            np.copyto(w, np.logical_and(upper, pos, out=down))
            s[6] += 2.0 * self.unit * _dot(signed, w, prod) - total
        else:
            for sign, mask in ((1, np.logical_and(upper, pos, out=down)), (-1, np.logical_and(upper, np.less(b, 0, out=neg), out=tmp))):
                np.copyto(w, mask)
                s[6] += sign * self.unit * _dot(signed, w, prod)


def _add_normal_sums(
    acc: list[float], at: int, err: Array, rel: Array, normal: Array | None, none_normal: bool, scratch: Array, tmp: Array
) -> None:
    """The benchmark standard's sums over a chunk's normal elements (|b| > small), added
    to acc[at:at + 3]: sum of err**2, max and sum of rel. `normal` is the 0/1 mask, None
    when every element is normal; masked sums multiply by it (into `scratch`, which may
    be err itself), cheaper than selecting."""
    if none_normal:
        return
    if normal is not None:
        err = np.multiply(err, normal, out=scratch)
    acc[at] += _dot(err, err, tmp)
    if normal is not None:
        rel = np.multiply(rel, normal, out=scratch)
    acc[at + 1] = max(acc[at + 1], float(rel.max()))
    acc[at + 2] += float(rel.sum())


def _dot(a: Array, b: Array, tmp: Array) -> float:
    """sum(a * b) by numpy's own loops, not np.dot: that calls the BLAS, whose threads
    contend with the pool's (measured: the two-thread pass 2.5x slower than one thread,
    with OpenBLAS)."""
    np.multiply(a, b, out=tmp)
    return float(tmp.sum())


class _Top:
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


def _work(d: Array, b: Array, lo: int, hi: int, info: DtypeInfo, tiny: float, spec: _Spec) -> Result:
    with np.errstate(all="ignore"):
        return _work_inner(d, b, lo, hi, info, tiny, spec)


def _work_inner(d: Array, b: Array, lo: int, hi: int, info: DtypeInfo, tiny: float, spec: _Spec) -> Result:
    C = CHUNK
    f8 = np.float64
    diff, ae, ab, rel, t1, t2, t3, t4, sq = (np.empty(C, f8) for _ in range(9))
    bdbuf = np.empty(C, d.dtype if info.name != "bfloat16" else np.float32)
    m1, m2, m3, m4 = (np.empty(C, bool) for _ in range(4))
    r: Result = {"fin": 0.0, "max_ab": 0.0}
    lt = {x: 0 for x in spec.rel_lt}
    if spec.thr is not None:
        r["thr"] = [0, 0, 0]
    if spec.bm is not None:
        r["bm"] = [0, 0, 0.0, 0.0, 0.0]
        if spec.bm_ideal:
            r["bm_ideal"] = [0, 0.0, 0.0, 0.0]
    if spec.ulp_t is not None:
        r["ulp"] = [0.0, 0.0, 0]
    if spec.signs:
        r["signs"] = [0, 0, 0, 0]
    if spec.scaled_rms is not None:
        r["scaled"] = [0.0, 0.0, 0]  # max; sum and count over the sampled chunks
    if spec.top is not None:
        r["top"] = 0.0
    if spec.th_scaled is not None:
        r["th_scaled"] = 0
    if spec.abs_scaled is not None:
        r["abs_scaled"] = 0
    if spec.legacy:
        r["legacy"] = [0.0, 0.0, 0.0, 0.0]
    if spec.sumsq:
        r["sumsq"] = 0.0
    top = _Top(shared=spec.offend_seen)
    need_rel = (
        bool(spec.rel_lt)
        or spec.thr is not None
        or spec.bm is not None
        or spec.th_scaled is not None
        or spec.abs_scaled is not None
        or spec.offend == "rel"
    )
    need_own_ulp = spec.ulp_t is not None or spec.offend == "ulp"
    unit = 2.0**info.mantissa_bits  # ULP errors are computed in 1/unit ULP
    ulp_floor = 2.0 ** (info.e_min - info.mantissa_bits)
    # ulp(max(|b|, y)) = max(ulp(|b|), ulp(y)): the scaled error and the top check's are
    # |d - b| over the own ULP floored at ulp(rms), resp. ulp(floor*rms)
    scaled_floor = top_src = None
    if spec.scaled_rms is not None:
        scaled_floor = max(ulp_floor, _ulp_scalar(spec.scaled_rms, info))
    if spec.top is not None:
        top_floor = max(ulp_floor, _ulp_scalar(spec.top[1], info))
        top_q = spec.top[0]
        u_q = _ulp_scalar(top_q, info)  # over |b| >= q every own ULP is >= u_q
        # where the floors are <= u_q the top check's error IS the scaled (own) error there
        top_src = (
            "scaled"
            if scaled_floor is not None and max(scaled_floor, top_floor) <= u_q
            else "own"
            if need_own_ulp and top_floor <= u_q
            else "separate"
        )
    need_ae = need_rel or spec.legacy or scaled_floor is not None or top_src == "separate" or not need_own_ulp
    bias = BiasSums(info, spec.bias, hi - lo) if spec.bias is not None else None
    for o in range(lo, hi, C):
        dc, bc = d[o : o + C], b[o : o + C]
        m = dc.size
        if m != C:
            diff, ae, ab, rel, t1, t2, t3, t4, sq, bdbuf, m1, m2, m3, m4 = (
                x[:m] for x in (diff, ae, ab, rel, t1, t2, t3, t4, sq, bdbuf, m1, m2, m3, m4)
            )
        bd = None  # the bench rounded to D
        sampled = (o // C) % spec.sample == 0
        np.abs(_diff_into(dc, bc, diff, ab), out=ab)
        r["max_ab"] = max(r["max_ab"], float(ab.max()))
        if spec.sumsq:
            r["sumsq"] += _dot(ab, ab, sq)
        if need_ae:
            np.abs(diff, out=ae)
            if not need_own_ulp and scaled_floor is None:  # else their maxima check it
                r["fin"] += float(ae.sum())
        if need_rel:
            np.add(ab, tiny, out=t1)
            np.divide(ae, t1, out=rel)
        for x in spec.rel_lt:
            np.less(rel, x, out=m1)
            lt[x] += int(np.count_nonzero(m1))
        if spec.legacy:
            lg = r["legacy"]
            d8 = t2
            np.copyto(d8, dc, casting="safe")
            lg[0] += _dot(d8, d8, sq)
            lg[1] += _dot(ab, ab, sq)
            lg[2] += _dot(d8, bc, sq)
            lg[3] = max(lg[3], float(ae.max()))
        small_n = 0
        if spec.thr is not None:
            rtol, small, atol = spec.thr
            np.less_equal(ab, small, out=m1)  # small mask
            small_n = int(np.count_nonzero(m1))
            th = r["thr"]
            th[0] += small_n
            if small_n:
                np.greater(ae, atol, out=m2)
                th[2] += int(np.count_nonzero(m2 & m1))
                np.greater(rel, rtol, out=m2)
                th[1] += int(np.count_nonzero(m2 & ~m1))
            else:
                np.greater(rel, rtol, out=m2)
                th[1] += int(np.count_nonzero(m2))
            if spec.abs_scaled is not None or spec.offend == "score":
                score = t2
                np.divide(rel, rtol, out=score)
                if small_n:
                    np.divide(ae, atol, out=t3)
                    np.copyto(score, t3, where=m1)
                if spec.offend == "score":
                    top.update(score, o)
                if spec.abs_scaled is not None:
                    floor_rms, fac = spec.abs_scaled
                    np.greater(score, 1.0, out=m2)
                    if m2.any():
                        np.maximum(ab, floor_rms, out=t1)
                        t1 *= fac
                        np.greater(ae, t1, out=m3)
                        r["abs_scaled"] += int(np.count_nonzero(m2 & m3))
        if spec.bm is not None:
            small, atol = spec.bm
            bm = r["bm"]
            ns = 0
            if float(ab.min()) <= small:  # a reduction, cheaper than
                np.less_equal(ab, small, out=m1)  # a mask and its count
                ns = int(np.count_nonzero(m1))
            bm[0] += ns
            if ns:
                np.greater(ae, atol, out=m2)
                bm[1] += int(np.count_nonzero(m2 & m1))
                np.logical_not(m1, out=m1)  # normal mask
            _add_normal_sums(bm, 2, ae, rel, m1 if ns else None, ns == m, t1, sq)
            if spec.bm_ideal:  # benchmark.py's `_ideal`: d = the bench rounded to D
                bd = _bench_in_d(bc, info, bdbuf)
                ia, ir = t2, t3
                np.subtract(bd, bc, out=ia, dtype=f8)
                np.abs(ia, out=ia)
                np.add(ab, tiny, out=ir)
                np.divide(ia, ir, out=ir)
                bi = r["bm_ideal"]
                if ns:
                    np.less_equal(ab, small, out=m3)
                    np.greater(ia, atol, out=m4)
                    np.logical_and(m3, m4, out=m4)
                    bi[0] += int(np.count_nonzero(m4))
                    np.logical_not(m3, out=m3)  # normal mask
                _add_normal_sums(bi, 1, ia, ir, m3 if ns else None, ns == m, ia, sq)
        if spec.th_scaled is not None:
            rms, fac = spec.th_scaled
            np.maximum(ab, rms, out=t1)
            t1 *= fac
            np.less(ae, t1, out=m1)
            np.less(rel, 0.001, out=m2)
            np.logical_or(m1, m2, out=m1)
            r["th_scaled"] += int(np.count_nonzero(m1))
        cmax = smax = 0.0  # divisions by powers of two are exact
        if need_own_ulp:
            err = t2
            np.divide(diff, _pow2_into(ab, t1, ulp_floor * unit), out=err)
            np.abs(err, out=err)
            cmax = float(err.max())
            r["fin"] += cmax
            if spec.ulp_t is not None:
                u = r["ulp"]
                u[0] = max(u[0], cmax)
                u[1] += float(err.sum())
                np.greater(err, spec.ulp_t / unit, out=m1)
                u[2] += int(np.count_nonzero(m1))
            if spec.offend == "ulp":
                top.update(err, o)
        if scaled_floor is not None:
            sc = t3
            np.divide(ae, _pow2_into(ab, t1, scaled_floor * unit), out=sc)
            smax = float(sc.max())
            if not need_own_ulp:
                r["fin"] += smax
            scs = r["scaled"]
            scs[0] = max(scs[0], smax)
            if sampled:
                scs[1] += float(sc.sum())
                scs[2] += m
            if spec.offend == "scaled":
                top.update(sc, o)
        if top_src is not None:
            if top_src == "separate":
                src = t4
                np.divide(ae, _pow2_into(ab, t1, top_floor * unit), out=src)
                src_max = float(src.max())
            else:
                src, src_max = (t3, smax) if top_src == "scaled" else (t2, cmax)
            if src_max > max(r["top"], spec.top_seen[0]):  # else no top element beats it
                np.greater_equal(ab, top_q, out=m1)
                np.multiply(src, m1, out=t4)  # errors are >= 0
                r["top"] = max(r["top"], float(t4.max()))
                spec.top_seen[0] = max(spec.top_seen[0], r["top"])
        if spec.signs:
            if bd is None:
                bd = _bench_in_d(bc, info, bdbuf)
            np.greater(dc, bd, out=m1)
            np.less(dc, bd, out=m2)
            s = r["signs"]
            up, down = int(np.count_nonzero(m1)), int(np.count_nonzero(m2))
            s[0] += up
            s[1] += down
        if spec.signs and spec.signs != "eb":  # "eb": the error balance's counts only
            np.greater(bc, 0, out=m3)
            np.logical_and(m1, m3, out=m4)
            up_pos = int(np.count_nonzero(m4))
            np.logical_and(m2, m3, out=m4)
            down_pos = int(np.count_nonzero(m4))
            if float(ab.min()) > 0.0:
                up_neg, down_neg = up - up_pos, down - down_pos  # no b == 0
            else:
                np.less(bc, 0, out=m3)
                np.logical_and(m1, m3, out=m4)
                up_neg = int(np.count_nonzero(m4))
                np.logical_and(m2, m3, out=m4)
                down_neg = int(np.count_nonzero(m4))
            s[2] += up_pos + down_neg
            s[3] += down_pos + up_neg
        if bias is not None and sampled:
            if bd is None:
                bd = _bench_in_d(bc, info, bdbuf)
            bias.add(dc, bd, bc, diff, ab)
        if spec.offend == "rel":
            top.update(rel, o)
    r["rel_lt"] = lt
    r["offenders"] = top.items
    if bias is not None:
        r["bias"] = bias.sums
    for key in ("ulp", "scaled"):  # max and sum back to ULPs
        if key in r:
            r[key][0] *= unit
            r[key][1] *= unit
    if "top" in r:
        r["top"] *= unit
    return r


def _merge(parts: list[Result]) -> Result:
    out = dict(parts[0])
    for p in parts[1:]:
        out["fin"] += p["fin"]
        out["max_ab"] = max(out["max_ab"], p["max_ab"])
        out["rel_lt"] = {k: v + p["rel_lt"][k] for k, v in out["rel_lt"].items()}
        for key in ("thr", "signs", "bias"):
            if key in out:
                out[key] = [a + b for a, b in zip(out[key], p[key], strict=False)]
        if "bm" in out:
            a, b = out["bm"], p["bm"]
            out["bm"] = [a[0] + b[0], a[1] + b[1], a[2] + b[2], max(a[3], b[3]), a[4] + b[4]]
        if "bm_ideal" in out:
            a, b = out["bm_ideal"], p["bm_ideal"]
            out["bm_ideal"] = [a[0] + b[0], a[1] + b[1], max(a[2], b[2]), a[3] + b[3]]
        if "ulp" in out:
            a, b = out["ulp"], p["ulp"]
            out["ulp"] = [max(a[0], b[0]), a[1] + b[1], a[2] + b[2]]
        if "scaled" in out:
            a, b = out["scaled"], p["scaled"]
            out["scaled"] = [max(a[0], b[0]), a[1] + b[1], a[2] + b[2]]
        for key in ("top",):
            if key in out:
                out[key] = max(out[key], p[key])
        for key in ("th_scaled", "abs_scaled", "sumsq"):
            if key in out:
                out[key] += p[key]
        if "legacy" in out:
            a, b = out["legacy"], p["legacy"]
            out["legacy"] = [a[0] + b[0], a[1] + b[1], a[2] + b[2], max(a[3], b[3])]
        top = _Top()
        top.merge(out["offenders"])
        top.merge(p["offenders"])
        out["offenders"] = top.items
    return out


def run(pair: Pair, **kw: object) -> Result | None:
    """One fused pass computing what `kw` asks (see _Spec); None if not all finite.

    Adds the legacy metrics' sums when the registry announced it will want them
    (pair.want_legacy), and stores them for `legacy_metrics`.
    """
    spec = _Spec(**kw)
    if pair.want_legacy and "fast_legacy" not in pair._cache:
        spec.legacy = True
        spec.rel_lt = tuple(sorted(set(spec.rel_lt) | {0.01, 0.001, 0.0001}))
    d, b = raw_views(pair)
    n = d.size
    res = _merge(_in_halves(lambda lo, hi: _work(d, b, lo, hi, pair.info, pair.tiny, spec), n))
    if not (math.isfinite(res["fin"]) and res["max_ab"] <= pair.info.max_finite):
        pair._cache["fast_nonfinite"] = True
        return None
    pair.mark_all_finite()
    if spec.legacy:
        pair._cache["fast_legacy"] = res
    return res


def keep_sign_counts(pair: Pair, res: Result) -> None:
    """Give a pass's (#(d > b_D), #(d < b_D)) to the pair: its error balance reads them."""
    pair.__dict__.setdefault("sign_counts", tuple(res["signs"][:2]))


def worst(pair: Pair, offend: str, **kw: object) -> tuple[Offender, ...]:
    """The five worst elements by `offend` ("rel", "score", "ulp", "scaled"): a second
    pass, run only for a verdict that is not a pass (its message shows them)."""
    res = run(pair, offend=offend, **kw)
    return offenders(pair, res["offenders"]) if res is not None else ()


#: relative margin of the float32 pre-test of thousandth_count (see there)
_TH_MARGIN = 2.0**-10


def thousandth_count(
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
            C = CHUNK
            bb, r = np.empty(C, np.float32), np.empty(C, np.float32)
            ok, ok2 = np.empty(C, bool), np.empty(C, bool)
            bias = None
            if bias_q is not None:
                bias = BiasSums(info, bias_q, min(C, n))
                diff, ab = np.empty(min(C, n)), np.empty(min(C, n))
                bdbuf = np.empty(min(C, n), d.dtype if info.name != "bfloat16" else np.float32)
            count, finite, babs = 0, True, 0.0
            for o in range(lo, hi, C):
                dc, bc = d[o : o + C], b[o : o + C]
                m = dc.size
                if m != C:
                    bb, r, ok, ok2 = bb[:m], r[:m], ok[:m], ok2[:m]
                np.copyto(bb, bc, casting="unsafe")  # cheaper than the division casting
                if same_d:
                    np.divide(dc, bb, out=r)
                else:
                    np.divide(dc, bb, out=r, dtype=np.float32)
                np.greater(r, lo_r, out=ok)
                np.less(r, hi_r, out=ok2)
                np.logical_and(ok, ok2, out=ok)
                if bmax is not None:  # NaN in the bench: undecided below
                    babs = max(babs, float(bc.max()), -float(bc.min()))
                k = int(np.count_nonzero(ok))
                chunk_finite = True
                if k < m:  # undecided: the float64 formula
                    idx = np.flatnonzero(~ok)
                    dd = dc[idx].astype(np.float64)
                    b8 = bc[idx].astype(np.float64)
                    # as the float32 pass before: d finite, b finite in float32
                    chunk_finite = bool(np.isfinite(dd).all()) and bool(np.isfinite(bc[idx].astype(np.float32)).all())
                    finite = finite and chunk_finite
                    rel = np.abs(dd - b8) / (np.abs(b8) + tiny)
                    k += int(np.count_nonzero(rel < limit))
                count += k
                if bias is not None and chunk_finite and (o // C) % sample == 0:
                    diff_m, ab_m = diff[:m], ab[:m]
                    b64 = _diff_into(dc, bc, diff_m, ab_m)
                    b_d = bb if info.name == "float32" else _bench_in_d(bc, info, bdbuf)  # bb: b in float32
                    bias.add(dc, b_d, bc, diff_m, np.abs(b64, out=ab_m))
            return count, finite, babs, bias.sums if bias is not None else None

    parts = _in_halves(work, n)
    if not all(p[1] for p in parts) or (bmax is not None and not max(p[2] for p in parts) <= bmax):
        pair._cache["fast_nonfinite"] = True
        return None
    pair.mark_all_finite()
    sums = [sum(values) for values in zip(*(p[3] for p in parts), strict=False)] if bias_q is not None else None
    return sum(p[0] for p in parts), sums


def bench_sumsq(pair: Pair) -> float:
    """sum(b**2) over the bench in float64 (cached)."""

    def compute() -> float:
        _, b = raw_views(pair)
        if b.dtype == np.float64:
            return float(np.dot(b, b))
        total = 0.0
        for o in range(0, b.size, 1 << 20):
            c = b[o : o + (1 << 20)].astype(np.float64)
            total += float(np.dot(c, c))
        return total

    return pair.cached("fast_sumsq", compute)


def rms_or_none(pair: Pair) -> float | None:
    """RMS of the bench, when the plain formula is safe (no over/underflow); else None."""
    n = pair.n
    s = bench_sumsq(pair)
    if not (math.isfinite(s) and n * 1e-300 < s < 1e300):
        return None
    return float(math.sqrt(s / n))


def run_with_rms(pair: Pair, spec: dict[str, object], scaled: bool, top: tuple[float, float] | None = None) -> Result | None:
    """run(pair, **spec) with the single-run rule's scales of the bench's RMS: scaled_rms
    = rms if `scaled`, top = (q, f * rms) for top = (q, f). The pass reads them only
    through ULPs of D (`_work_inner`), so any RMS in the same binades gives the same result.

    So rather than a pass over the whole bench first (bench_sumsq: a read of it from
    memory), the RMS is guessed from the quantile sample, the exact sum of squares is
    computed in the pass itself, and the pass is repeated with the exact RMS only where
    the guess's ULPs differ from it (an RMS within the guess's error of a power of two).
    """

    def with_rms(rms: float) -> dict[str, object]:
        out = dict(spec, scaled_rms=rms) if scaled else dict(spec)
        if top is not None:
            out["top"] = (top[0], top[1] * rms)
        return out

    known = "fast_sumsq" in pair._cache
    guess = rms_or_none(pair) if known else _sample_rms(pair)
    if guess is None:
        return None
    res = run(pair, sumsq=not known, **with_rms(guess))
    if res is None or known:
        return res
    pair._cache["fast_sumsq"] = res["sumsq"]
    rms = rms_or_none(pair)
    if rms is None:
        return None
    factors = ([1.0] if scaled else []) + ([top[1]] if top is not None else [])
    if all(_ulp_scalar(f * guess, pair.info) == _ulp_scalar(f * rms, pair.info) for f in factors):
        return res
    return run(pair, **with_rms(rms))


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

    return pair.cached("fast_abs_b_sample", compute)


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
        Offender(tuple(int(x) for x in np.unravel_index(i, shape)) if shape else (), float(d[i]), float(b[i])) for s, i in items if s > 0
    )


def binary_scan(pair: Pair, k: int = 5) -> tuple[int, list[int]]:
    """(#elements with d != b rounded to D, NaN matching NaN; the first k such indices)."""
    d, b = raw_views(pair)
    info = pair.info

    def work(lo: int, hi: int) -> tuple[int, list[int]]:
        with np.errstate(all="ignore"):
            buf = np.empty(CHUNK, d.dtype if info.name != "bfloat16" else np.float32)
            ne = np.empty(CHUNK, bool)
            count, first = 0, list[int]()
            for o in range(lo, hi, CHUNK):
                dc, bc = d[o : o + CHUNK], b[o : o + CHUNK]
                bd = _bench_in_d(bc, info, buf)
                out = ne[: dc.size]
                np.not_equal(dc, bd, out=out)
                c = int(np.count_nonzero(out))
                if c:
                    out &= ~(np.isnan(dc) & np.isnan(bd))
                    c = int(np.count_nonzero(out))
                    if c and len(first) < k:
                        first.extend(int(i) + o for i in np.flatnonzero(out)[: k - len(first)])
                count += c
            return count, first

    n = d.size
    parts = _in_halves(work, n)
    return sum(c for c, _ in parts), [i for _, f in parts for i in f][:k]
