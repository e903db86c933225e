"""Thousandth (双千): convolutions must have 99.9% of elements within 0.1% relative error.

rel_err_thousandth = share of elements with rel_err < 0.001; pass iff >= 0.999.
Fix over msprobe: in bfloat16 (and fp8) rounding to D alone costs up to 2**-9 = 0.002
relative, so a correctly rounded conv fails the spec's rule. Where D cannot represent
0.1%, an element also counts as within the thousandth when its error beyond the bench's
own rounding to D is below 0.1% (`rel_err_thousandth_beyond_rounding`); the verdict
passes if either share reaches the threshold. Unexpected inf/NaN is always an error.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .metrics import Pair

NAME = "thousandth"


def thousandth(pair: Pair, thresholds: Mapping[str, float], reference=None):
    """Judge a convolution by the share of elements within 0.1%."""
    limit = thresholds["thousandth_min"]
    share = pair.rel_err_share_below(0.001)
    metrics = {"rel_err_thousandth": share}
    reasons = []
    nonfinite = pair.unexpected_nonfinite_reason()
    if nonfinite:
        reasons.append(nonfinite)
    judged = share
    if pair.info.eps > 0.001 and pair.n:
        beyond = np.abs(pair.df - pair.bf_rounded) / (pair.abs_b + pair.tiny)
        good = int(np.count_nonzero(beyond < 0.001))
        if pair.n_inf_nan:
            good += int(pair.inf_nan_agree(pair.info.defaults["rtol"]).sum())
        metrics["rel_err_thousandth_beyond_rounding"] = good / pair.n
        judged = max(share, good / pair.n)
    if judged < limit:
        reasons.append(f"rel_err_thousandth {share:.6g} < {limit:.6g}: "
                       f"more than {1 - limit:.3%} of elements are off by 0.1% or more")
    return pair.verdict("error" if reasons else "pass", NAME, metrics,
                        {"rel_err_thousandth": limit}, reasons, pair.offenders(pair.rel_err),
                        reference.kind if reference is not None else "single-run")
