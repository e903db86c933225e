"""Thousandth (双千): convolutions must have 99.9% of elements within 0.1% relative error.

rel_err_thousandth = share of elements with rel_err < 0.001; pass iff >= 0.999.
Fix over msprobe (with or without a reference: neither a baseline nor another
implementation's run can make cancellation in D disappear):
a correct low-precision conv, and every conv GRADIENT (weight/input grads are long
reductions whose elements often cancel to ~0), cannot meet 0.1% everywhere -- in
bfloat16 rounding to D alone costs up to 2**-9 = 0.2%, and an fp32 weight grad of
2.1e-7 next to elements of 1e-4 is measured 0.18% off on the CPU. So an element also
counts as within when |d - b| < sr_thousandth_ulp * eps(D) * max(|b|, rms(b)), i.e. a few
ULPs of D at the output's scale (`scaled_thousandth`; fp16/bf16/fp8 4 ULP, real CPU conv
forward and backward measured <= 2.2; fp32 64 ULP = 7.6e-6 of the RMS, measured <= 6.1,
still 130x finer than 0.1%). The verdict passes if either share reaches the threshold,
so `scaled_thousandth` (= max(rel_err_thousandth, that share)) is computed and reported
only when rel_err_thousandth is below it. Unexpected inf/NaN is always an error. The
worst elements (by rel_err) are named only in a verdict that is not a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import fast, scans
from .bias import judge_bias, sample_step, statistics
from .metrics import Pair
from .pass_plan import PassSpec
from .pass_results import RelBelow, ThousandthScaled
from .single_run import at_least_normal, tolerance_scale
from .verdict import Reason

if TYPE_CHECKING:
    from .reference import Reference
    from .verdict import Offender, Status, Verdict

NAME = "thousandth"


@dataclass(frozen=True)
class _Judged:
    """What either path (fused or plain) computed, for the verdict `_finish` reaches: its
    metrics, the thresholds it names, the reasons so far, and its worst elements (a
    callable: computed only for a verdict that is not a pass)."""

    metrics: dict[str, float]
    used: dict[str, float]
    reasons: list[str]
    worst: Callable[[], tuple[Offender, ...]]


def thousandth(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict:
    """Judge a convolution by the share of elements within 0.1%."""
    judged = _fast(pair, thresholds, reference) if fast.fast_ok(pair) else None  # a reference changes only the kind
    return _finish(pair, judged or _plain(pair, thresholds, reference), reference)


def _plain(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None) -> _Judged:
    limit = thresholds["thousandth_min"]
    share = pair.rel_err_share_below(0.001)
    metrics = {"rel_err_thousandth": share}
    used = {"rel_err_thousandth": limit}
    reasons: list[str] = []
    nonfinite = pair.unexpected_nonfinite_reason()
    if nonfinite:
        reasons.append(nonfinite)
    if pair.n:
        ulps = thresholds["sr_thousandth_ulp"]
        used.update(scaled_thousandth=limit, sr_thousandth_ulp=ulps)
        if share < limit:  # the scaled share only matters (and is reported) then
            allowed = tolerance_scale(pair) * (ulps * pair.info.eps)
            good = int(np.count_nonzero((pair.abs_err < allowed) | (pair.rel_err < 0.001)))
            if pair.n_inf_nan:
                good += int(pair.inf_nan_agree(pair.info.defaults["rtol"]).sum())
            metrics["scaled_thousandth"] = max(share, good / pair.n)
    bias, bias_failed = judge_bias(pair, reference, thresholds, used, "sr_bias_ulp")
    return _Judged({**metrics, **bias}, used, reasons + bias_failed, lambda: pair.offenders(pair.rel_err))


def _fast(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> _Judged | None:
    """Large and all finite: a float32 pre-test (with the bias sums of the sample), else
    one fused pass (fast.py); None: the plain path."""
    limit = thresholds["thousandth_min"]
    sums = None
    q_half = fast.abs_b_quantiles(pair, (0.5,))[0] if reference is None else None
    counted = scans.thousandth_count(pair, 0.001, q_half, sample_step(pair.n))
    if counted is not None:
        count, sums = counted
    else:
        if pair.fused_nonfinite:
            return None
        res = fast.run(pair, PassSpec(rel_below=(0.001,)))
        if res is None:
            return None
        count = res.of(RelBelow).counts[0.001]
    share = count / pair.n
    ulps = thresholds["sr_thousandth_ulp"]
    metrics = {"rel_err_thousandth": share}
    if share < limit:
        rms = fast.rms_or_none(pair)
        spec = (
            PassSpec(thousandth_scaled=(at_least_normal(rms, pair.info), ulps * pair.info.eps))
            if rms is not None
            else None
        )
        res = fast.run(pair, spec) if spec is not None else None
        if res is None:
            return None
        metrics["scaled_thousandth"] = max(share, res.of(ThousandthScaled).count / pair.n)
    used = {"rel_err_thousandth": limit, "scaled_thousandth": limit, "sr_thousandth_ulp": ulps}
    computed = None
    if reference is None:  # the bias sums of the sample alone, from the raw arrays
        if sums is None:  # (the float32 pre-test has them)
            assert q_half is not None  # computed above for a check without a reference
            sums = scans.sampled_bias(pair, q_half, sample_step(pair.n))
        if sums is None:
            return None
        computed = statistics(sums)
    bias, bias_failed = judge_bias(pair, reference, thresholds, used, "sr_bias_ulp", computed)
    return _Judged({**metrics, **bias}, used, bias_failed, lambda: fast.worst(pair, PassSpec(offend="rel")))


def _finish(pair: Pair, judged: _Judged, reference: Reference | None) -> Verdict:
    """The verdict: judged by the scaled share where it was computed (it is the larger),
    else by rel_err_thousandth."""
    metrics, used = judged.metrics, judged.used
    share, limit = metrics["rel_err_thousandth"], used["rel_err_thousandth"]
    reasons = list(judged.reasons)
    if metrics.get("scaled_thousandth", share) < limit:
        judged_key = "scaled_thousandth" if "scaled_thousandth" in metrics else "rel_err_thousandth"
        reasons.append(
            Reason(
                f"rel_err_thousandth {share:.6g} < {limit:.6g}: "
                f"more than {1 - limit:.3%} of elements are off by 0.1% or more"
                + (
                    f" (and {metrics['scaled_thousandth']:.6g} within {used['sr_thousandth_ulp']:g} ULP at the output's scale)"
                    if "scaled_thousandth" in metrics
                    else ""
                ),
                {"rel_err_thousandth": limit, judged_key: limit},
            )
        )
    status: Status = "error" if reasons else "pass"
    return pair.verdict(
        status,
        NAME,
        metrics,
        used,
        reasons,
        judged.worst() if status != "pass" else (),
        reference.kind if reference is not None else "single-run",
    )
