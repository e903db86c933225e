"""Elements near zero: where an error in ULPs of the element's own magnitude stops saying
anything about accuracy, so the tests that count in such ULPs leave them out.

Why. The ULP of D at a bench value b shrinks with |b| down to D's smallest subnormal,
so an element whose exact value is 0 or nearly so is millions of ULPs off for any
absolute difference a correct library makes there: a softmax that clamps `x - max` at
-64 before `exp` gives e^-64 / sum ~ 1.6e-28 where the exact result is 0 (at -88,
float32's own underflow, a subnormal). The sign tests (bias.py: additive and scale, by
element and by group, and the kernel verdicts that pool them), their means in ULPs and
the far-misrounding test (misrounding.py) judge each element at its own magnitude, so
they counted every such element as misrounded by the full clip, one way.

The rule: an element whose bench magnitude is at most the standards' small-value
threshold `small` (the spec's small(D): float16 and bfloat16 2**-10, float32 2**-20, or
the API's own where a threshold table overrides it), whose absolute error is within the
small-value tolerance `small_atol` that msprobe's absolute-threshold standard applies to
the same elements (float16 and bfloat16 2**-16, float32 2**-30), and whose error in ULPs
of its own magnitude (without D's subnormal floor: a relative error) is past the clip the
bias means already apply (chunks.BIAS_CLIP, 64 ULPs: beyond it they stop measuring) is
correct by the standards' absolute rule, and is
left out of those tests' counts and means. Every other element is judged as before.

Why the third condition: within small_atol alone, 2**-16 is more than an ULP of every
16-bit value below 2**-9, so every misrounding below `small` would be left out. A
bfloat16 softmax over 64 inputs of spread 2 has 54 of its 64 results below 2**-10, and its
truncation then moved only 7 of the elements the tests still read
(tests/standards/test_accuracy_model.py, seed 8); an attention row over 4096 keys has
nearly all of them there; a float32 gradient whose every element is below 2**-20 would
have escaped a 30-ULP bias. A misrounding is an ULP or so of the element's own
magnitude, a clamp or an underflow millions: the clip tells them apart. Why small_atol,
not the benchmark standard's atol_bm (1e-16 in 16-bit): msprobe uses that one only as a
ratio to a second device's share, and as an absolute limit it is below float16's
smallest subnormal.

The one place the elements are split is `left_out`; chunks.BiasSums (both paths of the
bias statistics: the plain one and the fused chunked pass), bias.grouped_z and
misrounding.far_metrics all take it from there. msprobe's own metrics are unchanged
(the ULP standard's max_ulp_err, mean_ulp_err, ulp_err_proportion, the benchmark's
small_value_err_ratio): the spec defines them, and the baselines and CSVs compare them
across runs and tools.
"""

from __future__ import annotations

import numpy as np

from .dtypes import Array

__all__ = ["NEAR_ZERO_N", "left_out"]

#: how many elements near zero within the tolerance were left out (reported only where some were)
NEAR_ZERO_N = "near_zero_n"


def left_out(abs_b: Array, abs_err: Array, relative_clip: float, limits: tuple[float, float]) -> Array:
    """Which elements the tests in ULPs of their own magnitude leave out: |b| <= small
    (the standards' small_mask), |d - b| <= small_atol, and |d - b| > relative_clip |b|:
    past the bias means' clip in ULPs of |b| itself, without D's subnormal floor
    (relative_clip = chunks.BIAS_CLIP x 2**-m). `limits` = (small, small_atol). Judged
    on the elements below small only (usually few, and none is the common case)."""
    small, tolerance = limits
    mask: Array = np.zeros(abs_b.shape, dtype=bool)
    if abs_b.size == 0 or float(abs_b.min()) > small:
        return mask
    near = np.flatnonzero(abs_b <= small)
    b, err = abs_b[near], abs_err[near]
    mask[near[(err <= tolerance) & (err > relative_clip * b)]] = True
    return mask
