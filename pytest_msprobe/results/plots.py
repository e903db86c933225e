"""The report's figures: matplotlib, rendered to SVG for inlining in the page.

One figure per sampled output: the error of each element against its bench value's
magnitude with the standard's tolerance (log-log, the standard's worst elements in red),
a histogram of the errors in ULPs of the device dtype, and for 2-D and larger outputs a
heatmap of where in the tensor the errors sit.

Why it looks like this, and not like matplotlib's tutorial: a report of 200 failing
calls renders 200 figures, and a fresh figure with three axes costs ~0.5 s (mathtext
tick labels, tight_layout, creating ticks). So each layout's figure is made once per
process and its artists updated for every output; tick labels are plain text, axis
labels sit at fixed places, margins are fixed (benchmarks/RESULTS.md, HTML report: ~33 ms a
figure). The scatter is rasterized (one embedded PNG, not a thousand markers) and text
stays text, which keeps a figure ~14 kB. matplotlib's settings are ours only inside
rc_context: a user's own figures in the same process keep theirs. Only numpy and
matplotlib are imported here: a rendering process needs nothing else.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.collections import PathCollection
    from matplotlib.colorbar import Colorbar
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D
    from matplotlib.patches import StepPatch
    from matplotlib.typing import RcKeyType

    from pytest_msprobe.results.elements import PlotData
    from pytest_msprobe.standards.dtypes import Array

SVG_RC: dict[RcKeyType, Any] = {  # Any: rc values are of each key's own type
    "svg.fonttype": "none",  # text as text: small, selectable
    "svg.hashsalt": "msprobe",  # the same ids in every run: a report is reproducible
    "font.size": 8,
    "font.sans-serif": ["DejaVu Sans"],
    "axes.formatter.use_mathtext": False,
    "savefig.dpi": 72,  # the rasterized scatter's resolution
}
COLORS = {"points": "#7f7f7f", "worst": "#d62728", "tolerance": "#1f77b4", "bars": "#9467bd"}
HEATMAP_LEVELS = 10
TICKS = 4  # labelled ticks an axis has at most: each costs ~0.7 ms to lay out
PER_PROCESS = 16  # figures a rendering process must have at least: one takes ~1 s to start
MAX_PROCESSES = 8
MIN_CPUS = 2  # the report is drawn when the run's tests are done: every CPU is free for it
DECIMALS = re.compile(r"(\d\.\d)\d+")


@dataclass
class Canvas:
    """A figure made once per layout and reused: its axes and the artists updated."""

    figure: Figure
    scatter: Axes
    points: PathCollection
    worst: PathCollection
    tolerance: Line2D
    histogram: Axes
    bars: StepPatch
    ulp_limit: Line2D
    heatmap: Axes | None = None
    image: AxesImage | None = None
    colorbar: Colorbar | None = None


def render(data: PlotData) -> str:
    """An SVG document of one output's plots (elements.PlotData)."""
    import matplotlib

    with matplotlib.rc_context(SVG_RC):
        canvas = _canvas(data.grid is not None)
        _draw_scatter(canvas, data)
        _draw_histogram(canvas, data)
        if data.grid is not None:
            _draw_heatmap(canvas, data)
        buffer = io.StringIO()
        canvas.figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return buffer.getvalue()


def render_all(datas: Sequence[PlotData]) -> list[str]:
    """render() of each, in order. A figure costs ~30 ms of Python in matplotlib, so
    on a machine of MIN_CPUS or more, many figures are shared out among processes; a
    pool that cannot start or breaks leaves the figures to this process."""
    cpus = _cpus()
    processes = min(cpus, MAX_PROCESSES, len(datas) // PER_PROCESS) if cpus >= MIN_CPUS else 1
    rendered = _in_processes(datas, processes) if processes >= 2 else None
    return rendered if rendered is not None else [render(data) for data in datas]


def _in_processes(datas: Sequence[PlotData], processes: int) -> list[str] | None:
    """render() of each by a pool of `processes`; None if the pool cannot start or breaks."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # spawn: a fresh interpreter that imports numpy and matplotlib only, never a
    # fork of a process that holds torch, its threads and a device
    try:
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            return list(pool.map(render, datas, chunksize=max(1, len(datas) // (processes * 4))))
    except (BrokenProcessPool, OSError):
        return None


def _cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def inline_svg(svg: str, prefix: str) -> str:
    """An SVG document made fit to sit inline in a page beside others: no prolog or
    metadata, ids prefixed (two figures' clip paths must not collide), coordinates to
    one decimal, no indentation, fonts from the page's CSS."""
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r'<g id="[^"]*">', "<g>", svg)  # group ids are never referred to
    svg = re.sub(r"font-family: [^;\"]*;? ?|font-size: 8px;? ?", "", svg)  # the page's CSS sets both
    svg = re.sub(r'(<use [^>]*?) style="stroke: #000000; stroke-width: 0.8"', r"\1", svg)  # a tick: its def has it
    svg = re.sub(r' transform="rotate\(-0 [^)]*\)"', "", svg)
    svg = re.sub(r' (?:d|x|y)="[^"]*"', _short_numbers, svg)  # in positions only: labels keep their digits
    svg = re.sub(r'(id="|url\(#|href="#)', lambda match: match.group(1) + prefix, svg)
    svg = re.sub(r">\s+<", "><", svg)
    return re.sub(r"\s*\n\s*", " ", svg)


def _short_numbers(attribute: re.Match[str]) -> str:
    """Coordinates to one decimal (a tenth of a point), in path data and positions only
    (a transform's scale must keep its digits: 48 image cells times its error)."""
    return DECIMALS.sub(r"\1", attribute.group(0))


@functools.cache
def _canvas(with_heatmap: bool) -> Canvas:
    """The figure of a layout (made inside render's rc_context; no pyplot, no backend
    switched: a Figure saves itself as SVG)."""
    from matplotlib import ticker
    from matplotlib.figure import Figure

    panels = 3 if with_heatmap else 2
    figure = Figure(figsize=(3.3 * panels, 2.6))
    figure.subplots_adjust(left=0.22 / panels, right=0.99 - 0.05 / panels, bottom=0.2, top=0.96, wspace=0.42)
    axes = figure.subplots(1, panels)
    scatter, histogram = axes[0], axes[1]
    scatter.set_xscale("log")
    scatter.set_yscale("log")
    for axis in (scatter.xaxis, scatter.yaxis):
        _log_ticks(axis)
    points = scatter.scatter([1.0], [1.0], s=5, c=COLORS["points"], linewidths=0, rasterized=True)
    worst = scatter.scatter([1.0], [1.0], s=16, c=COLORS["worst"], linewidths=0, zorder=3)
    (tolerance,) = scatter.plot([1.0, 2.0], [1.0, 2.0], "--", color=COLORS["tolerance"], lw=1.2, zorder=2)
    _labels(scatter, "|bench|", "|device - bench|")
    histogram.set_xscale("log", base=2)
    _log_ticks(histogram.xaxis, base=2)
    histogram.yaxis.set_major_locator(ticker.MaxNLocator(TICKS - 1, integer=True))
    bars = histogram.stairs([1.0], [1.0, 2.0], fill=True, color=COLORS["bars"])
    ulp_limit = histogram.axvline(1.0, ls="--", color=COLORS["tolerance"], lw=1.2)
    _labels(histogram, "error in ULPs", "elements")
    canvas = Canvas(figure, scatter, points, worst, tolerance, histogram, bars, ulp_limit)
    if with_heatmap:
        _heatmap_axes(canvas, axes[2])
    return canvas


def _heatmap_axes(canvas: Canvas, heatmap: Axes) -> None:
    """The heatmap shows each cell's decade position between the figure's bounds on a
    fixed 0..1 scale, and only the colorbar's tick labels change per figure: a change
    of the image's limits would rebuild the colorbar (7 ms)."""
    from matplotlib import colormaps, ticker

    colors = colormaps["viridis"].resampled(HEATMAP_LEVELS).with_extremes(under="#e8e8e8", over=COLORS["worst"])
    # "none": the cells embedded as they are (a 48 x 48 PNG), the page scales them pixelated
    image = heatmap.imshow(np.ones((2, 2)), aspect="auto", interpolation="none", cmap=colors, vmin=0.0, vmax=1.0)
    bar = canvas.figure.colorbar(image, ax=heatmap, pad=0.03)
    bar.minorlocator = ticker.NullLocator()
    for axis in (heatmap.xaxis, heatmap.yaxis):
        axis.set_major_locator(ticker.MaxNLocator(TICKS - 1, integer=True))
    _labels(heatmap, "last dimension", "leading dimensions")
    for axis in (bar.ax.xaxis, bar.ax.yaxis):
        axis.set_label_coords(0.5, 0.5)  # no labels: nothing to place
    canvas.heatmap, canvas.image, canvas.colorbar = heatmap, image, bar


def _log_ticks(axis: Axis, base: int = 10) -> None:
    """At most TICKS labelled powers of `base`, no minor ticks, plain-text labels
    (mathtext labels cost most of a figure's time)."""
    from matplotlib import ticker

    axis.set_major_locator(ticker.LogLocator(base=base, numticks=TICKS))
    axis.set_major_formatter(ticker.FuncFormatter(_power_of_ten if base == 10 else _power_of_two))
    axis.set_minor_locator(ticker.NullLocator())


def _power_of_ten(value: float, _position: int | None) -> str:
    """1e-05 -> 1e-5."""
    return f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")


def _power_of_two(value: float, _position: int | None) -> str:
    """0.25, 1, 64, 1024; 2^20 beyond."""
    exponent = round(np.log2(value)) if value > 0 else 0
    return f"{value:g}" if -6 <= exponent <= 10 else f"2^{exponent}"


def _labels(axes: Axes, x_label: str, y_label: str) -> None:
    """Axis labels at fixed places: placing them by their tick labels' extents costs
    6 ms a figure (set_label_coords turns that off)."""
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    axes.xaxis.set_label_coords(0.5, -0.15)
    axes.yaxis.set_label_coords(-0.22, 0.5)


def _draw_scatter(canvas: Canvas, data: PlotData) -> None:
    """Log-log: an exact element (error 0) sits on the floor below the smallest error
    shown, an element of bench 0 at the left edge."""
    x = np.concatenate([data.magnitude, data.worst_magnitude])
    y = np.concatenate([data.error, data.worst_error])
    if data.tolerance is not None:
        y = np.concatenate([y, data.tolerance[1]])
    x_low, x_high = _log_range(x)
    y_low, y_high = _log_range(y)
    canvas.points.set_offsets(np.column_stack([np.maximum(data.magnitude, x_low), np.maximum(data.error, y_low)]))
    canvas.worst.set_offsets(
        np.column_stack([np.maximum(data.worst_magnitude, x_low), np.maximum(data.worst_error, y_low)]).reshape(-1, 2)
    )
    visible = data.tolerance is not None
    canvas.tolerance.set_visible(visible)
    if data.tolerance is not None:  # visible
        canvas.tolerance.set_data(*data.tolerance)
    canvas.scatter.set_xlim(x_low, x_high)
    canvas.scatter.set_ylim(y_low, y_high)


def _log_range(values: Array) -> tuple[float, float]:
    positive = values[np.isfinite(values) & (values > 0)]
    if not positive.size:
        return 0.1, 10.0
    low, high = float(positive.min()), float(positive.max())
    return low / 3, max(high * 3, low * 10)


def _draw_histogram(canvas: Canvas, data: PlotData) -> None:
    canvas.bars.set_data(data.ulp_counts, data.ulp_edges)
    canvas.histogram.set_xlim(float(data.ulp_edges[0]), float(data.ulp_edges[-1]))
    canvas.histogram.set_ylim(0, max(1, int(data.ulp_counts.max())) * 1.08)
    canvas.ulp_limit.set_visible(data.ulp_limit is not None)
    if data.ulp_limit is not None:
        canvas.ulp_limit.set_xdata([data.ulp_limit, data.ulp_limit])


def _draw_heatmap(canvas: Canvas, data: PlotData) -> None:
    """Cells on decades from the smallest positive to the largest finite error (at most
    six decades): 0 is "under" (grey), inf "over" (red)."""
    grid, image, colorbar, heatmap = data.grid, canvas.image, canvas.colorbar, canvas.heatmap
    # render draws a heatmap only for a grid, on a canvas made with one (_heatmap_axes)
    assert grid is not None and image is not None and colorbar is not None and heatmap is not None
    finite = grid[np.isfinite(grid)]
    positive = finite[finite > 0]
    high = math.ceil(math.log10(positive.max())) if positive.size else 1
    low = max(math.floor(math.log10(positive.min())) if positive.size else high - 1, high - 6)
    low = min(low, high - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        shown = (np.log10(np.maximum(grid, 10.0**low)) - low) / (high - low)
    shown = np.where(grid > 0, shown, -1.0)
    image.set_data(np.where(np.isinf(grid), 2.0, shown))
    image.set_extent((0, data.cols, data.rows, 0))
    step = math.ceil((high - low) / (TICKS - 1))
    decades = list(range(high, low - 1, -step))[::-1]
    colorbar.set_ticks(
        [(decade - low) / (high - low) for decade in decades],
        labels=[_power_of_ten(10.0**decade, None) for decade in decades],
    )
    heatmap.set_xlim(0, data.cols)
    heatmap.set_ylim(data.rows, 0)
