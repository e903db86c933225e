"""The fused, chunked path of the shipped standards for large, all-finite outputs.

Why: judging a 2**24-element output the plain way (metrics.Pair) makes float64 copies
of both sides, the bench rounded to D, and a dozen full-size temporaries (abs_err,
rel_err, masks, ULPs), each a pass over memory that also pays first-touch page faults.
Here every quantity a standard needs is computed in ONE pass over cache-sized chunks
(CHUNK elements, a few reused float64 buffers per thread that stay in L2), in two
threads (numpy releases the GIL inside ufuncs), and only sums, counts and maxima leave
the chunk loop. The five worst elements are found by a second pass (`worst`) only for a
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
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = ["FAST_MIN_N", "CHUNK", "run", "raw_views", "fast_ok"]

#: outputs smaller than this take the plain path (tests lower it to exercise this one)
FAST_MIN_N = 1 << 16
#: elements per chunk (measured: 2**16 beats 2**14-2**15 and 2**18 on this 2-core EPYC)
CHUNK = 1 << 16
_EXP_MASK = np.int64(0x7FF0000000000000)
#: signed ULP errors are clipped here in the bias statistics (metrics.BIAS_CLIP_ULP)
BIAS_CLIP = 64.0
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


def _in_halves(work, n: int) -> list:
    """work(lo, hi) over [0, n): in two threads, chunk-aligned halves, when n is large."""
    if n >= 4 * CHUNK and _threads() > 1:
        step = -(-n // 2 // CHUNK) * CHUNK
        pool = _get_pool()
        return [f.result() for f in [pool.submit(work, lo, min(lo + step, n)) for lo in range(0, n, step)]]
    return [work(0, n)]


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
    """May this pair take the fused path? The shipped standards ask without their
    reference (all have a fused reference mode); passing one keeps the old answer, no."""
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
        self.bm_ideal = False            # with bm: the same of the bench rounded to D
        self.ulp_t = None                # T: max/sum/count(> T) of own-ULP error
        self.signs = False               # pos, neg, outward, inward vs bench rounded to D
                                         # ("eb": pos, neg only; outward, inward stay 0)
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


def _ulp_scalar(x: float, info) -> float:
    """ULP of D at |x| (metrics.ulp_of for one value)."""
    from .metrics import ulp_of
    return float(ulp_of(np.array([abs(float(x))]), info)[0])


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
    t4 = np.empty(C if spec.bias_q is not None and spec.bias_q <= 0 else 0, f8)
    ib = np.empty(C, np.int64)
    ddt = d.dtype if info.name != "bfloat16" else np.float32
    bdbuf = np.empty(C, ddt)
    m1, m2, m3, m4 = (np.empty(C, bool) for _ in range(4))
    r: dict = {"fin": 0.0, "max_ab": 0.0}
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
    need_own_ulp = (spec.ulp_t is not None or spec.bias_q is not None or top_shared
                    or spec.offend == "ulp")
    # the own-ULP error replaces |d - b| where nothing else reads it
    need_ae = (need_rel or spec.legacy or not need_own_ulp or spec.scaled_rms is not None
               or (spec.top is not None and not top_shared))
    # ulp(max(|b|, rms)) = max(ulp(|b|), ulp(rms)): the scaled error is min(own, |d-b|/ulp(rms))
    inv_u_rms = None
    if spec.scaled_rms is not None and need_own_ulp:
        inv_u_rms = 1.0 / float(_ulp_scalar(spec.scaled_rms, info))
    # positive/negative halves of the upper half by |b| (q > 0: no zero is in it)
    bias_split = spec.bias_q is not None and spec.bias_q > 0
    int_ulp = info.name != "float64"     # ULP bits by integer arithmetic (normal in float64)
    ulp_shift = np.int64(info.mantissa_bits << 52)
    ulp_floor = 2.0 ** (info.e_min - info.mantissa_bits)
    for o in range(lo, hi, C):
        dc, bc = d[o:o + C], b[o:o + C]
        m = dc.size
        if m != C:
            diff, ae, ab, rel, t1, t2, t3, t4, ib, bdbuf, m1, m2, m3, m4 = (
                x[:m] for x in (diff, ae, ab, rel, t1, t2, t3, t4, ib, bdbuf, m1, m2, m3, m4))
        bd = None                                         # the bench rounded to D
        np.subtract(dc, bc, out=diff, dtype=f8)
        np.abs(bc, out=ab, dtype=f8)
        r["max_ab"] = max(r["max_ab"], float(ab.max()))
        if need_ae:
            np.abs(diff, out=ae)
            if not need_own_ulp:
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
            if spec.bm_ideal:       # benchmark.py's `_ideal`: d = the bench rounded to D
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
                    if ns < m:
                        np.logical_not(m3, out=m3)         # normal mask
                        np.multiply(ia, m3, out=ia)
                        bi[1] += float(np.dot(ia, ia))
                        np.multiply(ir, m3, out=ir)
                        bi[2] = max(bi[2], float(ir.max()))
                        bi[3] += float(ir.sum())
                else:
                    bi[1] += float(np.dot(ia, ia))
                    bi[2] = max(bi[2], float(ir.max()))
                    bi[3] += float(ir.sum())
        if spec.th_scaled is not None:
            rms, fac = spec.th_scaled
            np.maximum(ab, rms, out=t1)
            t1 *= fac
            np.less(ae, t1, out=m1)
            np.less(rel, 0.001, out=m2)
            np.logical_or(m1, m2, out=m1)
            r["th_scaled"] += int(np.count_nonzero(m1))
        cmax = None
        if need_own_ulp:
            if int_ulp:     # 2**(e - m) from the exponent bits, floored at 2**(e_min - m)
                np.bitwise_and(ab.view(np.int64), _EXP_MASK, out=ib)
                np.subtract(ib, ulp_shift, out=ib)
                ulp = ib.view(f8)
                np.maximum(ulp, ulp_floor, out=ulp)  # negative/-inf patterns -> the floor
            else:
                ulp = _ulp_into(ab, t1, ib, info)
            signed = t2
            np.divide(diff, ulp, out=signed)              # exact: ulp is a power of two
            err = t3
            np.abs(signed, out=err)
            cmax = float(err.max())
            if spec.ulp_t is None:
                r["fin"] += cmax
        if spec.ulp_t is not None:
            u = r["ulp"]
            u[0] = max(u[0], cmax)
            esum = float(err.sum())
            r["fin"] += esum
            u[1] += esum
            np.greater(err, spec.ulp_t, out=m1)
            u[2] += int(np.count_nonzero(m1))
        if spec.offend == "ulp":
            top.update(err, o)
        if top_shared and cmax > r["top"]:                # else no top element can beat it
            np.greater_equal(ab, spec.top[0], out=m2)
            np.multiply(err, m2, out=rel if not need_rel else t1)   # errors are >= 0
            r["top"] = max(r["top"], float((rel if not need_rel else t1).max()))
        if spec.bias_q is not None:
            q = spec.bias_q
            if cmax > BIAS_CLIP:
                np.minimum(signed, BIAS_CLIP, out=signed)
                np.maximum(signed, -BIAS_CLIP, out=signed)
            bi = r["bias"]
            if bias_split:          # sums over b >= q and b <= -q: sign(b) is +-1 there
                np.greater_equal(bc, q, out=m1)
                np.less_equal(bc, -q, out=m2)
                npos, nneg = int(np.count_nonzero(m1)), int(np.count_nonzero(m2))
                sp = sn = 0.0
                if npos:
                    np.multiply(signed, m1, out=ae if not need_ae else t1)
                    sp = float((ae if not need_ae else t1).sum())
                if nneg:
                    np.multiply(signed, m2, out=ae if not need_ae else t1)
                    sn = float((ae if not need_ae else t1).sum())
                bi[0] += npos + nneg
                bi[1] += sp + sn
                bi[2] += sp - sn
            else:
                np.greater_equal(ab, q, out=m1)
                nu = int(np.count_nonzero(m1))
                if nu:
                    sb = ae if not need_ae else t1
                    np.multiply(signed, m1, out=sb)        # zero outside the upper half
                    bi[0] += nu
                    bi[1] += float(sb.sum())
                    np.sign(bc, out=t4)
                    bi[2] += float(np.dot(sb, t4))
        if spec.scaled_rms is not None:
            if inv_u_rms is not None:
                tmp = t1 if need_rel else rel
                np.multiply(ae, inv_u_rms, out=tmp)       # exact: a power of two
                np.minimum(tmp, err, out=tmp)
            else:
                tmp = rel if not need_rel else t2
                np.maximum(ab, spec.scaled_rms, out=tmp)
                u = _ulp_into(tmp, t1, ib, info)
                np.divide(ae, u, out=tmp)
            sc = r["scaled"]
            sc[0] = max(sc[0], float(tmp.max()))
            sc[1] += float(tmp.sum())
            if spec.offend == "scaled":
                top.update(tmp, o)
        if spec.signs:
            if bd is None:
                bd = _bench_in_d(bc, info, bdbuf)
            np.greater(dc, bd, out=m1)
            np.less(dc, bd, out=m2)
            s = r["signs"]
            up, down = int(np.count_nonzero(m1)), int(np.count_nonzero(m2))
            s[0] += up
            s[1] += down
        if spec.signs and spec.signs != "eb":         # "eb": the error balance's counts only
            np.greater(bc, 0, out=m3)
            np.logical_and(m1, m3, out=m4)
            up_pos = int(np.count_nonzero(m4))
            np.logical_and(m2, m3, out=m4)
            down_pos = int(np.count_nonzero(m4))
            if float(ab.min()) > 0.0:
                up_neg, down_neg = up - up_pos, down - down_pos      # no b == 0
            else:
                np.less(bc, 0, out=m3)
                np.logical_and(m1, m3, out=m4)
                up_neg = int(np.count_nonzero(m4))
                np.logical_and(m2, m3, out=m4)
                down_neg = int(np.count_nonzero(m4))
            s[2] += up_pos + down_neg
            s[3] += down_pos + up_neg
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
        out["fin"] += p["fin"]
        out["max_ab"] = max(out["max_ab"], p["max_ab"])
        out["rel_lt"] = {k: v + p["rel_lt"][k] for k, v in out["rel_lt"].items()}
        for key in ("thr", "signs", "bias"):
            if key in out:
                out[key] = [a + b for a, b in zip(out[key], p[key])]
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
    if not (math.isfinite(res["fin"]) and res["max_ab"] <= pair.info.max_finite):
        pair._cache["fast_nonfinite"] = True
        return None
    pair.mark_all_finite()
    if spec.legacy:
        pair._cache["fast_legacy"] = res
    return res


def worst(pair, offend: str, **kw) -> tuple:
    """The five worst elements by `offend` ("rel", "score", "ulp", "scaled"): a second
    pass, run only for a verdict that is not a pass (its message shows them)."""
    res = run(pair, offend=offend, **kw)
    return offenders(pair, res["offenders"]) if res is not None else ()


#: relative margin of the float32 pre-test of thousandth_count (see there)
_TH_MARGIN = 2.0 ** -10


def thousandth_count(pair, limit: float = 0.001) -> int | None:
    """#elements with rel_err < limit, exactly as metrics.Pair counts them; None: not all
    finite (or D is float64), take another path.

    Most elements are decided in float32 (D is float32/float16/bfloat16): with b32 = b
    rounded to float32, |d - b32| < (1 - 2**-10) * limit * |b32| (float32 arithmetic)
    implies rel_err < limit in float64 -- b32 is within 2**-24 |b| of b and each float32
    operation within 2**-24 relative, together < 7e-5 of limit * |b| for limit = 0.001,
    far inside the 2**-10 margin (and below float32's normal range the bench's `tiny`
    dominates). Every other element is judged by the float64 formula itself, so the
    count is exact. Cost: one float32 pass (five ufuncs) instead of seven float64 ones.
    """
    if pair.info.name == "float64" or not 2.0 ** -24 / limit < _TH_MARGIN / 2:
        return None
    d, b = raw_views(pair)
    n = d.size
    c1 = np.float32(limit * (1 - _TH_MARGIN))
    bmax = np.float32(pair.info.max_finite) if pair.info.name != "float32" else None
    tiny = pair.tiny

    def work(lo, hi):
        with np.errstate(all="ignore"):
            C = CHUNK
            a = np.empty(C, np.float32)
            bb = np.empty(C, np.float32)
            ok = np.empty(C, bool)
            count, amax, babs = 0, 0.0, 0.0
            for o in range(lo, hi, C):
                dc, bc = d[o:o + C], b[o:o + C]
                m = dc.size
                if m != C:
                    a, bb, ok = a[:m], bb[:m], ok[:m]
                np.copyto(bb, bc, casting="unsafe")
                np.subtract(dc, bb, out=a, dtype=np.float32)
                np.abs(a, out=a)
                amax += float(a.max())             # inf/NaN anywhere -> not finite (a sum:
                                                   # Python's max() would drop a NaN)
                np.abs(bb, out=bb)
                if bmax is not None:
                    babs = max(babs, float(bb.max()))
                np.multiply(bb, c1, out=bb)
                np.less(a, bb, out=ok)
                k = int(np.count_nonzero(ok))
                if k < m:                                 # undecided: the float64 formula
                    idx = np.flatnonzero(~ok)
                    dd = dc[idx].astype(np.float64)
                    b8 = bc[idx].astype(np.float64)
                    rel = np.abs(dd - b8) / (np.abs(b8) + tiny)
                    k += int(np.count_nonzero(rel < limit))
                count += k
            return count, amax, babs

    parts = _in_halves(work, n)
    amax = max(p[1] for p in parts)
    if not math.isfinite(amax) or (bmax is not None and not max(p[2] for p in parts) <= bmax):
        pair._cache["fast_nonfinite"] = True
        return None
    pair.mark_all_finite()
    return sum(p[0] for p in parts)


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
    parts = _in_halves(work, n)
    return sum(c for c, _ in parts), [i for _, f in parts for i in f][:k]
