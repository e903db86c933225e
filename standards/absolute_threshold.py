"""Absolute threshold: elementwise arithmetic must be accurate to D's rounding.

For add/sub/mul/div/... (spec standard 2). Three shares must all be zero:
  inf_nan_error_ratio  inf/nan elements where d and b disagree (clipped to D's range)
  rel_err_ratio        normal elements (|b| > small) with rel_err > rtol
  abs_err_ratio        small elements with abs_err > small_atol
rtol/small/small_atol come from the dtype defaults, overridden per API and dtype by the
thresholds table (msprobe ships such a table but never reads it; we do).

With or without a reference (a baseline or another run cannot undo roundings in D): the
rule above holds a result
to ONE rounding, but the gradient of an elementwise API chains several (rsqrt's grad
-0.5 * g * y**3 rounds four times in D: a correct fp16 CPU grad is measured 1.9 ULP off,
rel_err 0.00102 > 2**-10), and a grad such as div's -g*a/b**2 cancels to tiny values
next to large ones. So an element the spec would count is forgiven
when |d - b| <= sr_abs_ulp * eps(D) * max(|b|, sr_scale_floor * rms(b)) (4 ULP at the
element's magnitude, never finer than 2**-6 of the output's RMS; real forward and
backward CPU kernels measured <= 2.6); `scaled_err_ratio` is the share of elements
beyond both, and must be 0. A 30-ULP bias or one element 25% off is still an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from . import fast
from .bias import judge_bias, sample_step, statistics
from .metrics import Pair
from .pass_plan import PassSpec
from .pass_results import BeyondScaled, BiasTotals, ThresholdCounts, Worst
from .single_run import at_least_normal, tolerance_scale
from .verdict import Reason

if TYPE_CHECKING:
    from .reference import Reference
    from .verdict import Verdict

NAME = "absolute_threshold"


def absolute_threshold_metrics(pair: Pair, rtol: float, small: float, atol: float) -> dict[str, float]:
    """The three ratios of the absolute-threshold rule, for the given tolerances."""
    small_mask = pair.small_mask(small)
    n_small = int(np.count_nonzero(small_mask))
    n_normal = pair.n_finite - n_small
    rel_bad = int(np.count_nonzero((pair.rel_err > rtol) & ~small_mask)) if n_normal else 0
    abs_bad = int(np.count_nonzero((pair.abs_err > atol) & small_mask)) if n_small else 0
    return {
        "inf_nan_error_ratio": pair.inf_nan_error_ratio(rtol),
        "rel_err_ratio": rel_bad / n_normal if n_normal else 0.0,
        "abs_err_ratio": abs_bad / n_small if n_small else 0.0,
    }


def threshold_reasons(
    metrics: dict[str, float], limits: dict[str, float], judged: Iterable[str] | None = None
) -> list[str]:
    """Reasons for every judged ratio above zero (default: the spec's three)."""
    reasons: list[str] = []
    whats = {
        "inf_nan_error_ratio": "inf/nan elements disagree",
        "rel_err_ratio": f"normal elements have rel_err > {limits['rtol']:.3g}",
        "abs_err_ratio": f"small elements have abs_err > {limits['atol']:.3g}",
        "scaled_err_ratio": f"elements are beyond the spec's tolerance and "
        f"{limits.get('ulps', 0):g} ULP at max(|b|, "
        f"{limits.get('floor', 0):.3g} x rms(b))",
    }
    for key in judged or ("inf_nan_error_ratio", "rel_err_ratio", "abs_err_ratio"):
        what = whats[key]
        if metrics[key] > 0:
            reasons.append(Reason(f"{key} {metrics[key]:.6g} > 0: {what}", {key: 0.0}))
    return reasons


#: the ratios judged where the scaled allowance applies (any finite element): the
#: spec's rel_err_ratio and abs_err_ratio are reported, its forgiven elements not failed
SCALED_JUDGED = ("inf_nan_error_ratio", "scaled_err_ratio")


def _named_thresholds(thresholds: Mapping[str, float], scaled: bool) -> dict[str, float]:
    """The thresholds a verdict names, in the order it names them: the spec's tolerances
    and its three ratios (none may be over 0), then, where the scaled allowance judged,
    its ratio and allowance."""
    used = {
        "rtol": thresholds["rtol"],
        "small": thresholds["small"],
        "small_atol": thresholds["small_atol"],
        "inf_nan_error_ratio": 0.0,
        "rel_err_ratio": 0.0,
        "abs_err_ratio": 0.0,
    }
    if scaled:
        used.update(
            scaled_err_ratio=0.0, sr_abs_ulp=thresholds["sr_abs_ulp"], sr_scale_floor=thresholds["sr_scale_floor"]
        )
    return used


def absolute_threshold(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict:
    """Judge elementwise arithmetic against D's rounding tolerance."""
    if fast.fast_ok(pair):  # a reference changes only the verdict's kind here
        verdict = _fast(pair, thresholds, reference)
        if verdict is not None:
            return verdict
    rtol, small, atol = thresholds["rtol"], thresholds["small"], thresholds["small_atol"]
    metrics = absolute_threshold_metrics(pair, rtol, small, atol)
    small_mask = pair.small_mask(small)
    score = np.where(small_mask, pair.abs_err / atol, pair.rel_err / rtol)
    used = _named_thresholds(thresholds, scaled=bool(pair.n_finite))
    limits = {"rtol": rtol, "atol": atol}
    judged = None
    if pair.n_finite:
        ulps, floor = used["sr_abs_ulp"], used["sr_scale_floor"]
        allowed = tolerance_scale(pair, floor) * (ulps * pair.info.eps)
        beyond = (score > 1) & (pair.abs_err > allowed)
        metrics["scaled_err_ratio"] = float(np.count_nonzero(beyond) / pair.n_finite)
        limits.update(ulps=ulps, floor=floor)
        judged = SCALED_JUDGED
    reasons = threshold_reasons(metrics, limits, judged)
    bias, bias_failed = judge_bias(pair, reference, thresholds, used, "at_bias_ulp")
    metrics.update(bias)
    reasons += bias_failed
    return pair.verdict(
        "error" if reasons else "pass",
        NAME,
        metrics,
        used,
        reasons,
        pair.offenders(score) if reasons else (),  # shown only for a failure
        reference.kind if reference is not None else "single-run",
    )


def fast_threshold_metrics(pair: Pair, counts: ThresholdCounts) -> dict[str, float]:
    """absolute_threshold_metrics from a fused pass's counts."""
    n_normal = pair.n - counts.n_small
    return {
        "inf_nan_error_ratio": 0.0,
        "rel_err_ratio": counts.rel_bad / n_normal if n_normal else 0.0,
        "abs_err_ratio": counts.abs_bad / counts.n_small if counts.n_small else 0.0,
    }


def _fast(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict | None:
    """Large and all finite: one fused pass (fast.py)."""
    rms = fast.rms_or_none(pair)
    if rms is None:
        return None
    rtol, small, atol = thresholds["rtol"], thresholds["small"], thresholds["small_atol"]
    ulps, floor = thresholds["sr_abs_ulp"], thresholds["sr_scale_floor"]
    (q_half,) = fast.abs_b_quantiles(pair, (0.5,))
    res = fast.run(
        pair,
        PassSpec(
            threshold=(rtol, small, atol),
            abs_scaled=(at_least_normal(floor * rms, pair.info), ulps * pair.info.eps),
            offend="score",
            sample=sample_step(pair.n),
            bias_q=q_half,
            near_zero=pair.near_zero_limits,
        ),
    )
    if res is None:
        return None
    metrics = fast_threshold_metrics(pair, res.of(ThresholdCounts))
    metrics["scaled_err_ratio"] = float(res.of(BeyondScaled).count / pair.n)
    used = _named_thresholds(thresholds, scaled=True)
    reasons = threshold_reasons(metrics, {"rtol": rtol, "atol": atol, "ulps": ulps, "floor": floor}, SCALED_JUDGED)
    bias, bias_failed = judge_bias(
        pair, reference, thresholds, used, "at_bias_ulp", statistics(res.of(BiasTotals).sums)
    )
    metrics.update(bias)
    reasons += bias_failed
    return pair.verdict(
        "error" if reasons else "pass",
        NAME,
        metrics,
        used,
        reasons,
        fast.offenders(pair, res.of(Worst).items) if reasons else (),
        reference.kind if reference is not None else "single-run",
    )
