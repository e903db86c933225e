"""What the HTML report reads from an output's element sample (judge/check/samples.py): the
points of its plots, ready to draw, and the tolerance its standard applied, as a curve.

Why a curve per standard: "how far off" only means something next to what was allowed.
Each standard's record keeps the thresholds it used (OutputResult.thresholds) and the
metrics of its reference; TOLERANCES turns those into the largest |device - bench| an
element of magnitude |bench| may have, the line the scatter plot draws. Where a
standard judges no single element (binary consistency: any difference; a ratio to a
reference of metrics not kept), there is no line, and the caption says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from pytest_msprobe.judge.verdict.record import ElementSample, OutputResult

if TYPE_CHECKING:
    from pytest_msprobe.standards.dtypes import Array, DtypeInfo

#: an output's metrics or thresholds, by name (judge/verdict/record.py's OutputResult)
Metrics: TypeAlias = dict[str, float]

TOLERANCE_POINTS = 64
ULP_FLOOR = 2.0**-6  # histogram: smaller ULP errors (exact elements too) fall in its first bin
MAX_BINS = 40


@dataclass(frozen=True)
class PlotData:
    """One output's plots as plain arrays: what plots.render draws (no standards,
    no torch: a rendering process imports only numpy and matplotlib)."""

    magnitude: Array  # |bench| of the sampled finite elements
    error: Array  # |device - bench| of the same
    worst_magnitude: Array  # the standard's worst elements (finite ones)
    worst_error: Array
    tolerance: tuple[Array, Array] | None  # (|bench|, largest allowed error)
    ulp_counts: Array  # histogram of the errors in ULPs of the device dtype
    ulp_edges: Array
    ulp_limit: float | None  # the ULP standard's threshold, a vertical line
    dtype: str
    grid: Array | None  # heatmap cells (rows x cols), largest scaled ULP error
    rows: int = 0
    cols: int = 0


@dataclass(frozen=True)
class Tolerance:
    curve: Callable[[Array], Array] | None
    text: str


def plot_data(output: OutputResult, sample: ElementSample) -> PlotData | None:
    """The plots of a sampled output, or None where there is nothing to draw (an
    integer output keeps only its worst elements)."""
    from pytest_msprobe.standards.dtypes import dtype_info
    from pytest_msprobe.standards.metrics import ulp_of

    if not sample.get("bench"):
        return None
    info = dtype_info(output.device_dtype)
    bench = np.asarray(sample.get("bench", ()), dtype=np.float64)
    device = np.asarray(sample.get("device", ()), dtype=np.float64)
    with np.errstate(all="ignore"):
        error = np.abs(device - bench)
    finite = np.isfinite(error) & np.isfinite(bench)
    magnitude, error = np.abs(bench[finite]), error[finite]
    worst = np.asarray([[item[1], item[2]] for item in sample.get("worst", ())], dtype=np.float64).reshape(-1, 2)
    with np.errstate(all="ignore"):
        worst_error = np.abs(worst[:, 0] - worst[:, 1])
    worst_ok = np.isfinite(worst_error) & np.isfinite(worst[:, 1])
    ulps = error / ulp_of(magnitude, info) if magnitude.size else np.zeros(0)
    counts, edges = ulp_histogram(ulps)
    tolerance = tolerance_of(output, float(sample.get("rms", 0.0)))
    heat = sample.get("heatmap")
    return PlotData(
        magnitude=magnitude,
        error=error,
        worst_magnitude=np.abs(worst[worst_ok, 1]),
        worst_error=worst_error[worst_ok],
        tolerance=_curve_points(tolerance, magnitude, worst[worst_ok, 1]),
        ulp_counts=counts,
        ulp_edges=edges,
        ulp_limit=output.thresholds.get("ulp_threshold") if output.standard == "ulp" else None,
        dtype=output.device_dtype,
        grid=np.asarray(heat["grid"], dtype=np.float64) if heat else None,
        rows=int(heat["rows"]) if heat else 0,
        cols=int(heat["cols"]) if heat else 0,
    )


def ulp_histogram(ulps: Array) -> tuple[Array, Array]:
    """Counts over bins doubling from ULP_FLOOR (at most MAX_BINS, wider if need be)."""
    clipped = np.maximum(ulps, ULP_FLOOR)
    top = max(float(clipped.max()) if clipped.size else 1.0, 2.0)
    octaves = math.ceil(math.log2(top / ULP_FLOOR)) + 1
    step = math.ceil(octaves / MAX_BINS)
    edges = ULP_FLOOR * 2.0 ** np.arange(0, octaves + step, step)
    counts, _ = np.histogram(clipped, edges)
    return counts, edges


def caption(output: OutputResult, sample: ElementSample, data: PlotData) -> str:
    """What the figure shows, in words: the sample, the tolerance line, the bins."""
    size = math.prod(output.shape) if output.shape else 1
    taken = len(sample.get("flat", ()))
    drawn = data.magnitude.size
    parts = [
        f"{taken} of {size} elements"
        + (" (a fixed random sample)" if taken < size else "")
        + (f", {taken - drawn} with an inf/NaN not drawn" if drawn < taken else "")
    ]
    parts.append(tolerance_of(output, float(sample.get("rms", 0.0))).text)
    parts.append(
        f"histogram: errors in ULPs of {output.device_dtype} at each element's magnitude "
        f"(below {ULP_FLOOR:g} ULP, exact ones included, in the first bin)"
    )
    if data.grid is not None:
        parts.append(
            f"heatmap: the largest error in each cell (ULPs of {output.device_dtype} at max(|bench|, rms)) "
            f"over all {data.rows} x {data.cols} elements (rows: all leading dimensions); "
            "grey: no error, red: an inf/NaN on one side"
        )
    return "; ".join(parts) + "."


def tolerance_of(output: OutputResult, rms: float) -> Tolerance:
    """The standard's per-element tolerance from the thresholds it applied."""
    make = TOLERANCES.get(output.standard)
    if make is None:
        return Tolerance(
            None, f"the {output.standard or 'applied'} standard judges no single element: no tolerance line"
        )
    from pytest_msprobe.standards.dtypes import dtype_info

    try:
        return make(output.thresholds, output.metrics, dtype_info(output.device_dtype), rms)
    except KeyError as missing:  # thresholds of a user's override that lack a key
        return Tolerance(None, f"no tolerance line: the {output.standard} thresholds lack {missing}")


def _curve_points(tolerance: Tolerance, magnitude: Array, worst_bench: Array) -> tuple[Array, Array] | None:
    shown = np.concatenate([magnitude, np.abs(worst_bench)])
    shown = shown[shown > 0]
    if tolerance.curve is None or not shown.size:
        return None
    low, high = float(shown.min()), float(shown.max())
    xs = np.geomspace(low / 2, max(high * 2, low), TOLERANCE_POINTS)
    return xs, tolerance.curve(xs)


def _ulps_at(info: DtypeInfo, x: Array) -> Array:
    from pytest_msprobe.standards.metrics import ulp_of

    return ulp_of(np.asarray(x, dtype=np.float64), info)


def _absolute_threshold(thresholds: Metrics, metrics: Metrics, info: DtypeInfo, rms: float) -> Tolerance:
    rtol, small, atol = thresholds["rtol"], thresholds["small"], thresholds["small_atol"]
    text = f"dashed: rel_err {rtol:.3g} above |bench| {small:.3g}, abs_err {atol:.3g} below"
    if "sr_abs_ulp" not in thresholds:
        return Tolerance(lambda x: np.where(x > small, rtol * x, atol), text + " (all elements must be within)")
    ulps, floor = thresholds["sr_abs_ulp"], thresholds["sr_scale_floor"]
    allowed = ulps * info.eps

    def curve(x: Array) -> Array:
        bound: Array = np.maximum(np.where(x > small, rtol * x, atol), allowed * np.maximum(x, floor * rms))
        return bound

    return Tolerance(
        curve,
        text + f", or {ulps:g} ULP of {info.name} at max(|bench|, {floor:.3g} x rms) (all elements must be within)",
    )


def _accumulative_error(thresholds: Metrics, metrics: Metrics, info: DtypeInfo, rms: float) -> Tolerance:
    bound, small = thresholds["bound"], thresholds["small"]
    return Tolerance(
        lambda x: np.where(x > small, bound * x, bound),
        f"dashed: rel_err {bound:.3g} above |bench| {small:.3g}, abs_err {bound:.3g} below "
        "(all elements must be within; the error balance is judged too)",
    )


def _ulp(thresholds: Metrics, metrics: Metrics, info: DtypeInfo, rms: float) -> Tolerance:
    from pytest_msprobe.standards.ulp import AT_OUTPUT_SCALE_KEY, accumulation_allowance

    limit, share = thresholds["ulp_threshold"], thresholds["ulp_prop_max"]
    text = f"dashed: {limit:g} ULP of {info.name} (at most a share {share:.3g} of elements above it)"
    if AT_OUTPUT_SCALE_KEY not in thresholds:
        return Tolerance(lambda x: limit * _ulps_at(info, x), text)
    # a single run judges the error beyond the accumulator's rounding at the output's scale
    # too (standards/ulp.py: by each element's row and column, drawn at the output's RMS)
    return Tolerance(
        lambda x: limit * _ulps_at(info, x) + accumulation_allowance(np.maximum(x, rms), info),
        text + f", beyond {thresholds[AT_OUTPUT_SCALE_KEY]:g} accumulator unit roundoffs at max(|bench|, rms)",
    )


def _thousandth(thresholds: Metrics, metrics: Metrics, info: DtypeInfo, rms: float) -> Tolerance:
    share = thresholds["rel_err_thousandth"]
    text = f"dashed: rel_err 0.001 (a share {share:.4g} of elements must be within)"
    if "sr_thousandth_ulp" not in thresholds:
        return Tolerance(lambda x: 0.001 * x, text)
    ulps = thresholds["sr_thousandth_ulp"]
    allowed = ulps * info.eps
    return Tolerance(
        lambda x: np.maximum(0.001 * x, allowed * np.maximum(x, rms)),
        text + f", or {ulps:g} ULP of {info.name} at max(|bench|, rms)",
    )


def _benchmark(thresholds: Metrics, metrics: Metrics, info: DtypeInfo, rms: float) -> Tolerance:
    if "sr_max_scaled_ulp" in thresholds:
        limit = thresholds["sr_max_scaled_ulp"]
        return Tolerance(
            lambda x: limit * _ulps_at(info, np.maximum(x, rms)),
            f"dashed: {limit:g} ULP of {info.name} at max(|bench|, rms), the single-run rule's largest "
            "error (its mean, top decile and bias are judged too)",
        )
    if "max_rel_err_ratio" in thresholds and "ref_max_rel_err" in metrics:
        ratio, small, atol = thresholds["max_rel_err_ratio"], thresholds["small"], thresholds["atol_bm"]
        allowed = ratio * metrics["ref_max_rel_err"]
        return Tolerance(
            lambda x: np.where(x > small, allowed * x, atol),
            f"dashed: {ratio:g} x the reference's max_rel_err ({allowed:.3g}) above |bench| {small:.3g}, "
            f"abs_err {atol:.3g} below (the mean, rmse and small-value ratios are judged too)",
        )
    return Tolerance(None, "the benchmark standard judged ratios to recorded metrics: no per-element line")


# standard -> its tolerance from (thresholds, metrics, device dtype info, rms of the bench)
TOLERANCES: dict[str, Callable[[Metrics, Metrics, DtypeInfo, float], Tolerance]] = {
    "absolute_threshold": _absolute_threshold,
    "accumulative_error": _accumulative_error,
    "ulp": _ulp,
    "thousandth": _thousandth,
    "benchmark": _benchmark,
    "binary_consistency": lambda thresholds, metrics, info, rms: Tolerance(
        None, "binary consistency: any difference is an error (no tolerance)"
    ),
}
