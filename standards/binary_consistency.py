"""Binary consistency: exact operations must reproduce the bench bit for bit.

error_rate = #(d != b) / N; pass iff error_rate == 0. For floating outputs the bench is
first rounded to D (an exact op on raised inputs yields a value representable in D, so
this only forgives the raise), NaN matches NaN, and -inf matches -inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from . import fast, scans
from .metrics import Pair
from .verdict import Offender, Reason, Verdict

if TYPE_CHECKING:
    from .reference import Reference

NAME = "binary_consistency"


def binary_consistency(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict:
    """Judge an exact op: any differing element is an error."""
    exact = getattr(pair, "exact", None)
    if exact is None and fast.fast_ok(pair):
        # chunked comparison in D: no float64 copies, no full-size masks
        n_bad, first = scans.binary_scan(pair)
        return _verdict(pair, n_bad, fast.offenders(pair, [(1.0, i) for i in first]), reference)
    if exact is not None:  # integer/bool outputs: compare the raw values
        differ = (exact[0] != exact[1]).reshape(-1)
    else:
        b = pair.b_rounded
        with np.errstate(invalid="ignore"):
            differ = (pair.d != b) & ~(np.isnan(pair.d) & np.isnan(b))
    n_bad = int(np.count_nonzero(differ))
    worst: tuple[Offender, ...] = ()
    if n_bad:
        idx = np.flatnonzero(differ)[:5]
        shape = pair.shape
        worst = tuple(
            Offender(
                tuple(int(x) for x in np.unravel_index(i, shape)) if shape else (), float(pair.d[i]), float(pair.b[i])
            )
            for i in idx
        )
    return _verdict(pair, n_bad, worst, reference)


def _verdict(pair: Pair, n_bad: int, worst: tuple[Offender, ...], reference: Reference | None) -> Verdict:
    rate = n_bad / pair.n if pair.n else 0.0
    metrics = {"error_rate": rate}
    reasons = []
    if n_bad:
        reasons.append(
            Reason(
                f"{n_bad} of {pair.n} elements differ from the bench (error_rate {rate:.6g} > 0); this op must be exact",
                {"error_rate": 0.0},
            )
        )
    return pair.verdict(
        "error" if reasons else "pass",
        NAME,
        metrics,
        {"error_rate": 0.0},
        reasons,
        worst if n_bad else (),
        reference.kind if reference is not None else "single-run",
    )
