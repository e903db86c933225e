"""Accumulative error: long reductions, whose error grows with the reduction length.

Spec standard 5: the absolute-threshold ratios with `bound(D)` as both rtol and atol and
small = 1, plus error balance eb = |#(d > b_D) - #(d < b_D)| / N (b_D: the bench rounded
to D, so correct rounding is no error). Pass iff the three ratios are 0 and eb <= eb_max.
Fix over msprobe: eb is judged only when its sign imbalance is also statistically
significant (sign-test z > sr_bias_z): msprobe's fp16 eb_max of 2**-20 otherwise fails a
correct kernel on a single odd rounding difference in a small tensor. And eb is blind to
a scale bias (errors whose signs follow b's, e.g. every element x(1+30 ulp)), so the same
balance is also judged relative to sign(b): `scale_eb` = |#outward - #inward| / N.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from . import fast
from .absolute_threshold import absolute_threshold_metrics, fast_threshold_metrics, threshold_reasons
from .metrics import Pair, sign_balance_z
from .pass_plan import PassSpec
from .pass_results import SignCounts, ThresholdCounts, Worst
from .verdict import Reason

if TYPE_CHECKING:
    from .reference import Reference
    from .verdict import Verdict

NAME = "accumulative_error"


def accumulative_error(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict:
    """Judge a long reduction by bound(D) and error balance."""
    bound, small = thresholds["bound"], thresholds["accumulative_small"]
    res = None
    if fast.fast_ok(pair):  # one fused pass (fast.py); None: plain path
        res = fast.run(pair, PassSpec(threshold=(bound, small, bound), signs="scale", offend="rel"))
    if res is not None:
        metrics = fast_threshold_metrics(pair, res.of(ThresholdCounts))
        signs = res.of(SignCounts)
        pair.keep_sign_counts(signs.up, signs.down)
        outward, inward = signs.outward, signs.inward
    else:
        metrics = absolute_threshold_metrics(pair, bound, small, bound)
    metrics["eb"] = pair.error_balance()
    reasons = threshold_reasons(metrics, {"rtol": bound, "atol": bound})
    z = sign_balance_z(*pair.sign_counts)
    metrics["eb_z"] = z
    if res is None:
        up, down = pair.df > pair.bf_rounded, pair.df < pair.bf_rounded
        outward = int(np.count_nonzero((up & (pair.bf > 0)) | (down & (pair.bf < 0))))
        inward = int(np.count_nonzero((down & (pair.bf > 0)) | (up & (pair.bf < 0))))
    metrics["scale_eb"] = abs(outward - inward) / pair.n_finite if pair.n_finite else 0.0
    scale_z = sign_balance_z(outward, inward)
    metrics["scale_eb_z"] = scale_z
    for key, zz in (("eb", z), ("scale_eb", scale_z)):
        if metrics[key] > thresholds["eb_max"] and zz > thresholds["sr_bias_z"]:
            reasons.append(
                Reason(
                    f"{key} {metrics[key]:.6g} > {thresholds['eb_max']:.6g} with sign-test z {zz:.3g}: a systematic bias",
                    {key: thresholds["eb_max"], f"{key}_z": thresholds["sr_bias_z"]},
                )
            )
    used = {
        "bound": bound,
        "small": small,
        "inf_nan_error_ratio": 0.0,
        "rel_err_ratio": 0.0,
        "abs_err_ratio": 0.0,
        "eb": thresholds["eb_max"],
        "scale_eb": thresholds["eb_max"],
        "eb_z": thresholds["sr_bias_z"],
        "scale_eb_z": thresholds["sr_bias_z"],
    }
    worst = (
        ()
        if not reasons
        # shown only for a failure
        else (pair.offenders(pair.rel_err) if res is None else fast.offenders(pair, res.of(Worst).items))
    )
    return pair.verdict(
        "error" if reasons else "pass",
        NAME,
        metrics,
        used,
        reasons,
        worst,
        reference.kind if reference is not None else "single-run",
    )
