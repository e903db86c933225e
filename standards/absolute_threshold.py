"""Absolute threshold: elementwise arithmetic must be accurate to D's rounding.

For add/sub/mul/div/... (spec standard 2). Three shares must all be zero:
  inf_nan_error_ratio  inf/nan elements where d and b disagree (clipped to D's range)
  rel_err_ratio        normal elements (|b| > small) with rel_err > rtol
  abs_err_ratio        small elements with abs_err > small_atol
rtol/small/small_atol come from the dtype defaults, overridden per API and dtype by the
thresholds table (msprobe ships such a table but never reads it; we do).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .metrics import Pair

NAME = "absolute_threshold"


def absolute_threshold_metrics(pair: Pair, rtol: float, small: float, atol: float) -> dict:
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


def threshold_reasons(metrics: dict, limits: dict) -> list[str]:
    """Reasons for every ratio above zero."""
    reasons = []
    for key, what in (("inf_nan_error_ratio", "inf/nan elements disagree"),
                      ("rel_err_ratio", f"normal elements have rel_err > {limits['rtol']:.3g}"),
                      ("abs_err_ratio", f"small elements have abs_err > {limits['atol']:.3g}")):
        if metrics[key] > 0:
            reasons.append(f"{key} {metrics[key]:.6g} > 0: {what}")
    return reasons


def absolute_threshold(pair: Pair, thresholds: Mapping[str, float], reference=None):
    """Judge elementwise arithmetic against D's rounding tolerance."""
    rtol, small, atol = thresholds["rtol"], thresholds["small"], thresholds["small_atol"]
    metrics = absolute_threshold_metrics(pair, rtol, small, atol)
    reasons = threshold_reasons(metrics, {"rtol": rtol, "atol": atol})
    score = np.where(pair.small_mask(small), pair.abs_err / atol, pair.rel_err / rtol)
    used = {"rtol": rtol, "small": small, "small_atol": atol, "inf_nan_error_ratio": 0.0,
            "rel_err_ratio": 0.0, "abs_err_ratio": 0.0}
    return pair.verdict("error" if reasons else "pass", NAME, metrics, used, reasons,
                        pair.offenders(score),
                        reference.kind if reference is not None else "single-run")
