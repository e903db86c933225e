"""The sign tests' verdict from their sums: pure arithmetic, no numpy, no torch.

bias.py computes each output's sums and judges them here; the kernel verdicts
(judge/kernels.py) judge the sums of every call of a kernel with the same rule. The
xdist controller pools them and imports no torch (it starts no device): so this
module imports nothing of the standards' numerics.
"""

from __future__ import annotations

import math

__all__ = ["SHARED_ROUNDING_ULP", "bias_reasons", "signs_z"]

#: how far (ULPs of D) two correct kernels' roundings of a group's shared quantity can
#: shift its elements apart: half an ULP each (bias.py's docstring, "Groups")
SHARED_ROUNDING_ULP = 1.0


def signs_z(total: float, spread: float) -> float:
    """Sign-test z from its sums: |sum S| / sqrt(sum S**2) (0 where nothing differs)."""
    return abs(total) / math.sqrt(spread) if spread else 0.0


def bias_reasons(metrics: dict[str, float], z_limit: float, ulp_limit: float, reference: dict[str, float] | None = None) -> list[str]:
    """A reason per failed test: the device's sign test over its z limit AND its mean
    over the limit -- beyond the reference's own mean, when a reference run is given.
    Where the elements are grouped, the groups' test with that limit, and the elements'
    test with a limit of at least SHARED_ROUNDING_ULP."""
    reasons = []
    for name, what in (("bias", "additive"), ("scale_bias", "scale (toward/away from zero)")):
        mean = metrics[f"{name}_ulp"]
        excess = mean - (reference[f"ref_{name}_ulp"] if reference is not None else 0.0)
        tests = [(metrics[f"{name}_z"], ulp_limit, "groups" if f"{name}_z_elements" in metrics else "")]
        if f"{name}_z_elements" in metrics:
            tests.append((metrics[f"{name}_z_elements"], max(ulp_limit, SHARED_ROUNDING_ULP), ""))
        for z, limit, counted in tests:
            if z > z_limit and abs(excess) > limit:
                against = (
                    f"{excess:+.3g} ULP beyond the reference run's {reference[f'ref_{name}_ulp']:+.3g}"
                    if reference is not None
                    else "against the bench rounded to D"
                )
                reasons.append(
                    f"systematic {what} bias: {name}_ulp {mean:+.3g} ULP, {against} (limit {limit:.3g}), "
                    f"with sign-test z {z:.3g} > {z_limit:.3g}" + (f" by {counted}" if counted else "")
                )
                break
    return reasons
