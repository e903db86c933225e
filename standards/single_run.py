"""The single-run rule: judging the benchmark and ULP standards without a reference.

msprobe judges these standards by RATIOS to a second device's errors. When the device
under test is the CPU (which also runs the bench) no independent reference exists, so we
judge the device against what any correct kernel in D can do, in ULPs of D:

1. Unexpected inf/NaN: an inf/NaN that the bench (rounded to D) does not have, or a
   finite value where the bench overflows/is NaN -> error. Same-sign infinities agree.
2. Magnitude, judged at two scales, because outputs of composite kernels (every gradient:
   autograd chains several kernels that each round to D, and softmax / layer_norm /
   conv / embedding grads end in a cancellation or an accumulation in D) carry a few
   ULPs of the output's SCALE, not of each element, wherever an element cancels to ~0:
   a. `scaled_ulp_err = |d - b| / ulp_D(max(|b|, rms(b)))`, the error in ULPs of D at the
      element's magnitude but never finer than the output's RMS. error if its max >
      `sr_max_scaled_ulp` or its mean (on the sample of 4.) > `sr_mean_scaled_ulp *
      (1 + 2/sqrt(n))` (the mean of n errors of unit spread gets two standard errors: a
      bias grad of 8 elements is not failed on a noisy mean). fp16/bf16/fp8: 8 / 1 --
      real CPU gradients measured up to 5.4 / 0.75 (forward kernels 1.0 / 0.4), while
      an accumulator in D over 2048 terms costs a mean of 1.4-2.2 and inputs rounded to
      a lower precision 14+ max.
      fp32/fp64: 4096 / 256 -- no higher accumulator exists, long fp32 reductions reach
      tens of ULPs, an input or accumulator in a lower precision costs 2**13 and more.
   b. `max_top_ulp_err`: the largest `1 - sr_top_quantile` (10%) of elements by |b| are
      not products of cancellation, so they are judged in ULPs of their OWN magnitude
      (floored at `sr_scale_floor` (2**-6) x rms for outputs that are mostly zeros, like
      an embedding grad): error above `sr_max_top_ulp` (fp16/bf16/fp8 8: real gradients
      measured up to 4.3, forward kernels 1.0; fp32 4096). This catches one wrong element
      that is large by rank yet far below the RMS of a heavy-tailed output (exp). For
      n > QUANTILE_SAMPLE the quantiles of |b| (this one and the median of 3.) are the
      exact quantiles of an evenly strided, deterministic sample of QUANTILE_SAMPLE
      elements (every (n // QUANTILE_SAMPLE)-th), on both the plain and the fused path.
3. Bias: signs of `d - b_D` (b_D = bench rounded to D, so correct rounding is no error)
   must balance, both plainly (additive bias) and relative to sign(b) (scale bias, e.g.
   rounding toward zero). error if the sign test's z-score exceeds `sr_bias_z` (5) AND
   the mean signed ULP error (own-magnitude ULPs, clipped at +-64, over the upper half of
   the elements by |b|: cancellation products share their row's rounded terms, so they
   add a correlated error of many own ULPs -- a correct bf16 softmax grad over 1024
   columns measured 0.23 ULP with z 19.6 over all elements) exceeds `sr_bias_ulp`:
   fp16/bf16/fp8 0.2 ULP; fp32/fp64 16 ULP. Why so high in fp32: errors of a row share
   its normalizer (softmax over 4096 elements on the CPU is measured +7..+9 ULP biased
   per run, z > 100), and a valid reciprocal-multiply shifts every result by up to ~0.7
   ULP; so fp32 bias is judged only from 16 ULP up (the planted 30-ULP bias is caught),
   and rounding toward zero in fp32 is not -- except by the ULP standard, whose matrix
   products have no shared normaliser (its own limit, bias.py), and with a reference.
4. Sampling. The statistical aggregates -- the bias statistics of 3. (both sign tests and
   both mean signed ULP errors) and the mean of 2a. -- are computed on a deterministic
   sample of at least STAT_SAMPLE (2**20) elements: every `sample_step(n)`-th block of
   chunks.CHUNK consecutive finite elements, n // STAT_SAMPLE (1 for n < 2**21, then all
   elements are used). Why: a sign test over 2**20 elements detects an imbalance of
   5 / sqrt(2**20) = 0.5% of the differing elements, and a mean over them has a standard
   error of ~0.001 ULP, far inside the limits above (0.2 ULP, and 1 ULP for the mean),
   so the biases they target are caught as on all elements; computing them on every
   element cost a third of the benchmark standard's time. Blocks, not every k-th element:
   the fused pass computes a block's statistics from the arrays it already holds, and a
   stride that divides a power-of-two row length would sample only some columns (SIMD
   lanes, tails) of every row. The maxima (2a., 2b.), which catch one wrong element,
   and the spec's own metrics stay on every element. Both paths take the same blocks
   (tests/standards/test_sampling.py: correct outputs pass, rounding toward zero and a
   half-ULP additive bias fail on an output twice the sample). Limit: a bias confined to
   the blocks between the sampled ones (at most (step - 1) / step of the output, in
   contiguous runs of chunks.CHUNK elements) is not seen by the statistics.

Known limits: a wrong element below the top decile AND far below the output's RMS is
judged at the RMS scale, so it can pass a single run (a cancellation could not deliver
its relative error either); noise of up to ~8 ULP at the RMS scale in fp16/bf16 passes
(a correct gradient does as much). A gradient that cancels far below the scale of its
own terms fails although correct: softmax's input gradient y * (g - sum(g * y)) for an
upstream g near a constant (0.5 + 0.2 U(0, 1), shape 4x5x5) is judged error in 93/100
(float16) and 89/100 (bfloat16) seeds, because the device's backward reads the saved
softmax output y rounded to D, which costs tens of ULPs at the output's scale; with
g = 0.5 + U(0, 1) it is 0/100 and 2/100, and 0/100 for a zero-mean g (measured on the
CPU; tests/standards/test_calibration.py keeps it as a strict xfail). The plugin does not
report these: it judges a single-run backward error again against a bench whose autograd
saves the forward results in D (pytest_msprobe/run/replay.py, saved_in_device_dtype), where
the same gradients are within 0.5 ULP (tests/judge/verdict/test_saved_in_device_dtype.py); with an
accelerator, its CPU reference in D carries the same rounding and is judged by ratios.
Terms (Pair.terms) raise an element's scale to its terms' magnitude in ULPs of D, which
is right for a composite (a gradient whose intermediates are rounded to D) and too wide
for one kernel's reduction: a float16 sum of 2048 terms accumulated in float16 (planted,
tests/standards/kernels.py) passes once judged at its terms. The ULP standard (matrix
products) allows the accumulator's rounding instead (ulp.py) and catches that fault.
Calibration (tests/standards/kernels.py,
test_calibration.py): correct CPU forward kernels, valid fp32 rewrites and autograd
BACKWARD kernels in fp32/fp16/bf16 -> 0 errors, 0 warnings; planted faults -> all errors
(counts in test_calibration.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from . import fast
from .bias import NO_SUMS, abs_b_quantile, grouped_z, sample_blocks, sample_step, statistics
from .bias import STAT_SAMPLE as STAT_SAMPLE  # the sample size of the statistics here (tests read it from this module)
from .chunks import BiasSums
from .dtypes import Array, DtypeInfo
from .metrics import Pair, ulp_of
from .misrounding import far_metrics, far_reasons
from .pass_plan import PassSpec
from .pass_results import BiasTotals, PassResult, ScaledSums, TopError
from .signs import LIB_BIAS_KEY, bias_reasons
from .verdict import Reason

__all__ = ["single_run_metrics", "single_run_reasons", "scaled_ulp_err", "output_rms"]


def _rms(values: Array) -> float:
    if values.size == 0:
        return 0.0
    peak = float(np.max(np.abs(values)))
    if peak == 0.0:
        return 0.0
    if peak < 1e150 and peak > 1e-150:
        return float(np.sqrt(np.mean(np.square(values))))
    return peak * float(np.sqrt(np.mean(np.square(values / peak))))


def output_rms(pair: Pair) -> float:
    """RMS of the finite bench values: the output's scale (cached)."""
    return pair.memoise("rms", lambda: _rms(pair.bf))


def tolerance_scale(pair: Pair, floor: float = 1.0) -> Array:
    """The magnitude each finite element's rounding is judged at: max(|b|, floor x rms(b)),
    and the element's terms' magnitude where the caller measured it (Pair.terms): an
    element that cancelled below its terms carries their rounding, not its own. Never
    below D's smallest normal value (at_least_normal)."""
    scale = np.maximum(pair.abs_b, at_least_normal(floor * output_rms(pair), pair.info))
    return scale if pair.terms is None else np.maximum(scale, pair.terms)


def at_least_normal(scale: float, info: DtypeInfo) -> float:
    """A scale of at least D's smallest normal value: below it D's spacing stops shrinking
    (its subnormals are evenly spaced), so a correctly rounded output of subnormals is up
    to half that spacing off, 50% of a value one spacing large (a float16 conv gradient
    from gradients scaled into the subnormals failed the thousandth standard so)."""
    return max(scale, 2.0**info.e_min)


def scaled_ulp_err(pair: Pair) -> Array:
    """|d - b| in ULPs of D at tolerance_scale, per finite element (cached)."""
    return pair.memoise("scaled_ulp_err", lambda: pair.abs_err / ulp_of(tolerance_scale(pair), pair.info))


def max_top_ulp_err(pair: Pair, quantile: float, floor: float) -> float:
    """Max own-magnitude ULP error over the elements with |b| >= quantile of |b|."""

    def compute() -> float:
        top = pair.abs_b >= abs_b_quantile(pair, quantile)
        scale = tolerance_scale(pair, floor)[top]
        return float((pair.abs_err[top] / ulp_of(scale, pair.info)).max())

    return pair.memoise(("top_ulp", quantile, floor), compute)


def single_run_metrics(pair: Pair) -> dict[str, float]:
    """Our own metrics of the single-run rule (names distinct from the spec's)."""

    def compute() -> dict[str, float]:
        if pair.n_finite == 0:
            return {
                "max_scaled_ulp_err": 0.0,
                "mean_scaled_ulp_err": 0.0,
                "max_top_ulp_err": 0.0,
                **statistics(NO_SUMS),
            }
        defaults = pair.info.defaults
        scaled = scaled_ulp_err(pair)
        blocks = sample_blocks(pair.n_finite)
        sums = BiasSums(pair.info, abs_b_quantile(pair, 0.5), pair.n_finite, pair.near_zero_limits)
        for part in blocks:
            sums.add(pair.df[part], pair.bf_rounded[part], pair.bf[part], pair.diff[part], pair.abs_b[part])
        return {
            "max_scaled_ulp_err": float(scaled.max()),
            "mean_scaled_ulp_err": sum(float(scaled[part].sum()) for part in blocks)
            / sum(part.stop - part.start for part in blocks),
            "max_top_ulp_err": max_top_ulp_err(pair, defaults["sr_top_quantile"], defaults["sr_scale_floor"]),
            **grouped_z(pair, statistics(sums.sums)),
            **far_metrics(pair),
        }

    return pair.memoise("single_run_metrics", compute)


def single_run_reasons(
    pair: Pair,
    metrics: dict[str, float],
    limits: Mapping[str, float],
    used: dict[str, float],
    bias_limit: str = "sr_bias_ulp",
) -> list[str]:
    """Reasons the single-run rule fails (empty list: pass); copies its limits into `used`.
    `bias_limit`: the threshold that bounds the bias means (a standard's own, bias.py)."""
    reasons: list[str] = []
    thresholds = used
    for key in ("sr_max_scaled_ulp", "sr_mean_scaled_ulp", "sr_max_top_ulp", bias_limit, "sr_bias_z"):
        used[key] = limits.get(key, pair.info.defaults[key])
    mean_limit = thresholds["sr_mean_scaled_ulp"] * (1 + 2 / math.sqrt(max(pair.n_finite, 1)))
    for key, limit, what in (
        ("max_scaled_ulp_err", thresholds["sr_max_scaled_ulp"], "at max(|b|, rms(b))"),
        ("mean_scaled_ulp_err", mean_limit, "at max(|b|, rms(b)), mean"),
        ("max_top_ulp_err", thresholds["sr_max_top_ulp"], "of their own magnitude in the largest 10% of elements"),
    ):
        if metrics[key] > limit:
            reasons.append(
                Reason(f"{key} {metrics[key]:.4g} > {limit:.4g} ULP of {pair.info.name} ({what})", {key: limit})
            )
    if limits.get(LIB_BIAS_KEY, 0.0) > 0:
        used[LIB_BIAS_KEY] = limits[LIB_BIAS_KEY]
    reasons.extend(
        bias_reasons(metrics, thresholds["sr_bias_z"], thresholds[bias_limit], allowance=limits.get(LIB_BIAS_KEY, 0.0))
    )
    reasons.extend(far_reasons(metrics))  # 16-bit, on the plain path (misrounding.py)
    return reasons


def fast_single_run(
    pair: Pair, spec: PassSpec, scaled: bool, top: bool = True
) -> tuple[PassResult, dict[str, float]] | None:
    """The single-run metrics in one fused pass (fast.py), with the standard's own `spec`.

    -> (pass results, single_run_metrics-like dict) or None (take the plain path). With
    scaled=False the two scaled-ULP metrics are not computed (reported as 0); with
    top=False neither is `max_top_ulp_err` (left out: the caller bounds it, see ulp.py), and
    neither the RMS nor the top quantile is needed. The bias sample is fed to
    chunks.BiasSums in the pass, while each chunk is in cache, as the plain path feeds it.
    """
    defaults = pair.info.defaults
    q_half, *q_top = fast.abs_b_quantiles(pair, (0.5, defaults["sr_top_quantile"]) if top else (0.5,))
    spec = replace(spec, sample=sample_step(pair.n), bias_q=q_half, near_zero=pair.near_zero_limits)
    if scaled or top:
        top_scale = (q_top[0], defaults["sr_scale_floor"]) if top else None
        res = fast.run_with_rms(pair, spec, scaled, top_scale)
    else:
        res = fast.run(pair, spec)
    if res is None:
        return None
    scaled_sums = res.of(ScaledSums) if scaled else None
    metrics = {
        "max_scaled_ulp_err": float(scaled_sums.max) if scaled_sums is not None else 0.0,
        "mean_scaled_ulp_err": scaled_sums.total / scaled_sums.count if scaled_sums is not None else 0.0,
    }
    if top:
        metrics["max_top_ulp_err"] = float(res.of(TopError).max)
    metrics.update(grouped_z(pair, statistics(res.of(BiasTotals).sums)))
    return res, metrics


def with_bias_sample(pair: Pair, spec: PassSpec) -> PassSpec:
    """`spec` with the bias sample a single run's pass feeds (fast_single_run): against a
    baseline's metrics the call's bias sums are its kernel's evidence (bias.judge_bias),
    the same numbers in the same pass."""
    (q_half,) = fast.abs_b_quantiles(pair, (0.5,))
    return replace(spec, sample=sample_step(pair.n), bias_q=q_half, near_zero=pair.near_zero_limits)


def bias_sums(res: PassResult, spec: PassSpec) -> dict[str, float] | None:
    """The bias statistics of a pass run with with_bias_sample's spec, else None."""
    return statistics(res.of(BiasTotals).sums) if spec.bias_q is not None else None


def fast_max_top_ulp_err(pair: Pair) -> float | None:
    """max_top_ulp_err by a fused pass of its own (fast.py); None: take the plain path."""
    defaults = pair.info.defaults
    (q_top,) = fast.abs_b_quantiles(pair, (defaults["sr_top_quantile"],))
    res = fast.run_with_rms(pair, PassSpec(), False, (q_top, defaults["sr_scale_floor"]))
    return float(res.of(TopError).max) if res is not None else None
