"""The single-run rule: judging the benchmark and ULP standards without a reference.

msprobe judges these standards by RATIOS to a second device's errors. When the device
under test is the CPU (which also runs the bench) no independent reference exists, so we
judge the device against what any correct kernel in D can do, in ULPs of D:

1. Unexpected inf/NaN: an inf/NaN that the bench (rounded to D) does not have, or a
   finite value where the bench overflows/is NaN -> error. Same-sign infinities agree.
2. Magnitude: `scaled_ulp_err = |d - b| / ulp_D(max(|b|, f * rms(b)))`: the error in ULPs
   of D at the element's magnitude, but never finer than a fraction f of the output's RMS
   (f = 2**-6 for fp16/bf16/fp8, 1 for fp32/fp64), because a reduction's error follows the
   size of its terms, not of a result that cancels to ~0.
   error if `max_scaled_ulp_err > sr_max_scaled_ulp` or `mean_scaled_ulp_err >
   sr_mean_scaled_ulp` (fp16/bf16/fp8: 4 / 1 -- a kernel computing in fp32 and rounding
   once reaches 0.5 / 0.25; fp32/fp64: 4096 / 256 -- no higher accumulator exists, so
   long reductions legitimately reach tens of ULPs, while an input or accumulator in a
   lower precision costs 2**13 ULPs and more).
3. Bias: signs of `d - b_D` (b_D = bench rounded to D, so correct rounding is no error)
   must balance, both plainly (additive bias) and relative to sign(b) (scale bias, e.g.
   rounding toward zero). error if the sign test's z-score exceeds `sr_bias_z` (5) AND
   the mean signed ULP error (own-magnitude ULPs, clipped at +-64 so cancellation noise
   stays bounded) exceeds `sr_bias_ulp`: fp16/bf16/fp8 0.2 ULP; fp32/fp64 16 ULP. Why so
   high in fp32: errors of a row share its normalizer (softmax over 4096 elements on the
   CPU is measured +7..+9 ULP biased per run, z > 100), and a valid reciprocal-multiply
   shifts every result by up to ~0.7 ULP; so fp32 bias is judged only from 16 ULP up
   (the planted 30-ULP bias is caught), and rounding toward zero in fp32 is not.

Known limit: an element far below the output's RMS scale is judged at that scale, so
one wrong tiny element among large ones can pass in a single run (its relative error is
not demanded where a reduction could not deliver it either). Calibration (tests/
standards/kernels.py, test_calibration.py): 213 correct CPU kernel outputs and valid
rewrites in fp32/fp16/bf16 -> 0 errors, 0 warnings; 60 planted faults -> 60 errors.
"""
from __future__ import annotations

import numpy as np

from .metrics import BIAS_CLIP_ULP, Pair, sign_balance_z, ulp_of

__all__ = ["single_run_metrics", "single_run_reasons", "scaled_ulp_err"]


def _rms(values: np.ndarray) -> float:
    if values.size == 0:
        return 0.0
    peak = float(np.max(np.abs(values)))
    if peak == 0.0:
        return 0.0
    if peak < 1e150 and peak > 1e-150:
        return float(np.sqrt(np.mean(np.square(values))))
    return peak * float(np.sqrt(np.mean(np.square(values / peak))))


def scaled_ulp_err(pair: Pair) -> np.ndarray:
    """|d - b| in ULPs of D at max(|b|, rms(b)), per finite element (cached)."""
    def compute():
        scale = _rms(pair.bf) * pair.info.defaults["sr_scale_floor"]
        return pair.abs_err / ulp_of(np.maximum(pair.abs_b, scale), pair.info)
    return pair.cached("scaled_ulp_err", compute)


def single_run_metrics(pair: Pair) -> dict:
    """Our own metrics of the single-run rule (names distinct from the spec's)."""
    def compute():
        if pair.n_finite == 0:
            return {"max_scaled_ulp_err": 0.0, "mean_scaled_ulp_err": 0.0, "bias_ulp": 0.0,
                    "bias_z": 0.0, "scale_bias_ulp": 0.0, "scale_bias_z": 0.0}
        scaled = scaled_ulp_err(pair)
        signed = np.clip(pair.diff / pair.ulp, -BIAS_CLIP_ULP, BIAS_CLIP_ULP)
        sign_b = np.sign(pair.bf)
        pos, neg = pair.sign_counts
        up = pair.df > pair.bf_rounded
        down = pair.df < pair.bf_rounded
        outward = int(np.count_nonzero((up & (sign_b > 0)) | (down & (sign_b < 0))))
        inward = int(np.count_nonzero((down & (sign_b > 0)) | (up & (sign_b < 0))))
        return {
            "max_scaled_ulp_err": float(scaled.max()),
            "mean_scaled_ulp_err": float(scaled.mean()),
            "bias_ulp": float(signed.mean()),
            "bias_z": sign_balance_z(pos, neg),
            "scale_bias_ulp": float((signed * sign_b).mean()),
            "scale_bias_z": sign_balance_z(outward, inward),
        }
    return pair.cached("single_run_metrics", compute)


def single_run_reasons(pair: Pair, metrics: dict, limits, used: dict) -> list[str]:
    """Reasons the single-run rule fails (empty list: pass); copies its limits into `used`."""
    reasons: list[str] = []
    thresholds = used
    for key in ("sr_max_scaled_ulp", "sr_mean_scaled_ulp", "sr_bias_ulp", "sr_bias_z"):
        used[key] = limits.get(key, pair.info.defaults[key])
    if metrics["max_scaled_ulp_err"] > thresholds["sr_max_scaled_ulp"]:
        reasons.append(f"max_scaled_ulp_err {metrics['max_scaled_ulp_err']:.4g} > "
                       f"{thresholds['sr_max_scaled_ulp']:.4g} ULP of {pair.info.name}")
    if metrics["mean_scaled_ulp_err"] > thresholds["sr_mean_scaled_ulp"]:
        reasons.append(f"mean_scaled_ulp_err {metrics['mean_scaled_ulp_err']:.4g} > "
                       f"{thresholds['sr_mean_scaled_ulp']:.4g} ULP of {pair.info.name}")
    for name, what in (("bias", "additive"), ("scale_bias", "scale (toward/away from zero)")):
        z, mean = metrics[f"{name}_z"], metrics[f"{name}_ulp"]
        if z > thresholds["sr_bias_z"] and abs(mean) > thresholds["sr_bias_ulp"]:
            reasons.append(f"systematic {what} bias: {name}_ulp {mean:+.3g} ULP "
                           f"(|.| > {thresholds['sr_bias_ulp']:.3g}) with sign-test z "
                           f"{z:.3g} > {thresholds['sr_bias_z']:.3g}")
    return reasons
