"""Legacy single-run rules: what msprobe's run_ut prints per device (cosine, 双百/双千/双万).

`legacy_metrics(pair)` is reported for every floating output, whatever the standard:
  cosine                  cosine similarity over the both_finite elements (1 when both
                          are all-zero, 0 when only one side is)
  max_abs_err             max |d - b| over the both_finite elements
  rel_err_hundredth / rel_err_thousandth / rel_err_ten_thousandth
                          share of ALL elements with rel_err < 0.01 / 0.001 / 0.0001, where
                          an inf/NaN element counts as within when it agrees with the bench
How legacy contributes to a verdict: NOT AT ALL by default. The routed standard decides;
the legacy numbers are reported for compatibility with run_ut's details CSV. Reason: the
legacy rules misjudge (see `msprobe_legacy_status`, a faithful model used to show it):
a correct `-inf` (masked attention) makes max_abs_err NaN and fails the 双千 share; a
correctly rounded bfloat16 output warns (rounding alone is up to 0.2% relative); a lone
NaN passes. Users who want the rules anyway route an API to the "legacy" standard,
which applies them with those three fixes: infinities of the same sign agree, an
unexpected inf/NaN is an error, and in fp16/bf16 the 双千 warning is raised only for
error beyond the bench's own rounding to D.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from . import fast
from .dtypes import Array
from .metrics import Pair
from .pass_plan import PassSpec
from .pass_results import LegacySums, RelBelow
from .verdict import Reason

if TYPE_CHECKING:
    from .reference import Reference
    from .verdict import Status, Verdict

NAME = "legacy"
LEGACY_KEYS = ("cosine", "max_abs_err", "rel_err_hundredth", "rel_err_thousandth", "rel_err_ten_thousandth")


def _cosine(d: Array, b: Array) -> float:
    nd, nb = float(np.max(np.abs(d), initial=0.0)), float(np.max(np.abs(b), initial=0.0))
    if nd == 0.0 and nb == 0.0:
        return 1.0
    if nd == 0.0 or nb == 0.0:
        return 0.0
    d, b = d / nd, b / nb
    cos = float(np.dot(d, b)) / (float(np.linalg.norm(d)) * float(np.linalg.norm(b)))
    return min(1.0, max(-1.0, cos))


def legacy_metrics(pair: Pair) -> dict[str, float]:
    """The five legacy metrics (computed once per pair)."""

    def compute() -> dict[str, float]:
        res = _fast_legacy(pair)
        if res is not None:
            return res
        return {
            "cosine": _cosine(pair.df, pair.bf) if pair.n_finite else 1.0,
            "max_abs_err": float(pair.abs_err.max()) if pair.n_finite else 0.0,
            "rel_err_hundredth": pair.rel_err_share_below(0.01),
            "rel_err_thousandth": pair.rel_err_share_below(0.001),
            "rel_err_ten_thousandth": pair.rel_err_share_below(0.0001),
        }

    return pair.memoise("legacy", compute)


def _fast_legacy(pair: Pair) -> dict[str, float] | None:
    """The legacy metrics from a fused pass (fast.py), reusing the standard's when fused."""
    res = pair.fused_legacy
    if res is None:
        if not fast.fast_ok(pair) or pair.fused_nonfinite:
            return None
        pair.want_legacy = True
        res = fast.run(pair, PassSpec())
        if res is None:
            return None
    sums, below = res.of(LegacySums), res.of(RelBelow).counts
    dd, bb = sums.d_squares, sums.b_squares
    if 1e-280 < dd < 1e280 and 1e-280 < bb < 1e280:
        cos = min(1.0, max(-1.0, sums.d_dot_b / (math.sqrt(dd) * math.sqrt(bb))))
    else:  # all-zero side or extreme magnitudes: the plain way
        cos = _cosine(pair.df, pair.bf)
    hundredth, thousandth, ten_thousandth = (below[limit] / pair.n for limit in fast.LEGACY_REL_LIMITS)
    return {
        "cosine": cos,
        "max_abs_err": float(sums.max_abs_err),
        "rel_err_hundredth": hundredth,
        "rel_err_thousandth": thousandth,
        "rel_err_ten_thousandth": ten_thousandth,
    }


def legacy(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict:
    """The legacy rules as a standard of their own, with the three fixes above."""
    metrics = dict(legacy_metrics(pair))
    reasons: list[str] = []
    warnings: list[str] = []
    low_precision = pair.info.mantissa_bits < 23
    nonfinite = pair.unexpected_nonfinite_reason()
    if nonfinite:
        reasons.append(nonfinite)
    if metrics["cosine"] <= 0.99 and pair.n_finite > 1:
        reasons.append(Reason(f"cosine {metrics['cosine']:.6g} <= 0.99", {"cosine": 0.99}))
    elif metrics["max_abs_err"] >= 0.001:
        thousandth = metrics["rel_err_thousandth"]
        if low_precision:
            if metrics["rel_err_hundredth"] <= 0.99:
                reasons.append(
                    Reason(f"rel_err_hundredth {metrics['rel_err_hundredth']:.6g} <= 0.99", {"rel_err_hundredth": 0.99})
                )
            beyond = np.abs(pair.df - pair.bf_rounded) / (pair.abs_b + pair.tiny)
            good = int(np.count_nonzero(beyond < 0.001))
            if pair.n_inf_nan:
                good += int(pair.inf_nan_agree(pair.info.defaults["rtol"]).sum())
            metrics["rel_err_thousandth_beyond_rounding"] = good / pair.n if pair.n else 1.0
            thousandth = max(thousandth, metrics["rel_err_thousandth_beyond_rounding"])
            if thousandth <= 0.999:
                warnings.append(Reason(f"rel_err_thousandth {thousandth:.6g} <= 0.999", {"rel_err_thousandth": 0.999}))
        else:
            if thousandth <= 0.999:
                reasons.append(Reason(f"rel_err_thousandth {thousandth:.6g} <= 0.999", {"rel_err_thousandth": 0.999}))
            elif metrics["rel_err_ten_thousandth"] <= 0.9999:
                warnings.append(
                    Reason(
                        f"rel_err_ten_thousandth {metrics['rel_err_ten_thousandth']:.6g} <= 0.9999",
                        {"rel_err_ten_thousandth": 0.9999},
                    )
                )
    status: Status = "error" if reasons else ("warning" if warnings else "pass")
    used = {
        "cosine": 0.99,
        "max_abs_err": 0.001,
        "rel_err_hundredth": 0.99,
        "rel_err_thousandth": 0.999,
        "rel_err_ten_thousandth": 0.9999,
    }
    return pair.verdict(
        status,
        NAME,
        metrics,
        used,
        reasons + warnings,
        pair.offenders(pair.rel_err),
        reference.kind if reference is not None else "single-run",
    )


def msprobe_legacy_status(bench: Array, device: Array, dtype_name: str) -> Status:
    """A faithful model of run_ut's legacy verdict, flaws included (for comparison only).

    NaN cosine is let through, NaN/inf differences poison max_abs_err and the shares.
    """
    d = np.asarray(device, dtype=np.float64).reshape(-1)
    b = np.asarray(bench, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if d.size > 1:
            nd, nb, eps = np.max(np.abs(d)), np.max(np.abs(b)), np.finfo(float).eps
            if nd <= eps and nb <= eps:
                pass  # all zero: cosine not judged
            elif nd <= eps or nb <= eps:
                return "error"
            else:  # NaN maxima land here too
                dn, bn = d / nd, b / nb
                cos = np.dot(dn, bn) / (np.linalg.norm(dn) * np.linalg.norm(bn))
                if not math.isnan(cos) and not cos > 0.99:
                    return "error"
        abs_err = np.abs(d - b)
        if np.max(abs_err) < 0.001:
            return "pass"
        tiny = 2.0**-8 if dtype_name == "bfloat16" else (2.0**-23 if dtype_name == "float16" else 2.0**-52)
        rel = abs_err / (np.abs(b) + tiny)

        def share(limit: float) -> float:
            return float(np.mean(rel < limit))

        if dtype_name in ("float16", "bfloat16"):
            if share(0.01) <= 0.99:
                return "error"
            return "pass" if share(0.001) > 0.999 else "warning"
        if share(0.001) <= 0.999:
            return "error"
        return "warning" if share(0.0001) <= 0.9999 else "pass"
