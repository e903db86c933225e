"""The sign tests' verdict from their sums: pure arithmetic, no numpy, no torch.

bias.py computes each output's sums and judges them here; the kernel verdicts
(judge/gate/kernel_verdicts.py) judge the sums of every call of a kernel with the same rule. The
xdist controller pools them and imports no torch (it starts no device): so this
module imports nothing of the standards' numerics.
"""

from __future__ import annotations

import math

from .verdict import Reason

__all__ = ["LIB_BIAS_KEY", "SHARED_ROUNDING_ULP", "beyond_lean", "bias_failures", "bias_reasons", "signs_z"]

#: the threshold holding the lean a correct library of the API's class may have, in ULPs
#: of D (accuracy.py, tables/accuracy_model.csv)
LIB_BIAS_KEY = "lib_bias_ulp"

#: how far (ULPs of D) two correct kernels' roundings of a group's shared quantity can
#: shift its elements apart: half an ULP each (bias.py's docstring, "Groups")
SHARED_ROUNDING_ULP = 1.0


def signs_z(total: float, spread: float) -> float:
    """Sign-test z from its sums: |sum S| / sqrt(sum S**2) (0 where nothing differs)."""
    return abs(total) / math.sqrt(spread) if spread else 0.0


def beyond_lean(metrics: dict[str, float], name: str, allowance: float, z_limit: float) -> float:
    """How certainly the mean of test `name` leans beyond `allowance` ULPs (the accuracy
    model's, standards/accuracy.py): (|mean| - allowance) over the mean's standard error,
    from the mean square of the errors (`bias_ulp_ms`) over `bias_n` elements; inf
    where there is no allowance (0) or the errors do not vary. Elements of one group
    are correlated, so this error is too small there: the test errs toward failing."""
    mean = metrics[f"{name}_ulp"]
    if allowance <= 0.0:
        return math.inf
    excess = abs(mean) - allowance
    n, mean_square = metrics.get("bias_n", 0.0), metrics.get("bias_ulp_ms")
    if mean_square is None or n <= 0:
        return math.inf if excess > 0 else -math.inf
    error = math.sqrt(max(mean_square - mean * mean, 0.0) / n)
    if error == 0.0:
        return math.copysign(math.inf, excess) if excess else -math.inf
    return excess / error


def bias_reasons(
    metrics: dict[str, float],
    z_limit: float,
    ulp_limit: float,
    reference: dict[str, float] | None = None,
    allowance: float = 0.0,
) -> list[str]:
    """A reason per failed test (bias_failures)."""
    return list(bias_failures(metrics, z_limit, ulp_limit, reference, allowance).values())


def bias_failures(
    metrics: dict[str, float],
    z_limit: float,
    ulp_limit: float,
    reference: dict[str, float] | None = None,
    allowance: float = 0.0,
) -> dict[str, Reason]:
    """The failed tests (`bias`, `scale_bias`) and the reason of each: the device's sign test over its z limit AND its mean
    over the limit -- beyond the reference's own mean, when a reference run is given --
    AND, where the accuracy model allows the API's class a lean (`allowance`, float32
    and float64), the device's own mean certainly beyond it (beyond_lean > z_limit): a
    lean a correct library may have is no defect, whatever the reference run's.
    Where the elements are grouped, the groups' test with that limit, and the elements'
    test with a limit of at least SHARED_ROUNDING_ULP."""
    reasons: dict[str, Reason] = {}
    for name, what in (("bias", "additive"), ("scale_bias", "scale (toward/away from zero)")):
        mean = metrics[f"{name}_ulp"]
        excess = mean - (reference[f"ref_{name}_ulp"] if reference is not None else 0.0)
        lean = beyond_lean(metrics, name, allowance, z_limit)
        if lean <= z_limit:
            continue
        grouped = f"{name}_z_elements" in metrics
        tests = [(f"{name}_z", ulp_limit, "groups" if grouped else "")]
        if grouped:
            tests.append((f"{name}_z_elements", max(ulp_limit, SHARED_ROUNDING_ULP), ""))
        for z_key, limit, counted in tests:
            z = metrics[z_key]
            if z > z_limit and abs(excess) > limit:
                against = (
                    f"{excess:+.3g} ULP beyond the reference run's {reference[f'ref_{name}_ulp']:+.3g}"
                    if reference is not None
                    else "against the bench rounded to D"
                )
                model = (
                    f", beyond the {allowance:.3g} ULP a correct library of its class may lean (lib_bias_ulp; z {lean:.3g})"
                    if allowance > 0.0
                    else ""
                )
                reasons[name] = Reason(
                    f"systematic {what} bias: {name}_ulp {mean:+.3g} ULP, {against} (limit {limit:.3g}), "
                    f"with sign-test z {z:.3g} > {z_limit:.3g}" + (f" by {counted}" if counted else "") + model,
                    {f"{name}_ulp": limit, z_key: z_limit},
                )
                break
    return reasons
