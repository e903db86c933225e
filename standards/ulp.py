"""ULP error: matrix products are judged in units in the last place of D.

Spec standard 3. ulp_err = |d - b| * 2**(m - e), e = max(floor(log2|b|), e_min);
  max_ulp_err, mean_ulp_err, ulp_err_proportion = share of ulp_err > T(D)
  (T = 32 for fp32, 1 for fp16/bf16), over the both_finite elements.
Single run (no reference): msprobe's own rule -- fp32 passes iff mean_ulp_err < 64 or
  ulp_err_proportion < 0.05; fp16/bf16 iff ulp_err_proportion < 0.001 -- plus the
  single-run rule's unexpected-inf/NaN and systematic-bias checks (see single_run.py):
  msprobe's rule alone lets every element be 30 ULP too large in fp32. The worst
  elements (by ULP error) are named only in a verdict that is not a pass.
With a reference: passes as above, or where ulp_err_proportion / max(ref, floor(D)) < 1
  (floor fp16 2**-11, bf16 2**-8, fp32 2**-14). Unexpected inf/NaN is always an error.
Conditioned (the caller gave each element's terms' magnitude t, Pair.terms): msprobe's
  criteria are applied again to the error in ULPs of D at |b| that is left once the
  accumulator's own rounding is allowed for: `max(0, |d - b| - ACCUMULATION_KAPPA *
  u_acc * t)`, u_acc the unit roundoff of the accumulator every correct matrix product
  has (float32, 2**-24, for D up to float32; float64 for a float64 D)
  (`cond_max_ulp_err`, `cond_mean_ulp_err`, `cond_ulp_err_proportion`, reported beside
  msprobe's unchanged metrics), and either passing passes. Why: an element that cancels
  far below its terms holds their rounding in the accumulator. Measured on a 12-block
  transformer's real float32 dump on the CPU: bias gradients of 96 elements around 1e-11,
  sums of upstream gradients of ~1e-3 that cancel, are 1.4e6 ULP off at their own
  magnitude (mean) and fail msprobe's rule although the kernel is correct; so did a
  logit of -1.68e-5 from terms of ~0.1. In float16, torch's own linear (K = 4096) on a
  Xeon with AVX512-FP16 and 2 threads put one element of 512 (|b| = 0.03 from terms of
  2644) at 2 ULP: ulp_err_proportion 1/512 >= 0.001 fails msprobe's rule. Eight float32
  summation orders of that call (tests/standards/kernels.py, `summation_orders`) put it
  at 0.5 to 4.6 ULP, always within the allowance. Why the accumulator's unit and not
  D's: at 1 ULP of D at t (the rule before) a float16 or bfloat16 linear that
  accumulates in D itself passed (cond_max_ulp_err 0.35); its error is ~2**13 times the
  float32 accumulator's, 1.3 ULP of D at |b| in two elements of three, and fails.
  ACCUMULATION_KAPPA = 64: the probabilistic bound of a K-term sum is lambda sqrt(K) u
  sum|terms| (Higham and Mary 2019); for terms of random sign the partial sums grow
  like sqrt(k) and the error stays near 0.6 u sum|terms| whatever K, for same-sign terms
  summed one by one it is ~ sqrt(K) u / 3 sum|terms|: 64 covers those up to K ~ 37,000
  and any blocked or pairwise order beyond. In float32 it is the rule before, to within a
  factor of 2 (32 ULP of float32 at t is 2**-19 t to 2**-18 t; 64 u_acc t is 2**-18 t).
At the output's scale (float32 and float64, a single run, no terms given: the caller of
  `check` who has only the outputs): where msprobe's rule fails, its criteria are applied
  once more to the error left beyond the same allowance at the element's scale
  max(|b|, r_i c_j / g) (product_scale: r_i the RMS of b over the element's row, the last
  dimension, c_j over its column, the leading dimensions, g over the output),
  `accum_max_ulp_err`, `accum_mean_ulp_err`, `accum_ulp_err_proportion`, and either
  passing passes. Why: msprobe's limits are in ULPs of each element's own magnitude, and
  a sum's error is not (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
  (3.5): a dot product of n terms computed in any order is within gamma_n sum|terms| of
  the exact one, gamma_n = n u / (1 - n u)); where a product cancels to near zero its
  own ULP is tiny, and the mean of the ULP errors is dominated by the few elements
  nearest zero, a heavy tail that grows with the output's size. ATen's own 256x512 by
  64x512 float32 product under ATEN_CPU_CAPABILITY=default measured mean_ulp_err 65.9
  (one element of |b| 1e-6 alone adds 21 to it) with ulp_err_proportion 0.0512, an
  error; the vectorised path 41.2 and 0.0516, a pass; products of K 128 to 8192 put 2.3%
  to 8.6% of their elements over 32 ULP on both paths, so only the heavy-tailed mean
  passes them. Why that scale stands for the terms: sum|terms| >= |b| (the triangle
  inequality) and sum|terms| >= the terms' 2-norm, whose square is the expected b**2 of
  a sum of terms of independent signs; in a product x w^T the terms of element (i, j)
  scale with row i of x times row j of w, so E b_ij**2 = r_i**2 c_j**2 / g**2 for
  r_i**2, c_j**2, g**2 the mean squares of b over its row, its column and all of it
  (the rank-one model of a matrix product's scales: tokens times features). The
  allowance at that scale is never wider than at the terms of a typical element (for
  K = 512 random-sign terms it is sqrt(2K / pi) ~ 18 times narrower), and a row of
  tiny inputs gets its own small scale: a bfloat16 accumulation in the rows 2**-20 as
  large fails, where the output's RMS (one scale for all) passed it. An output of one
  row or one column (a bias gradient, a matrix-vector product) takes g there. Measured
  on ATen's float32 products (K 128 to 8192, both kernel paths): the largest error
  35.3 u_acc at that scale, within 64. A float32 product through TF32 inputs (2**-11
  each), or accumulated in bfloat16 or float16, is thousands of u_acc off and still
  fails; a lean (rounding toward zero) is the bias test's, unchanged
  (tests/standards/test_conditioning.py). Limits: scales that do not factor by rows and
  columns (a block of large values) are estimated from its rows' and columns' RMS, wider
  than the block's own for elements beside it; and a purely sequential order of
  random-sign terms costs ~ u_acc r_i c_j / g sqrt(K / 2) per element, within the
  allowance up to K ~ 8192 on the typical element but not on the worst. With the terms
  (the plugin evaluates them on an error, judge/verdict/judgement.py) the terms' rule above
  judges instead, where this one has not passed the output already.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import fast
from .bias import BIAS_PREFIXES, judge_bias
from .dtypes import Array, DtypeInfo
from .metrics import Pair
from .pass_plan import PassSpec
from .pass_results import PassResult, UlpSums
from .single_run import (
    at_least_normal,
    bias_sums,
    fast_max_top_ulp_err,
    fast_single_run,
    max_top_ulp_err,
    single_run_metrics,
    single_run_reasons,
    with_bias_sample,
)
from .verdict import Reason

if TYPE_CHECKING:
    from .reference import Reference
    from .verdict import Offender, Status, Verdict

NAME = "ulp"
#: how many unit roundoffs of the accumulator, times the terms' magnitude, a correct
#: matrix product's accumulation may cost an element (module docstring: why 64)
ACCUMULATION_KAPPA = 64.0
#: the thresholds' key that says the output-scale rule judged (float32 and wider, a single
#: run, no terms): its value is ACCUMULATION_KAPPA
AT_OUTPUT_SCALE_KEY = "accum_kappa"


def ulp_metrics(pair: Pair, threshold: float) -> dict[str, float]:
    """max / mean ULP error and the share above `threshold`, over finite elements."""
    if pair.n_finite == 0:
        return {"max_ulp_err": 0.0, "mean_ulp_err": 0.0, "ulp_err_proportion": 0.0}
    err = pair.ulp_err
    return {
        "max_ulp_err": float(err.max()),
        "mean_ulp_err": float(err.mean()),
        "ulp_err_proportion": float(np.count_nonzero(err > threshold) / err.size),
    }


def _fast_ulp_metrics(pair: Pair, res: PassResult) -> dict[str, float]:
    """ulp_metrics from a fused pass (fast.py) over an all-finite pair."""
    sums = res.of(UlpSums)
    return {
        "max_ulp_err": float(sums.max),
        "mean_ulp_err": sums.total / pair.n,
        "ulp_err_proportion": float(sums.count / pair.n),
    }


def _ref_metrics(p: Pair, threshold: float) -> dict[str, float]:
    """A reference output's ULP metrics: fused where it may be, else plain."""
    if fast.fast_ok(p):
        res = fast.run(p, PassSpec(ulp_threshold=threshold))
        if res is not None:
            return _fast_ulp_metrics(p, res)
    return ulp_metrics(p, threshold)


def accumulation_allowance(terms: Array, info: DtypeInfo) -> Array:
    """What the accumulator's rounding may cost each element: ACCUMULATION_KAPPA unit
    roundoffs of float32 (float64 for a float64 D) at its terms' magnitude."""
    unit = 2.0 ** -(max(info.mantissa_bits, 23) + 1)
    return ACCUMULATION_KAPPA * unit * terms


def _beyond_allowance(pair: Pair, scale: Array | None, threshold: float, prefix: str) -> dict[str, float]:
    """ulp_metrics, named with `prefix`, of each element's error beyond the accumulation
    allowance at `scale` (per finite element), in ULPs of D at |b|."""
    values = {"max_ulp_err": 0.0, "mean_ulp_err": 0.0, "ulp_err_proportion": 0.0}
    if pair.n_finite and scale is not None:
        err = np.maximum(pair.abs_err - accumulation_allowance(scale, pair.info), 0.0) / pair.ulp
        values = {
            "max_ulp_err": float(err.max()),
            "mean_ulp_err": float(err.mean()),
            "ulp_err_proportion": float(np.count_nonzero(err > threshold) / err.size),
        }
    return {prefix + key: value for key, value in values.items()}


def conditioned_ulp_metrics(pair: Pair, threshold: float) -> dict[str, float]:
    """ulp_metrics of each element's error beyond its accumulation allowance at its
    terms' magnitude, in ULPs of D at |b|."""
    return _beyond_allowance(pair, pair.terms, threshold, "cond_")


def product_scale(pair: Pair) -> Array:
    """Per finite element, the rank-one estimate r_i c_j / g of its terms' 2-norm: r_i the
    RMS of b over its row (the last dimension), c_j over its column (every leading
    dimension), g over the output; an output of one row or one column takes g for it
    (module docstring). Non-finite elements count as 0."""
    shape = pair.shape if len(pair.shape) >= 2 else (1, pair.n)
    b = np.where(pair.both_finite, pair.b, 0.0).reshape(-1, shape[-1]) if pair.n else np.zeros((1, 1))
    peak = float(np.max(np.abs(b)))
    if peak == 0.0:
        return np.zeros(pair.n_finite)
    b = b / peak  # mean squares of float64 values up to its largest finite
    overall = float(np.mean(np.square(b)))
    rows = np.mean(np.square(b), axis=1, keepdims=True) if b.shape[1] > 1 else overall
    columns = np.mean(np.square(b), axis=0, keepdims=True) if b.shape[0] > 1 else overall
    scale: Array = (peak * np.sqrt(rows * columns / overall) * np.ones_like(b)).reshape(-1)
    return scale if pair.all_finite else scale[pair.both_finite]


def output_scale_ulp_metrics(pair: Pair, threshold: float) -> dict[str, float]:
    """ulp_metrics of each element's error beyond its accumulation allowance at the
    output's scale, max(|b|, product_scale), the lower estimate of its terms' magnitude
    where none were given (module docstring)."""
    scale = np.maximum(pair.abs_b, np.maximum(product_scale(pair), at_least_normal(0.0, pair.info)))
    return _beyond_allowance(pair, scale, threshold, "accum_")


def _absolute_pass(metrics: dict[str, float], thresholds: Mapping[str, float], is_fp32_like: bool) -> bool:
    if is_fp32_like:
        return (
            metrics["mean_ulp_err"] < thresholds["ulp_mean_max"]
            or metrics["ulp_err_proportion"] < thresholds["ulp_prop_max"]
        )
    return metrics["ulp_err_proportion"] < thresholds["ulp_prop_max"]


@dataclass(frozen=True)
class _Judged:
    """What the standard's steps add to, in the order the verdict names them: its
    metrics, the thresholds it was judged by, and why it fails (none: a pass)."""

    metrics: dict[str, float]
    used: dict[str, float]
    reasons: list[str]


def ulp(pair: Pair, thresholds: Mapping[str, float], reference: Reference | None = None) -> Verdict:
    """Judge a matrix product by its ULP error: it passes msprobe's rule (or the same at
    the terms' magnitude) or, with a reference, a ratio below 1 to the reference's;
    without a usable reference the single-run rule's checks apply too."""
    used = _named_thresholds(pair, thresholds)
    fused = _run_fused(pair, used["ulp_threshold"], reference)
    metrics = _fast_ulp_metrics(pair, fused[0]) if fused is not None else ulp_metrics(pair, used["ulp_threshold"])
    nonfinite = pair.unexpected_nonfinite_reason()
    judged = _Judged(metrics, used, [nonfinite] if nonfinite else [])
    ok = _within_rule(pair, judged)
    kind = "single-run"
    if reference is not None:
        by_ratio = _against_reference(pair, reference, thresholds, judged, fused[1] if fused is not None else None)
        kind = reference.kind if by_ratio is not None else "single-run"
        ok = ok or bool(by_ratio)
    if kind == "single-run" and pair.terms is None and _fp32_like(pair):
        judged.used[AT_OUTPUT_SCALE_KEY] = ACCUMULATION_KAPPA  # the rule below applies (and a report's line shows it)
        ok = ok or _within_rule_at_output_scale(pair, judged)
    if not ok:
        judged.reasons.append(_rule_reason(judged, _fp32_like(pair)))
    if kind == "single-run":
        _single_run_rule(pair, thresholds, judged, fused[1] if fused is not None else None)
    status: Status = "error" if judged.reasons else "pass"
    worst = _worst(pair, fused is not None) if status != "pass" else ()  # named only where a failure message shows them
    return pair.verdict(status, NAME, judged.metrics, judged.used, judged.reasons, worst, kind)


def _fp32_like(pair: Pair) -> bool:
    """float32 and wider: msprobe's rule passes on the mean ULP error too."""
    return pair.info.mantissa_bits >= 23


def _named_thresholds(pair: Pair, thresholds: Mapping[str, float]) -> dict[str, float]:
    used = {k: thresholds[k] for k in ("ulp_threshold", "ulp_prop_max", "ulp_floor")}
    if _fp32_like(pair):
        used["ulp_mean_max"] = thresholds["ulp_mean_max"]
    return used


def _run_fused(
    pair: Pair, threshold: float, reference: Reference | None
) -> tuple[PassResult, dict[str, float] | None] | None:
    """One fused pass (fast.py) and, without a reference to judge against, the
    single-run rule's metrics it computed; None: the plain path."""
    if not fast.fast_ok(pair):
        return None
    if reference is not None and (reference.pair is not None or "ulp_err_proportion" in (reference.metrics or {})):
        # judged against the reference: only the ULP metrics, no single-run rule; against
        # a baseline's, the bias sums too (its kernel's evidence), as a single run's pass
        spec = PassSpec(ulp_threshold=threshold)
        spec = spec if reference.pair is not None else with_bias_sample(pair, spec)
        res = fast.run(pair, spec)
        return (res, bias_sums(res, spec)) if res is not None else None
    return fast_single_run(pair, PassSpec(ulp_threshold=threshold), scaled=False, top=False)


def _within_rule(pair: Pair, judged: _Judged) -> bool:
    """msprobe's rule on the ULP error, or on what is left of it once the accumulator's
    rounding is allowed for (where the caller gave the terms: their metrics reported)."""
    ok = _absolute_pass(judged.metrics, judged.used, _fp32_like(pair))
    if pair.terms is not None:
        conditioned = conditioned_ulp_metrics(pair, judged.used["ulp_threshold"])
        judged.metrics.update(conditioned)
        ok = ok or _absolute_pass(
            {key.removeprefix("cond_"): value for key, value in conditioned.items()}, judged.used, _fp32_like(pair)
        )
    return ok


def _within_rule_at_output_scale(pair: Pair, judged: _Judged) -> bool:
    """msprobe's rule on what is left of the error once the accumulator's rounding at the
    output's scale is allowed for (module docstring; its metrics reported)."""
    at_scale = output_scale_ulp_metrics(pair, judged.used["ulp_threshold"])
    judged.metrics.update(at_scale)
    return _absolute_pass({key.removeprefix("accum_"): value for key, value in at_scale.items()}, judged.used, True)


def _against_reference(
    pair: Pair,
    reference: Reference,
    thresholds: Mapping[str, float],
    judged: _Judged,
    computed: dict[str, float] | None = None,
) -> bool | None:
    """Whether the ulp_err_proportion's ratio to the reference's (floored) is below 1,
    with the paired bias test; None where the reference lacks that metric (the
    single-run rule judges then)."""
    used, metrics = judged.used, judged.metrics
    ref = reference.metrics_for(lambda p: _ref_metrics(p, used["ulp_threshold"]))
    if "ulp_err_proportion" not in ref:
        judged.reasons.append("reference lacks ulp_err_proportion; judged by the single-run rule")
        return None
    ratio = metrics["ulp_err_proportion"] / max(abs(ref["ulp_err_proportion"]), used["ulp_floor"])
    metrics["ref_ulp_err_proportion"] = float(ref["ulp_err_proportion"])
    metrics["ulp_err_proportion_ratio"] = ratio
    used["ulp_err_proportion_ratio"] = 1.0
    bias, bias_failed = judge_bias(pair, reference, thresholds, used, "ulp_bias_ulp", computed, any_size=True)
    metrics.update(bias)
    judged.reasons.extend(bias_failed)
    return ratio < 1.0


def _rule_reason(judged: _Judged, fp32_like: bool) -> Reason:
    """Why msprobe's rule (and the reference's ratio, the terms' magnitude) failed."""
    metrics, used = judged.metrics, judged.used
    rule = f"mean_ulp_err {metrics['mean_ulp_err']:.4g} >= {used.get('ulp_mean_max', 0):.4g} and " if fp32_like else ""
    limits = {"mean_ulp_err": used["ulp_mean_max"]} if fp32_like else {}
    limits["ulp_err_proportion"] = used["ulp_prop_max"]
    if "ulp_err_proportion_ratio" in metrics:
        limits["ulp_err_proportion_ratio"] = 1.0
    text = (
        f"{rule}ulp_err_proportion {metrics['ulp_err_proportion']:.4g} >= "
        f"{used['ulp_prop_max']:.4g} (share of elements over "
        f"{used['ulp_threshold']:g} ULP)"
        + (
            f"; ratio to reference {metrics['ulp_err_proportion_ratio']:.4g} >= 1"
            if "ulp_err_proportion_ratio" in metrics
            else ""
        )
        + (
            f"; at the terms' magnitude: cond_mean_ulp_err {metrics['cond_mean_ulp_err']:.4g}, "
            f"cond_ulp_err_proportion {metrics['cond_ulp_err_proportion']:.4g}"
            if "cond_ulp_err_proportion" in metrics
            else ""
        )
        + (
            f"; at the output's scale: accum_mean_ulp_err {metrics['accum_mean_ulp_err']:.4g}, "
            f"accum_ulp_err_proportion {metrics['accum_ulp_err_proportion']:.4g}"
            if "accum_ulp_err_proportion" in metrics
            else ""
        )
    )
    return Reason(text, limits)


def _single_run_rule(
    pair: Pair, thresholds: Mapping[str, float], judged: _Judged, fused: dict[str, float] | None
) -> None:
    """The single-run rule's unexpected-inf/NaN and bias checks, without its scaled-ULP
    ones (`fused`: its metrics from the fused pass, else computed here)."""
    extra = fused if fused is not None else single_run_metrics(pair)
    if "max_top_ulp_err" not in extra:  # fused path: judged, never reported
        extra = dict(extra, max_top_ulp_err=_top_or_bound(pair, judged.metrics, thresholds))
    judged.metrics.update({k: value for k, value in extra.items() if k.startswith(BIAS_PREFIXES)})
    bias_only = dict(extra, max_scaled_ulp_err=0.0, mean_scaled_ulp_err=0.0)
    # matrix products have no shared normaliser: their own (tighter) bias limit
    judged.reasons.extend(single_run_reasons(pair, bias_only, thresholds, judged.used, bias_limit="ulp_bias_ulp"))
    for key in ("sr_max_scaled_ulp", "sr_mean_scaled_ulp"):
        judged.used.pop(key, None)


def _worst(pair: Pair, fused: bool) -> tuple[Offender, ...]:
    """The elements of largest ULP error, for a failure's message."""
    if fused:
        return fast.worst(pair, PassSpec(offend="ulp"))
    return pair.offenders(pair.ulp_err) if pair.n_finite or pair.n_inf_nan else ()


def _top_or_bound(pair: Pair, metrics: dict[str, float], thresholds: Mapping[str, float]) -> float:
    """max_top_ulp_err for the single-run rule's check, computed only when it can fail.

    It is never above max_ulp_err (a coarser scale only lowers an element's ULP error),
    so when max_ulp_err is within sr_max_top_ulp the check passes and that bound stands
    in for it (the ulp standard does not report it); otherwise a second pass computes it.
    """
    limit = thresholds.get("sr_max_top_ulp", pair.info.defaults["sr_max_top_ulp"])
    if metrics["max_ulp_err"] <= limit:
        return metrics["max_ulp_err"]
    top = fast_max_top_ulp_err(pair)
    if top is None:
        defaults = pair.info.defaults
        top = max_top_ulp_err(pair, defaults["sr_top_quantile"], defaults["sr_scale_floor"])
    return top
