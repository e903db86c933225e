"""Flush to zero: a device that flushes subnormal results to zero is correct in that mode.

Why. Many accelerators flush subnormal floating-point results (and read subnormal
inputs) as zero for speed: CUDA documents `-ftz=true` for single precision (the
default under `--use_fast_math`), x86 CPUs have the FTZ and DAZ bits (torch's
`set_flush_denormal`), and many AI accelerators run so by default. A flushed element is
off its bench by less than D's smallest normal value, an absolute error no user sees, but
it is the whole of a subnormal value: its relative error is 1 and its error in ULPs of
D's subnormal spacing is up to 2**m. A test that measures either (the single-run rule's
ULP errors where an output is all subnormal, the thousandth standard's relative error,
msprobe's ULP standard, the float16 absolute threshold: 2**-16 is below float16's
largest subnormal) fails a device that is correct within its documented mode.

The rule, applied only to a verdict that failed (a pass costs nothing): the elements
where the device gives zero and the bench rounded to D is a nonzero subnormal of D --
what a flush of the result makes -- are judged as if the device had rounded them
correctly (the bench rounded to D); where that judgement is better, it stands, with
`subnormals_flushed` (how many) in its metrics: the flush made the difference. An
element the device flushed whose bench is a normal value of D (a sum of flushed
subnormal terms that reaches D's normal range) is not excused: it is judged as any
other. The sign tests leave it out near zero (near_zero.py: a flush of float32 or
bfloat16 terms stays far inside small_atol), msprobe's ULP rule and the single-run
magnitude tests do not (a bfloat16 matmul of products of 2**-64 x 2**-64, each flushed
in the float32 accumulator, fails msprobe's ULP rule in flush-to-zero mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from .dtypes import Array
from .metrics import Pair
from .verdict import STATUS_ORDER, Verdict

__all__ = ["FLUSHED_KEY", "flushed_mask", "judge_as_flushed"]

#: the metric that counts the elements a flush explained
FLUSHED_KEY = "subnormals_flushed"


def flushed_mask(pair: Pair) -> Array:
    """Per element (of all, flat): the device gives zero where the bench rounded to D is
    a nonzero subnormal of D."""
    b_d = np.abs(pair.b_rounded)
    mask: Array = (pair.d == 0) & (b_d > 0) & (b_d < 2.0**pair.info.e_min)
    return mask


def _unflush(pair: Pair, flushed: Array) -> Pair:
    """The pair with the flushed elements set to the bench rounded to D, in D, and the
    caller's facts of each element (terms, groups, rounded_once, near-zero limits)."""
    values = np.where(flushed, pair.b_rounded, pair.d).reshape(pair.shape)
    device = torch.from_numpy(values).to(pair.info.torch_dtype)
    out = Pair(
        pair.bench_src,
        device,
        pair.info,
        bench_dtype=pair.bench_dtype,
        device_dtype=pair.device_dtype,
        path=pair.path,
    )
    out.want_legacy = pair.want_legacy
    out.terms_src, out.groups_src, out.rounded_once_src = pair.terms_src, pair.groups_src, pair.rounded_once_src
    out.near_zero_limits = pair.near_zero_limits
    return out


def judge_as_flushed(pair: Pair, verdict: Verdict, judge: Callable[[Pair], Verdict]) -> Verdict:
    """`verdict`, or, where it failed and the device flushed subnormal results, the
    verdict of the flushed elements taken as correctly rounded if it is better, noting
    how many (module docstring). `judge`: the standard, with its thresholds and reference."""
    if verdict.status not in ("error", "warning") or pair.exact is not None or pair.n == 0:
        return verdict
    flushed = flushed_mask(pair)
    count = int(np.count_nonzero(flushed))
    if count == 0:
        return verdict
    again = judge(_unflush(pair, flushed))
    if STATUS_ORDER[again.status] >= STATUS_ORDER[verdict.status]:
        return verdict
    return dataclasses.replace(again, metrics={**again.metrics, FLUSHED_KEY: float(count)})
