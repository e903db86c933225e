"""The far-misrounding test: a 16-bit kernel that rounds otherwise than to nearest, caught
on outputs too small for the sign tests (bias.py) to be certain.

The sign tests need about 26 elements off the bench rounded to D, one way, to be
certain (z 5), and a truncating kernel moves about half of its elements: on 64 elements
it escaped them 5.2% of the time. The accuracy model says more (tables/accuracy_model.csv,
the 16-bit rows): a correct kernel computes in float32 and rounds to nearest once, and a
float32 error of a few ULPs is 2**-13 (float16) to 2**-16 (bfloat16) of an ULP of D, so
its result is never farther than half an ULP of D, plus that, from the bench. An element
off b_D and farther from b than half an ULP of D and OPMATH_ERROR_ULPS (64) float32 ULPs
(far_ulp: 0.5 + 2**-10 ULP of bfloat16, 0.5 + 2**-7 of float16) -- at the element's own
magnitude, its terms' where they are known (a cancelled sum) -- is then a rounding no
correct kernel makes; truncation makes one of nearly every element it moves (b in the
upper half of its ULP). An output fails where at least FAR_MIN (8) such elements lean one way
(additive: below/above b_D; scale: toward/away from zero) with a sign test z of at least
sqrt(FAR_MIN) over them: the few far elements an unmodelled cancellation makes fall
either way, and 8 agree by chance with probability 2**-7. On 64 elements a truncating
kernel that moves 8 elements or more is caught (tests/standards/test_accuracy_model.py:
1000 draws each of 6 kernels and 2 dtypes; the only misses moved 0 to 6 elements, where
truncation and rounding to nearest give the same output but for those few).

Where it applies. Only to the elements the caller names as rounded once (check's
`rounded_once`: the plugin's judge/verdict/rounding.py, per API and direction, measured on ATen's
CPU kernels): a correct kernel whose float32 formula cancels (gelu's tail) or that
rounds an intermediate at D (ATen's log_softmax, a normalisation's backward row sums) is
farther, and the first version of this test, applied by dtype alone, failed 44 tests of
ATen's own correct kernels. Only to D of OPMATH_ROUNDED_BITS significand bits or fewer
(float16, bfloat16, the float8 formats), and to outputs below fast.FAST_MIN_N elements:
from there the sign tests alone are certain of truncation (z about 180), and the element
arrays this test reads are what the fused pass avoids.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .dtypes import DtypeInfo
from .fast import FAST_MIN_N
from .metrics import Pair, ulp_of
from .verdict import Reason

__all__ = ["far_metrics", "far_reasons", "far_ulp", "FAR_MIN"]

#: float32 ULPs a correct float32 opmath result (and the bench) may be off: the math
#: libraries' documented worst cases are 1-6 ULPs (tables/accuracy_model.csv: lgammaf's
#: 6, the derived mish's 5.5), on each side; 64 leaves five times that for a normaliser's
#: rounding carried into its elements
OPMATH_ERROR_ULPS = 64
#: float32's significand bits after the point
FLOAT32_BITS = 23
#: far misroundings one way, at least, for the test to fail
FAR_MIN = 8
#: the counts' names: below and above b_D, toward and away from zero
FAR_KEYS = ("far_below", "far_above", "far_toward_zero", "far_away_from_zero")
#: the widest significand (bits after the point) a float32 opmath result is rounded to
#: once with float32's error far below D's ULP: float16's 10 (bfloat16 7, float8 fewer)
OPMATH_ROUNDED_BITS = 10


def far_ulp(info: DtypeInfo) -> float:
    """(ULPs of D) how far from the bench a correct 16-bit result can be: half an ULP,
    and OPMATH_ERROR_ULPS float32 ULPs."""
    return 0.5 + OPMATH_ERROR_ULPS * 2.0 ** (info.mantissa_bits - FLOAT32_BITS)


def far_metrics(pair: Pair) -> dict[str, float]:
    """Counts of the elements rounded once (pair.rounded_once) that are off b_D and over
    FAR_ULP from b, by direction; none (an empty dict) where the test does not apply
    (module docstring)."""
    once = pair.rounded_once
    if once is None or pair.info.mantissa_bits > OPMATH_ROUNDED_BITS or pair.n >= FAST_MIN_N or pair.n_finite == 0:
        return {}

    def compute() -> dict[str, float]:
        judged = once & ~pair.near_zero  # near zero within its absolute tolerance: correct (near_zero.py)
        d, b_rounded, b = pair.df[judged], pair.bf_rounded[judged], pair.bf[judged]
        terms = pair.terms
        scale = pair.abs_b[judged] if terms is None else terms[judged]
        far = (d != b_rounded) & (np.abs(d - b) > far_ulp(pair.info) * ulp_of(scale, pair.info))
        below = d[far] < b_rounded[far]
        toward = below == (b[far] > 0)
        counts = (below.sum(), (~below).sum(), toward.sum(), (~toward).sum())
        return dict(zip(FAR_KEYS, map(float, counts), strict=True))

    return pair.memoise("far_metrics", compute)


def far_reasons(metrics: Mapping[str, float]) -> list[str]:
    """A reason per direction whose far misroundings lean one way (module docstring);
    none where the metrics have no counts."""
    reasons: list[str] = []
    below, above, toward, away = FAR_KEYS
    for one, other, what in ((below, above, "additive"), (toward, away, "scale")):
        if one not in metrics:
            continue
        many, few = max(metrics[one], metrics[other]), min(metrics[one], metrics[other])
        if many >= FAR_MIN and (many - few) ** 2 >= FAR_MIN * (many + few):  # z >= sqrt(FAR_MIN), in integers
            leaning = one if metrics[one] >= metrics[other] else other
            side = leaning.removeprefix("far_").replace("_", " ")
            reasons.append(
                Reason(
                    f"{what} misrounding: {many:.0f} elements {side} and over half an ULP (and {OPMATH_ERROR_ULPS} float32 ULPs) "
                    f"from the bench "
                    f"(against {few:.0f} the other way): a float32 result rounded to nearest once is never so far, "
                    "so the kernel rounds otherwise (truncation?)",
                    {leaning: FAR_MIN},
                )
            )
    return reasons
