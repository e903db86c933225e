"""Rounding bias: the error-balance test every floating standard applies.

A kernel that rounds in one direction (truncation in a float32 -> bfloat16 conversion,
an accumulator rounded toward zero) keeps every element within a ULP, so no magnitude
criterion sees it, yet it shifts every result the same way and training drifts. Its
signature is in the signs: the errors of correct rounding to nearest balance, a biased
kernel's do not. Two tests, each on the signed difference of the device from what it is
compared with, measured in ULPs of D at the element's own magnitude (clipped at
+-BIAS_CLIP, over the upper half of the elements by |b|: a cancelled element carries its
terms' rounding, correlated along its row) and, for the sign test, counted over all of
the sample:
  additive  `bias_ulp`, `bias_z`: d above vs below;
  scale     `scale_bias_ulp`, `scale_bias_z`: d away from vs toward zero (relative to
            sign(b)) -- rounding toward zero, a scale factor off by a few ULPs.
A test fails when its sign test's z-score exceeds `sr_bias_z` (5) AND its mean exceeds
the standard's limit: an imbalance that is both certain and large enough to matter. A
sign test over n elements has z <= sqrt(n), so outputs of 25 elements or fewer are not
tested (nothing is computed or reported for them).

What the device is compared with, by mode:
- without a reference, the bench rounded to D (b_D): correct rounding is then no error
  at all. Used by the single-run rule (single_run.py, limits `sr_bias_ulp`: fp16/bf16 0.2
  ULP, fp32 16 ULP, where a long reduction's shared normaliser biases correct kernels by
  up to +-9 ULP) and by the absolute-threshold standard with `at_bias_ulp`: its APIs are
  correctly rounded elementwise arithmetic, where a correct kernel's errors are
  independent per element and have no excuse for a bias -- fp16/bf16/fp8 0.2 ULP, so
  truncation (-0.5 ULP) is an error; fp32/fp64 1 ULP, because there a shared constant
  is itself rounded to D: `x * 0.1` multiplies by float32(0.1), 1.5e-8 above 0.1, which
  shifts every correct result by +0.125..+0.25 ULP (measured: scale_bias_ulp +0.23, z 5.1
  on the example dump's Tensor.__mul__), a division by a shared reciprocal by up to 0.7
  ULP; so single-run fp32 sees a bias of 1 ULP and more, not truncation. The ULP
  standard (matrix products: no shared normaliser either) uses `ulp_bias_ulp`, 0.2 ULP in
  fp16/bf16 and 0.25 in fp32, so a float32 dot product rounded toward zero (-0.5 ULP) is
  an error in a single run too: correct CPU matmuls and linears of the real dumps
  measured |mean| <= 0.33 ULP with z <= 3.5 (both needed to fail). The thousandth
  standard (convolutions) uses `sr_bias_ulp`.
- with a reference run on the same inputs (an accelerator's CPU reference in D, or the
  offline check): both runs' biases against b_D are measured (`bias_ulp` ... and
  `ref_bias_ulp` ...), and the device fails where its sign test is over the limit and its
  mean is more than `ref_bias_ulp` (0.25 ULP in every dtype) beyond the reference's: a
  bias that a correct kernel in D also has (a long reduction's shared normaliser) is
  excused by the reference having it too, a rounding defect is not: a float32 softmax or
  convolution rounded toward zero is caught here, which the single-run limit of 16 ULP
  cannot see. Comparing the two biases, not d with r element
  by element: the reference's own accumulation noise (several ULPs where a sum cancels)
  would drown a half-ULP rounding defect in d - r. In 16-bit a test fails only where it
  also fails against b_D with the single-run limit (`_beyond_the_reference`): the model's
  correct 16-bit kernel lies at b_D, so a reference run leaning away from it (torch's CPU
  cross_entropy gradient, -0.26 ULP) does not make a device at b_D the defective one.
- against a baseline's recorded metrics: no element values exist, so the magnitude
  ratios judge (reference.py); the bias test is not applied to the call. Its metrics
  against b_D (and the standard's own limit) are still reported: the plugin pools them
  into its kernels' verdicts, so that a kernel replayed against its baseline is judged
  as the run that recorded it judged it without a reference run.

What a correct library may lean (accuracy.py, tables/accuracy_model.csv). The limits above
were measured on ATen's own code paths, which share its formulas and math library; a
correct kernel of another library (CANN, CUDA's math library, XLA) leans further in
float32: gelu -0.5 ULP, tanh -1 ULP, x / 6 as x * (1/6) +0.33 ULP. Where the API's
class has a documented lean (`lib_bias_ulp`: float32, float64), a test fails only where
the device's own mean is also beyond it with certainty -- (|mean| - lean) over the
mean's standard error (from `bias_ulp_ms`, the mean square of the errors) above
`sr_bias_z`. A lean within what correct libraries document stays in the metrics and the
reports; 16-bit rows allow none, so there the limits above decide alone.

Groups. A correct kernel rounds a shared quantity once per group -- a softmax row's sum,
a layer_norm row's mean and 1/sigma, a batch_norm channel's batch statistics, a
division's one reciprocal -- and every element of the group inherits that rounding, so
their signs are not independent draws and a sign test that counts elements is certain
of a bias that a few groups make. Measured, two correct CPU kernel paths of torch
(ATEN_CPU_CAPABILITY default against avx512) on a real transformer dump: a float32
layer_norm of 8 rows of 32 had per-row scale sign sums -26, 13, -10, -26, -27, -17, 8, -3:
z 7.09 by elements, 1.88 by rows. Where the caller names the groups (check(groups=...),
the plugin's judge/verdict/groups.py per API), each sign test is the cluster-robust one:
z = |sum_g S_g| / sqrt(sum_g S_g**2), S_g the sum of a group's signs (`grouped_z`). It is
the element count's z where groups of one element are independent, and the group
count's where a group's signs all agree; a bias of every element (truncation) still
makes every S_g agree in sign, so z grows like the square root of the number of groups.
The element count's test still stands for a bias no shared rounding explains: each of two
correct kernels rounds a group's shared quantity once, by at most half an ULP of D, so
their groups' shifts differ by at most SHARED_ROUNDING_ULP (1 ULP); a mean beyond
max(limit, that) with the element count's z over its limit is an error however few the
groups (`bias_z_elements`, `scale_bias_z_elements`). Measured between correct kernels:
|scale_bias_ulp| <= 0.45 (bfloat16 batch_norm by channel, 40 convnets), 0.28 beyond the
reference (float32 layer_norm, softmax), 0.45 (a division by a scalar's reciprocal);
a planted softmax whose output is 2**-5 too large (4 bfloat16 ULPs) on 20 rows of 5
reaches z 4.5 by rows, below 5, and is caught by elements (5.5 ULP, z 10).

Sampling as the single-run rule's (single_run.py rule 4): at least 2**20 elements in
blocks, so a bias test costs a bounded pass whatever the output's size; where no fused
pass runs anyway (the thousandth standard), only the sampled blocks are read
(scans.sampled_bias).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .chunks import CHUNK, BiasSums
from .dtypes import Array
from .fast import QUANTILE_SAMPLE
from .metrics import Pair, sign_balance_z
from .misrounding import OPMATH_ROUNDED_BITS, far_metrics, far_reasons
from .near_zero import NEAR_ZERO_N
from .signs import LIB_BIAS_KEY, bias_failures, bias_reasons, signs_z

if TYPE_CHECKING:
    from .reference import Reference

__all__ = ["bias_metrics", "judge_bias", "grouped_z", "statistics", "sample_blocks", "STAT_SAMPLE"]

#: chunks.BiasSums' totals where no element is finite
NO_SUMS = (0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0)
#: the names of the bias metrics (and their sums, and the near-zero counts) begin so
BIAS_PREFIXES = ("bias_", "scale_bias_", "near_zero_")
#: the statistics are computed on a sample of at least this many elements (fewer than
#: twice as many; single_run.py rule 4 says why that loses nothing)
STAT_SAMPLE = 2**20


def sample_step(n: int) -> int:
    """Of n finite elements' blocks of chunks.CHUNK, every this-many-th is in the sample."""
    return max(1, n // STAT_SAMPLE)


def sample_blocks(n: int) -> list[slice]:
    """The statistical sample of n finite elements, as the fused pass takes it."""
    return [slice(lo, min(lo + CHUNK, n)) for lo in range(0, n, CHUNK * sample_step(n))]


def statistics(sums: Sequence[float], prefix: str = "") -> dict[str, float]:
    """The four bias metrics from chunks.BiasSums' totals (both paths of every standard),
    and the sums they come from (`bias_n`, `*_signs`, `*_signs_sq`, and `bias_ulp_ms`,
    the mean square of the ULP errors, which gives the means their standard error):
    what the calls of one kernel pool into its verdict (judge/gate/kernel_verdicts.py); and, where
    some elements were left out near zero (near_zero.py), how many."""
    pos, neg, outward, inward, n_upper, signed_sum, scale_sum, square_sum, n_near = sums
    near = {f"{prefix}{NEAR_ZERO_N}": float(n_near)}
    return {
        f"{prefix}bias_ulp": signed_sum / max(n_upper, 1),
        f"{prefix}bias_ulp_ms": square_sum / max(n_upper, 1),
        f"{prefix}bias_z": sign_balance_z(pos, neg),
        f"{prefix}scale_bias_ulp": scale_sum / max(n_upper, 1),
        f"{prefix}scale_bias_z": sign_balance_z(outward, inward),
        f"{prefix}bias_n": float(n_upper),
        f"{prefix}bias_signs": float(pos - neg),
        f"{prefix}bias_signs_sq": float(pos + neg),
        f"{prefix}scale_bias_signs": float(outward - inward),
        f"{prefix}scale_bias_signs_sq": float(outward + inward),
    } | (near if n_near else {})


def _clustered_sums(signs: Array, groups: Array) -> tuple[float, float]:
    """(sum_g S_g, sum_g S_g**2): the cluster-robust sign test's sums."""
    per_group = np.bincount(groups, weights=signs)
    return float(per_group.sum()), float(np.dot(per_group, per_group))


def grouped_z(pair: Pair, metrics: dict[str, float], prefix: str = "") -> dict[str, float]:
    """`metrics` with both sign tests' z counted by the pair's groups (module docstring),
    unchanged where it has none. Over every finite element: the groups' sums need all of
    a group's elements, not the sample's blocks."""
    groups = pair.groups
    if groups is None or not metrics or pair.n_finite == 0:
        return metrics
    ids = groups if groups.min() >= 0 else np.unique(groups, return_inverse=True)[1]
    additive = np.sign(pair.df - pair.bf_rounded) * ~pair.near_zero  # left out near zero (near_zero.py)
    grouped: dict[str, float] = {}
    for name, signs in (("bias", additive), ("scale_bias", additive * np.sign(pair.bf))):
        total, spread = _clustered_sums(signs, ids)
        grouped |= {
            f"{prefix}{name}_z": signs_z(total, spread),
            f"{prefix}{name}_signs": total,
            f"{prefix}{name}_signs_sq": spread,
            **{
                f"{prefix}{name}_{key}_elements": metrics[f"{prefix}{name}_{key}"] for key in ("z", "signs", "signs_sq")
            },
        }
    return {**metrics, **grouped}


def abs_b_quantile(pair: Pair, quantile: float) -> float:
    """A quantile of |b| over the finite elements (strided sample beyond QUANTILE_SAMPLE)."""

    def compute() -> float:
        step = max(1, pair.abs_b.size // QUANTILE_SAMPLE)
        return float(np.quantile(pair.abs_b[::step], quantile, method="lower"))

    return pair.memoise(("abs_b_quantile", quantile), compute)


def bias_metrics(pair: Pair) -> dict[str, float]:
    """The bias of d against b_D over the sample (the same numbers as the single-run
    rule's, which computes them in its own pass)."""

    def compute() -> dict[str, float]:
        if pair.n_finite == 0:
            return statistics(NO_SUMS)
        blocks = sample_blocks(pair.n_finite)
        sums = BiasSums(pair.info, abs_b_quantile(pair, 0.5), pair.n_finite, pair.near_zero_limits)
        for part in blocks:
            sums.add(pair.df[part], pair.bf_rounded[part], pair.bf[part], pair.diff[part], pair.abs_b[part])
        return grouped_z(pair, statistics(sums.sums))

    return pair.memoise("bias_metrics", compute)


def _beyond_the_reference(
    pair: Pair,
    metrics: dict[str, float],
    reference_metrics: dict[str, float],
    thresholds: Mapping[str, float],
    allowance: float,
) -> list[str]:
    """The sign tests against the reference run's bias (module docstring). In 16-bit, a
    test fails only where it also fails against the bench rounded to D with the
    single-run limit (`sr_bias_ulp`): the accuracy model's correct 16-bit kernel rounds
    once, so b_D is where it lies, and a reference run biased away from it (torch's CPU
    cross_entropy gradient taken from a log_softmax rounded to D, -0.26 ULP) does not
    make a device that lies at b_D (an H200's, +0.16 ULP) the defective one."""
    z_limit = thresholds["sr_bias_z"]
    failures = bias_failures(metrics, z_limit, thresholds["ref_bias_ulp"], reference_metrics, allowance)
    if pair.info.mantissa_bits <= OPMATH_ROUNDED_BITS:
        own = bias_failures(metrics, z_limit, thresholds["sr_bias_ulp"], allowance=allowance)
        failures = {name: reason for name, reason in failures.items() if name in own}
    return list(failures.values())


def judge_bias(  # noqa: PLR0913  every standard's bias test: the pair, reference, limits and what is already computed
    pair: Pair,
    reference: Reference | None,
    thresholds: Mapping[str, float],
    used: dict[str, float],
    limit_key: str,
    computed: dict[str, float] | None = None,
    *,
    any_size: bool = False,
) -> tuple[dict[str, float], list[str]]:
    """A standard's bias test: against the reference run's own bias where there is one (
    `ref_bias_ulp`), against b_D with the standard's own limit `limit_key` without one,
    never a reason against a baseline's metrics (its sums against b_D are reported: a
    kernel's evidence); and the far-misrounding test against the
    bench, which needs no reference (misrounding.py; the single-run rule applies it
    itself). `computed`: the single-run metrics a fused pass already has; `any_size`: the
    standard's single-run rule (single_run.py) reports the sums of outputs of any size,
    which a baseline's run then reports too. -> (metrics to report, reasons)."""
    z_limit = thresholds["sr_bias_z"]
    allowance = thresholds.get(LIB_BIAS_KEY, 0.0)
    lean = {LIB_BIAS_KEY: allowance} if allowance > 0 else {}
    baseline = reference is not None and reference.pair is None
    if pair.n <= z_limit**2 and not (baseline and any_size):
        return {}, []  # a sign test over n elements has z <= sqrt(n): it cannot fail
    if baseline:
        # a baseline's recorded metrics: no elements to test against, so no reason of
        # this call's. Its sums against b_D with the standard's own limit, as the run that
        # recorded the baseline reported them without a reference run, are its kernel's
        # evidence: the plugin pools them into the same kernel verdict
        used.update({limit_key: thresholds[limit_key], "sr_bias_z": z_limit, **lean})
        return (grouped_z(pair, computed) if computed is not None else bias_metrics(pair)), []
    far = far_metrics(pair)
    if reference is not None and reference.pair is not None:
        metrics = bias_metrics(pair)
        reference_metrics = {f"ref_{key}": value for key, value in bias_metrics(reference.pair).items()}
        used.update(ref_bias_ulp=thresholds["ref_bias_ulp"], sr_bias_z=z_limit, **lean)
        return {**metrics, **reference_metrics, **far}, _beyond_the_reference(
            pair, metrics, reference_metrics, thresholds, allowance
        ) + far_reasons(far)
    metrics = grouped_z(pair, computed) if computed is not None else bias_metrics(pair)
    used.update({limit_key: thresholds[limit_key], "sr_bias_z": z_limit, **lean})
    reasons = bias_reasons(metrics, z_limit, thresholds[limit_key], allowance=allowance)
    return {**metrics, **far}, reasons + far_reasons(far)
