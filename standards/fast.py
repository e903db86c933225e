"""The fused, chunked path of the shipped standards for large, all-finite outputs.

Why: judging a 2**24-element output the plain way (metrics.Pair) makes float64 copies
of both sides, the bench rounded to D, and a dozen full-size temporaries (abs_err,
rel_err, masks, ULPs), each a pass over memory that also pays first-touch page faults.
Here every quantity a standard needs is computed in ONE pass over cache-sized chunks
(CHUNK elements, a few reused float64 buffers per thread that stay in L2), in two
threads (numpy releases the GIL inside ufuncs), and only sums, counts, maxima and the
five worst elements leave the chunk loop. No float64 copy of the device output, no
boolean-index copies, no full sort.

Exactness: every per-element quantity is computed by the same float64 formula as in
metrics.Pair (d - b, |b| + tiny, the ULP of D from the exponent bits, comparisons of d
with the bench rounded to D in D), so counts, maxima and verdicts are identical; sums
and means differ only in summation order (a few units of 1e-16 relative).

When: a floating output with n >= FAST_MIN_N, D in float64/float32/float16/bfloat16, no
reference (the plugin's single-run case). The pass also checks that every element is
finite (and the bench does not overflow D); otherwise it gives up (`None`) and the
standard takes the plain path, which handles inf/NaN agreement. The plain path is kept
for small outputs (no fixed overhead for the plugin's usual tiny tensors) and is the
reference the fast path is tested against (tests/standards/test_fast_path.py).
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = ["FAST_MIN_N", "CHUNK", "run", "raw_views", "fast_ok"]

#: outputs smaller than this take the plain path (tests lower it to exercise this one)
FAST_MIN_N = 1 << 16
#: elements per chunk: a handful of float64 buffers of this size fit in L2
CHUNK = 1 << 15
_EXP_MASK = np.int64(0x7FF0000000000000)
_FAST_DTYPES = ("float64", "float32", "float16", "bfloat16")

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


def _raw(x) -> np.ndarray:
    """A flat numpy view (no copy where possible) in a numpy dtype holding x exactly."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)           # exact
        return t.contiguous().reshape(-1).numpy()
    return np.ascontiguousarray(x).reshape(-1)


def raw_views(pair):
    """(device, bench) flat numpy arrays in their own dtypes, cached on the pair."""
    return pair.cached("fast_raw", lambda: (_raw(pair.device_src), _raw(pair.bench_src)))


def fast_ok(pair, reference=None) -> bool:
    """May this pair take the fused path?"""
    if reference is not None or pair.exact is not None or pair.n < FAST_MIN_N:
        return False
    if pair.info.name not in _FAST_DTYPES or pair.device_src is None:
        return False
    return pair.device_dtype in _FAST_DTYPES and pair.bench_dtype in _FAST_DTYPES


class _Spec:
    """What one pass computes; attributes left None are skipped."""

    def __init__(self, **kw):
        self.rel_lt: tuple = ()          # count rel_err < x for each x
        self.thr = None                  # (rtol, small, atol): n_small, rel_bad, abs_bad
        self.bm = None                   # (small, atol): benchmark metrics
        self.ulp_t = None                # T: max/sum/count(> T) of own-ULP error
        self.signs = False               # pos, neg, outward, inward vs bench rounded to D
        self.bias_q = None               # |b| quantile value: bias over |b| >= it
        self.scaled_rms = None           # rms: scaled ULP error at max(|b|, rms)
        self.top = None                  # (q, floor*rms): max own-ULP error over |b| >= q
        self.th_scaled = None            # allowed factor (ulps*eps) with rms: thousandth
        self.abs_scaled = None           # (floor*rms, ulps*eps) for absolute threshold
        self.legacy = False              # cosine sums and max_abs_err
        self.offend = None               # "rel" | "score" | "scaled" | "ulp"
        for k, v in kw.items():
            setattr(self, k, v)


def _bench_in_d(bc: np.ndarray, info, buf):
    if info.name == "float64":
        return bc
    if info.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(bc)).to(torch.bfloat16).to(
            torch.float32).numpy()
    out = buf[: bc.size]
    np.copyto(out, bc, casting="unsafe")
    return out


def _ulp_into(abs_vals: np.ndarray, out: np.ndarray, ibuf: np.ndarray, info) -> np.ndarray:
    """ULP of D at |values| (same as metrics.ulp_of): exponent bits, floored at e_min."""
    np.bitwise_and(abs_vals.view(np.int64), _EXP_MASK, out=ibuf)
    np.multiply(ibuf.view(np.float64), 2.0 ** -info.mantissa_bits, out=out)
    np.maximum(out, 2.0 ** (info.e_min - info.mantissa_bits), out=out)
    return out


class _Top:
    """The k largest positive scores seen and their flat indices."""

    def __init__(self, k=5):
        self.k = k
        self.items: list[tuple[float, int]] = []

    def thr(self) -> float:
        return self.items[-1][0] if len(self.items) >= self.k else 0.0

    def update(self, score: np.ndarray, offset: int) -> None:
        thr = self.thr()
        if score.size == 0 or not score.max() > thr:
            return
        idx = np.flatnonzero(score > thr)
        if idx.size > 4 * self.k:
            part = np.argpartition(score[idx], -self.k)[-self.k:]
            idx = idx[part]
        self.merge([(float(score[i]), int(i) + offset) for i in idx])

    def merge(self, items) -> None:
        self.items = sorted(self.items + list(items), key=lambda t: (-t[0], t[1]))[: self.k]


def _work(d: np.ndarray, b: np.ndarray, lo: int, hi: int, info, tiny: float, spec: _Spec):
    with np.errstate(all="ignore"):
        return _work_inner(d, b, lo, hi, info, tiny, spec)


def _work_inner(d, b, lo, hi, info, tiny, spec):
    C = CHUNK
    f8 = np.float64
    diff, ae, ab, rel, t1, t2, t3 = (np.empty(C, f8) for _ in range(7))
    ib = np.empty(C, np.int64)
    ddt = d.dtype if info.name != "bfloat16" else np.float32
    bdbuf = np.empty(C, ddt)
    m1, m2, m3 = (np.empty(C, bool) for _ in range(3))
    r: dict = {"sum_ae": 0.0, "max_ab": 0.0}
    lt = {x: 0 for x in spec.rel_lt}
    if spec.thr is not None:
        r["thr"] = [0, 0, 0]
    if spec.bm is not None:
        r["bm"] = [0, 0, 0.0, 0.0, 0.0]
    if spec.ulp_t is not None:
        r["ulp"] = [0.0, 0.0, 0]
    if spec.signs:
        r["signs"] = [0, 0, 0, 0]
    if spec.bias_q is not None:
        r["bias"] = [0, 0.0, 0.0]
    if spec.scaled_rms is not None:
        r["scaled"] = [0.0, 0.0]
    if spec.top is not None:
        r["top"] = 0.0
    if spec.th_scaled is not None:
        r["th_scaled"] = 0
    if spec.abs_scaled is not None:
        r["abs_scaled"] = 0
    if spec.legacy:
        r["legacy"] = [0.0, 0.0, 0.0, 0.0]
    top = _Top()
    need_rel = bool(spec.rel_lt) or spec.thr is not None or spec.bm is not None \
        or spec.th_scaled is not None or spec.abs_scaled is not None or spec.offend == "rel"
    # over |b| >= q >= floor*rms the top check's scale is |b| itself: reuse the own-ULP error
    top_shared = spec.top is not None and spec.top[1] <= spec.top[0]
    need_own_ulp = spec.ulp_t is not None or spec.bias_q is not None or top_shared
    for o in range(lo, hi, C):
        dc, bc = d[o:o + C], b[o:o + C]
        m = dc.size
        if m != C:
            diff, ae, ab, rel, t1, t2, t3, ib, bdbuf, m1, m2, m3 = (
                x[:m] for x in (diff, ae, ab, rel, t1, t2, t3, ib, bdbuf, m1, m2, m3))
        np.subtract(dc, bc, out=diff, dtype=f8)
        np.abs(diff, out=ae)
        np.abs(bc, out=ab, dtype=f8)
        r["sum_ae"] += float(ae.sum())
        r["max_ab"] = max(r["max_ab"], float(ab.max()))
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
            lg[0] += float(np.dot(d8, d8))
            lg[1] += float(np.dot(bc, bc)) if bc.dtype == f8 else float(np.dot(ab, ab))
            lg[2] += float(np.dot(d8, bc)) if bc.dtype == f8 else float(
                np.dot(d8, bc.astype(f8)))
            lg[3] = max(lg[3], float(ae.max()))
        small_n = 0
        if spec.thr is not None:
            rtol, small, atol = spec.thr
            np.less_equal(ab, small, out=m1)              # small mask
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
            np.less_equal(ab, small, out=m1)
            ns = int(np.count_nonzero(m1))
            bm[0] += ns
            if ns:
                np.greater(ae, atol, out=m2)
                bm[1] += int(np.count_nonzero(m2 & m1))
                np.logical_not(m1, out=m1)                 # normal mask
                if ns < m:          # masked sums by multiplying with the 0/1 mask
                    np.multiply(ae, m1, out=t1)
                    bm[2] += float(np.dot(t1, t1))
                    np.multiply(rel, m1, out=t1)
                    bm[3] = max(bm[3], float(t1.max()))
                    bm[4] += float(t1.sum())
            else:
                bm[2] += float(np.dot(ae, ae))
                bm[3] = max(bm[3], float(rel.max()))
                bm[4] += float(rel.sum())
        if spec.th_scaled is not None:
            rms, fac = spec.th_scaled
            np.maximum(ab, rms, out=t1)
            t1 *= fac
            np.less(ae, t1, out=m1)
            np.less(rel, 0.001, out=m2)
            np.logical_or(m1, m2, out=m1)
            r["th_scaled"] += int(np.count_nonzero(m1))
        if need_own_ulp:
            ulp = _ulp_into(ab, t1, ib, info)
        if spec.ulp_t is not None or top_shared:
            err = t2
            np.divide(ae, ulp, out=err)
        if spec.ulp_t is not None:
            u = r["ulp"]
            u[0] = max(u[0], float(err.max()))
            u[1] += float(err.sum())
            np.greater(err, spec.ulp_t, out=m1)
            u[2] += int(np.count_nonzero(m1))
            if spec.offend == "ulp":
                top.update(err, o)
        if top_shared:
            np.greater_equal(ab, spec.top[0], out=m2)
            np.multiply(err, m2, out=t3)                    # errors are >= 0
            r["top"] = max(r["top"], float(t3.max()))
        if spec.signs:
            bd = _bench_in_d(bc, info, bdbuf)
            dd = dc
            np.greater(dd, bd, out=m1)
            np.less(dd, bd, out=m2)
            s = r["signs"]
            s[0] += int(np.count_nonzero(m1))
            s[1] += int(np.count_nonzero(m2))
            np.greater(bc, 0, out=m3)
            up_pos = int(np.count_nonzero(m1 & m3))
            down_pos = int(np.count_nonzero(m2 & m3))
            np.less(bc, 0, out=m3)
            up_neg = int(np.count_nonzero(m1 & m3))
            down_neg = int(np.count_nonzero(m2 & m3))
            s[2] += up_pos + down_neg
            s[3] += down_pos + up_neg
        if spec.bias_q is not None:
            np.greater_equal(ab, spec.bias_q, out=m1)
            nu = int(np.count_nonzero(m1))
            if nu:
                signed = t2
                np.divide(diff, ulp, out=signed)
                np.minimum(signed, 64.0, out=signed)
                np.maximum(signed, -64.0, out=signed)
                np.multiply(signed, m1, out=signed)        # zero outside the upper half
                bi = r["bias"]
                bi[0] += nu
                bi[1] += float(signed.sum())
                if bc.dtype == f8:
                    torch.sign(torch.from_numpy(bc), out=torch.from_numpy(t3))
                else:
                    np.sign(bc, out=t3)
                bi[2] += float(np.dot(signed, t3))
        if spec.scaled_rms is not None:
            np.maximum(ab, spec.scaled_rms, out=rel if not need_rel else t2)
            tmp = rel if not need_rel else t2
            u = _ulp_into(tmp, t1, ib, info)
            np.divide(ae, u, out=tmp)
            sc = r["scaled"]
            sc[0] = max(sc[0], float(tmp.max()))
            sc[1] += float(tmp.sum())
            if spec.offend == "scaled":
                top.update(tmp, o)
        if spec.top is not None and not top_shared:
            q, floor_rms = spec.top
            np.greater_equal(ab, q, out=m1)
            if m1.any():
                np.maximum(ab, floor_rms, out=t2)
                u = _ulp_into(t2, t1, ib, info)
                np.divide(ae, u, out=t2)
                np.multiply(t2, m1, out=t2)                 # errors are >= 0
                r["top"] = max(r["top"], float(t2.max()))
        if spec.offend == "rel":
            top.update(rel, o)
    r["rel_lt"] = lt
    r["offenders"] = top.items
    return r


def _merge(parts: list[dict]) -> dict:
    out = dict(parts[0])
    for p in parts[1:]:
        out["sum_ae"] += p["sum_ae"]
        out["max_ab"] = max(out["max_ab"], p["max_ab"])
        out["rel_lt"] = {k: v + p["rel_lt"][k] for k, v in out["rel_lt"].items()}
        for key in ("thr", "signs", "bias"):
            if key in out:
                out[key] = [a + b for a, b in zip(out[key], p[key])]
        if "bm" in out:
            a, b = out["bm"], p["bm"]
            out["bm"] = [a[0] + b[0], a[1] + b[1], a[2] + b[2], max(a[3], b[3]), a[4] + b[4]]
        if "ulp" in out:
            a, b = out["ulp"], p["ulp"]
            out["ulp"] = [max(a[0], b[0]), a[1] + b[1], a[2] + b[2]]
        if "scaled" in out:
            a, b = out["scaled"], p["scaled"]
            out["scaled"] = [max(a[0], b[0]), a[1] + b[1]]
        for key in ("top",):
            if key in out:
                out[key] = max(out[key], p[key])
        for key in ("th_scaled", "abs_scaled"):
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


def run(pair, **kw) -> dict | None:
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
    nthreads = _threads() if n >= 4 * CHUNK else 1
    if nthreads > 1:
        step = -(-n // nthreads // CHUNK) * CHUNK
        bounds = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
        pool = _get_pool()
        futures = [pool.submit(_work, d, b, lo, hi, pair.info, pair.tiny, spec)
                   for lo, hi in bounds]
        res = _merge([f.result() for f in futures])
    else:
        res = _work(d, b, 0, n, pair.info, pair.tiny, spec)
    if not (math.isfinite(res["sum_ae"]) and res["max_ab"] <= pair.info.max_finite):
        pair._cache["fast_nonfinite"] = True
        return None
    pair.mark_all_finite()
    if spec.legacy:
        pair._cache["fast_legacy"] = res
    return res


def bench_sumsq(pair) -> float:
    """sum(b**2) over the bench in float64 (cached)."""
    def compute():
        _, b = raw_views(pair)
        if b.dtype == np.float64:
            return float(np.dot(b, b))
        total = 0.0
        for o in range(0, b.size, 1 << 20):
            c = b[o:o + (1 << 20)].astype(np.float64)
            total += float(np.dot(c, c))
        return total
    return pair.cached("fast_sumsq", compute)


def rms_or_none(pair) -> float | None:
    """RMS of the bench, when the plain formula is safe (no over/underflow); else None."""
    n = pair.n
    s = bench_sumsq(pair)
    if not (math.isfinite(s) and n * 1e-300 < s < 1e300):
        return None
    return float(math.sqrt(s / n))


def abs_b_quantiles(pair, qs) -> list[float]:
    """Quantiles ('lower') of |b| on the strided sample the plain path uses (all finite)."""
    from .single_run import QUANTILE_SAMPLE
    _, b = raw_views(pair)
    step = max(1, b.size // QUANTILE_SAMPLE)
    sample = np.abs(b[::step]).astype(np.float64, copy=False)
    n = sample.size
    # numpy's 'lower' quantile is the order statistic floor((n - 1) * q)
    ks = [int(np.floor((n - 1) * np.float64(q))) for q in qs]
    return [float(v) for v in _kth_values(sample, ks)]


def _kth_values(x: np.ndarray, ks) -> list:
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
    out = []
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


def offenders(pair, items) -> tuple:
    """Offender tuples from (score, flat index) pairs."""
    from .verdict import Offender
    d, b = raw_views(pair)
    shape = pair.shape or ()
    return tuple(Offender(tuple(int(x) for x in np.unravel_index(i, shape)) if shape else (),
                          float(d[i]), float(b[i])) for s, i in items if s > 0)


def binary_scan(pair, k: int = 5) -> tuple[int, list]:
    """(#elements with d != b rounded to D, NaN matching NaN; the first k such indices)."""
    d, b = raw_views(pair)
    info = pair.info

    def work(lo, hi):
        with np.errstate(all="ignore"):
            buf = np.empty(CHUNK, d.dtype if info.name != "bfloat16" else np.float32)
            ne = np.empty(CHUNK, bool)
            count, first = 0, []
            for o in range(lo, hi, CHUNK):
                dc, bc = d[o:o + CHUNK], b[o:o + CHUNK]
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
    if n >= 4 * CHUNK and _threads() > 1:
        step = -(-n // 2 // CHUNK) * CHUNK
        pool = _get_pool()
        parts = [f.result() for f in [pool.submit(work, lo, min(lo + step, n))
                                      for lo in range(0, n, step)]]
    else:
        parts = [work(0, n)]
    return sum(c for c, _ in parts), [i for _, f in parts for i in f][:k]
