"""The chunked passes' shared machinery: the chunk size, the one chunk iterator, the
two-thread split, and the float64 primitives every pass computes with.

Why chunks: a pass over cache-sized pieces (CHUNK elements, a few buffers per thread,
reused by every chunk) reads each element from memory once, where whole-array numpy
would make a dozen full-size temporaries, each a pass over memory that also pays
first-touch page faults. Why two threads: numpy releases the GIL inside ufuncs; no BLAS
call inside (`dot`): its own threads contend with ours.

Used by the fused pass (accumulators.py, fast.py), the specialised scans (scans.py) and,
through BiasSums, by both paths of the bias statistics (bias.py, single_run.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch
from numpy.typing import DTypeLike

from .dtypes import Array, DtypeInfo
from .near_zero import left_out

__all__ = ["CHUNK", "BIAS_CLIP", "BiasSums", "chunks", "in_halves", "in_threads", "raw"]

#: elements per chunk (measured on this 2-core EPYC, two threads: 2**16 and 2**17 within
#: +-10% of each other, 2**15 1.5x and 2**14 3x slower -- each ufunc call re-takes the GIL)
CHUNK = 1 << 16
_EXP_MASK = np.int64(0x7FF0000000000000)
#: clip of signed ULP errors in the bias statistics (keeps cancellation noise bounded)
BIAS_CLIP = 64.0

_T = TypeVar("_T")
_W = TypeVar("_W")

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _after_fork_in_child() -> None:
    """A forked child has no pool threads: start a fresh pool when next needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def threads() -> int:
    return min(2, os.cpu_count() or 1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=threads(), thread_name_prefix="msprobe-std")
        return _pool


def in_threads(work: Callable[[_W], _T], parts: Sequence[_W]) -> list[_T]:
    """work(part) for each part, each in a pool thread when there are several, in order."""
    if len(parts) == 1:
        return [work(parts[0])]
    pool = _get_pool()
    return [future.result() for future in [pool.submit(work, part) for part in parts]]


def in_halves(work: Callable[[int, int], _T], n: int) -> list[_T]:
    """work(lo, hi) over [0, n): in two threads, chunk-aligned halves, when n is large.
    (Measured: 16 smaller tasks, to balance a core shared with another process, were
    5-15% slower than halves on every standard.)"""
    if n >= 4 * CHUNK and threads() > 1:
        step = -(-n // 2 // CHUNK) * CHUNK
        return in_threads(lambda lo: work(lo, min(lo + step, n)), range(0, n, step))
    return [work(0, n)]


def chunks(d: Array, b: Array, starts: Iterable[int]) -> Iterator[tuple[int, Array, Array]]:
    """(offset, device chunk, bench chunk) at each start: the loop of every chunked pass.
    Starts are multiples of CHUNK, so offset // CHUNK numbers the chunk."""
    for offset in starts:
        yield offset, d[offset : offset + CHUNK], b[offset : offset + CHUNK]


def raw(x: Array | torch.Tensor) -> Array:
    """A flat numpy view (no copy where possible) in a numpy dtype holding x exactly."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)  # exact
        return t.contiguous().reshape(-1).numpy()
    return np.ascontiguousarray(x).reshape(-1)


def d_buffer_dtype(dtype: DTypeLike, info: DtypeInfo) -> DTypeLike:
    """The numpy dtype of a buffer holding the bench rounded to D (bench_in_d)."""
    return np.float32 if info.name == "bfloat16" else dtype


def bench_in_d(bench: Array, info: DtypeInfo, buf: Array) -> Array:
    """The bench chunk rounded to D, in D's numpy dtype (float32 for bfloat16)."""
    if info.name == "float64":
        return bench
    if info.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(bench)).to(torch.bfloat16).to(torch.float32).numpy()
    out = buf[: bench.size]
    np.copyto(out, bench, casting="unsafe")
    return out


def diff_into(device: Array, bench: Array, diff: Array, bench64: Array) -> Array:
    """diff = d - b and bench64 = b in float64, exactly as np.subtract(d, b, dtype=float64),
    but each operand cast by copyto first: a ufunc casting its inputs itself is 3-4x
    slower (2**16 float32 - float64 elements: 77 us vs 10 + 20 us). -> b in float64 (the
    bench itself where it is float64, else bench64 filled)."""
    if bench.dtype == np.float64:
        bench64 = bench
    else:
        np.copyto(bench64, bench)
    if device.dtype == np.float64:
        np.subtract(device, bench64, out=diff)
    else:
        np.copyto(diff, device)
        np.subtract(diff, bench64, out=diff)
    return bench64


def pow2_into(abs_vals: Array, out: Array, clamp: float) -> Array:
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


def dot(a: Array, b: Array, tmp: Array) -> float:
    """sum(a * b) by numpy's own loops, not np.dot: that calls the BLAS, whose threads
    contend with the pool's (measured: the two-thread pass 2.5x slower than one thread,
    with OpenBLAS)."""
    np.multiply(a, b, out=tmp)
    return float(tmp.sum())


class BiasSums:
    """The single-run rule's bias counts and sums over the sampled blocks of elements
    (single_run.py: which blocks, and `bias.statistics`, which turns them into metrics).
    Both paths `add` the same blocks, with their own arrays: d and b_D (the bench rounded
    to D) in D's dtype or float64, b in its own, d - b and |b| in float64. The elements
    near zero that near_zero.left_out names (`limits` = (small, small_atol)) are counted
    apart and left out of every other count and sum.

    sums = [#(d > b_D), #(d < b_D), #outward (d - b_D has the sign of b), #inward,
            #upper (|b| >= q), sum of the clipped signed own-ULP errors over the upper
            elements, the same times sign(b), the sum of their squares, #left out]
    """

    def __init__(self, info: DtypeInfo, q: float, size: int, limits: tuple[float, float]) -> None:
        self.info, self.q, self.limits = info, q, limits
        self.unit = 2.0**info.mantissa_bits  # ULPs per 2**e (pow2_into)
        self.clamp = 2.0**info.e_min
        cap = min(CHUNK, size)  # the largest block
        self.signed, self.w, self.tmp = (np.empty(cap) for _ in range(3))
        self.masks = [np.empty(cap, bool) for _ in range(6)]
        self.sums: list[float] = [0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0]

    def add(self, d: Array, b_d: Array, b: Array, diff: Array, abs_b: Array) -> None:
        """One block (at most CHUNK elements, all finite).

        Measured per 2**16-element block (numpy 1.26): comparisons and logical ops on
        masks and mask counts are cheap (2-9 us), float64 ufuncs with a scalar or a cast
        are not (minimum/maximum 30-50 us, a bool operand cast inside multiply 50 us); so
        the b < 0 mask is derived where no b is 0, the near-zero test reads only the
        elements below `small`, and only where |b|'s minimum says there are any, the clip
        runs only where an error is past it, and the signed sums are two masked sums, not
        three.
        """
        m = d.size
        signed, w, prod = self.signed[:m], self.w[:m], self.tmp[:m]
        up, down, pos, neg, tmp, kept = (x[:m] for x in self.masks)
        count, s = np.count_nonzero, self.sums
        np.greater(d, b_d, out=up)
        np.less(d, b_d, out=down)
        np.greater(b, 0, out=pos)
        np.divide(diff, pow2_into(abs_b, w, self.clamp), out=signed)  # exact
        lim = BIAS_CLIP / self.unit
        clipped = not -lim <= float(signed.min()) <= float(signed.max()) <= lim
        abs_b_min = float(abs_b.min())
        # past the clip relative to a normal |b| is past it in ULPs too: only a clipped
        # block, or one with a subnormal or zero |b|, can hold an element left out
        near = (
            (clipped or abs_b_min < self.clamp) and abs_b_min <= self.limits[0] and self._leave_out(diff, abs_b, kept)
        )
        if near:
            np.logical_and(up, kept, out=up)
            np.logical_and(down, kept, out=down)
        n_up, n_down = int(count(up)), int(count(down))
        s[0] += n_up
        s[1] += n_down
        up_pos = int(count(np.logical_and(up, pos, out=tmp)))
        down_pos = int(count(np.logical_and(down, pos, out=tmp)))
        no_zero = abs_b_min > 0.0
        if no_zero:  # b < 0 wherever not b > 0
            up_neg, down_neg = n_up - up_pos, n_down - down_pos
        else:
            np.less(b, 0, out=neg)
            up_neg = int(count(np.logical_and(up, neg, out=tmp)))
            down_neg = int(count(np.logical_and(down, neg, out=tmp)))
        s[2] += up_pos + down_neg
        s[3] += down_pos + up_neg
        if clipped:
            np.minimum(signed, lim, out=signed)
            np.maximum(signed, -lim, out=signed)
        upper = np.greater_equal(abs_b, self.q, out=up)
        if near:
            np.logical_and(upper, kept, out=upper)
        n_upper = int(count(upper))
        s[4] += n_upper
        if n_upper == 0:
            return
        np.copyto(w, upper)  # masked sums as dot products
        total = self.unit * dot(signed, w, prod)
        s[5] += total
        s[7] += self.unit * self.unit * dot(prod, signed, prod)
        if no_zero or self.q > 0.0:  # every upper element is > 0 or < 0
            np.copyto(w, np.logical_and(upper, pos, out=down))
            s[6] += 2.0 * self.unit * dot(signed, w, prod) - total
        else:
            for sign, mask in (
                (1, np.logical_and(upper, pos, out=down)),
                (-1, np.logical_and(upper, np.less(b, 0, out=neg), out=tmp)),
            ):
                np.copyto(w, mask)
                s[6] += sign * self.unit * dot(signed, w, prod)

    def _leave_out(self, diff: Array, abs_b: Array, kept: Array) -> bool:
        """Whether any element is left out (near_zero.left_out); then `kept` holds the
        others. Counts those left out."""
        out = np.flatnonzero(left_out(abs_b, np.abs(diff), BIAS_CLIP / self.unit, self.limits))
        self.sums[8] += out.size
        if out.size:
            kept.fill(True)
            kept[out] = False
        return out.size > 0
