"""Elements of a judged output, kept for the HTML report's plots (--msprobe-html).

A record holds metrics, not tensors, yet the report's plots need elements: each error
against the magnitude of its bench value, the errors in ULPs, where in the tensor they
sit. So where the test runs, and only when a report is asked for, every output whose
verdict has one of the asked statuses gets a small dict in the record's `samples`
(judge/verdict/record.py's ElementSample):

    output   the output's position among the record's outputs
    flat     flat indices of SAMPLE_SIZE elements (every element of a smaller output),
             drawn by a generator seeded with the output's size: the same elements in
             every run, on every worker
    bench, device   their values (float64; a device value converts exactly)
    worst    the elements the standard named worst, [index, device, bench]
    rms      the RMS of the finite bench values: the scale the single-run rules use
    heatmap  2-D and larger outputs: the largest error (in ULPs of the device dtype at
             max(|b|, rms)) in each cell of a grid of at most HEATMAP_CELLS cells a side,
             rows over all leading dimensions and columns over the last, read from every
             element (not the sample: one wrong row must show)

At most a few thousand numbers per output, never the tensor. The heatmap reads the
output once, CHUNK elements at a time, so its memory stays bounded. Integer and bool
outputs keep only `worst`: their standard counts differing elements, nothing to plot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import torch

    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.judge.verdict.record import ElementSample, Heatmap, WorstElement
    from pytest_msprobe.standards import Verdict
    from pytest_msprobe.standards.dtypes import Array, DtypeInfo
    from pytest_msprobe.standards.pairing import Leaf
    from pytest_msprobe.standards.verdict import Status

#: a leaf's values, flat: torch or numpy, in their own dtype (read a chunk at a time)
Flat: TypeAlias = "torch.Tensor | Array"

SAMPLE_SIZE = 1024
HEATMAP_CELLS = 48
CHUNK = 1 << 20  # elements converted to float64 at a time


def element_samples(bench: Nested, device: Nested, verdict: Verdict, statuses: Iterable[Status]) -> list[ElementSample]:
    """A sample of each output whose verdict's status is in `statuses`, in the order of
    the verdict's outputs (the standards pair the leaves in this same order)."""
    from pytest_msprobe.standards.pairing import Leaf, pair_leaves

    wanted = frozenset(statuses)
    leaves = verdict.outputs or (verdict,)
    return [
        output_sample(position, item, leaf)
        for position, (item, leaf) in enumerate(zip(pair_leaves(bench, device), leaves, strict=False))
        if leaf.status in wanted and isinstance(item, Leaf)
    ]


def output_sample(position: int, leaf: Leaf, verdict: Verdict) -> ElementSample:
    """The sample of one paired leaf (standards.pairing.Leaf), the output at `position`,
    judged by `verdict`."""
    from pytest_msprobe.standards.dtypes import dtype_info, is_float_name

    worst: list[WorstElement] = [(list(offender.index), offender.device, offender.bench) for offender in verdict.worst]
    if not is_float_name(leaf.device_dtype):
        return {"output": position, "worst": worst}
    shape = tuple(leaf.device.shape)
    size = math.prod(shape)
    bench, device = _flat(leaf.bench), _flat(leaf.device)
    chosen = sample_indices(size)
    rms = _rms(bench, size)
    sample: ElementSample = {
        "output": position,
        "flat": chosen.tolist(),
        "bench": _gather(bench, chosen).tolist(),
        "device": _gather(device, chosen).tolist(),
        "worst": worst,
        "rms": rms,
    }
    if len(shape) >= 2 and size:
        sample["heatmap"] = heatmap(bench, device, shape, dtype_info(leaf.device_dtype), rms)
    return sample


def sample_indices(size: int) -> Array:
    """SAMPLE_SIZE sorted flat indices (all of them below that), the same for a size in
    every run: the generator is seeded with the size."""
    if size <= SAMPLE_SIZE:
        return np.arange(size, dtype=np.int64)
    return np.sort(np.random.default_rng(size).choice(size, SAMPLE_SIZE, replace=False))


def scaled_errors(bench: Array, device: Array, info: DtypeInfo, rms: float) -> Array:
    """|d - b| in ULPs of D at max(|b|, rms) (the single-run rule's scale); an inf/NaN
    that the bench rounded to D shares is no error, any other is infinite."""
    from pytest_msprobe.standards.metrics import round_to_dtype, ulp_of

    with np.errstate(all="ignore"):
        errors: Array = np.abs(device - bench) / ulp_of(np.maximum(np.abs(bench), rms), info)
    odd = ~np.isfinite(errors)
    if odd.any():
        rounded, values = round_to_dtype(bench[odd], info), device[odd]
        agree = (values == rounded) | (np.isnan(values) & np.isnan(rounded))
        errors[odd] = np.where(agree, 0.0, np.inf)
    return errors


def heatmap(bench: Flat, device: Flat, shape: tuple[int, ...], info: DtypeInfo, rms: float) -> Heatmap:
    """The largest scaled error in each cell of a grid over (rows, last dimension)."""
    cols = shape[-1]
    rows = math.prod(shape) // cols
    row_cells, col_cells = min(rows, HEATMAP_CELLS), min(cols, HEATMAP_CELLS)
    row_edges = np.arange(row_cells + 1) * rows // row_cells
    col_starts = np.arange(col_cells) * cols // col_cells
    grid = np.zeros((row_cells, col_cells))
    for cell_row in range(row_cells):
        begin, end = int(row_edges[cell_row]) * cols, int(row_edges[cell_row + 1]) * cols
        for start in range(begin, end, CHUNK):
            stop = min(end, start + CHUNK)
            errors = scaled_errors(_chunk(bench, start, stop), _chunk(device, start, stop), info, rms)
            _fold(grid[cell_row], errors, start % cols, cols, col_starts)
    return {"rows": rows, "cols": cols, "grid": [[float(f"{value:.3g}") for value in line] for line in grid]}


def _fold(cells: Array, errors: Array, column: int, cols: int, col_starts: Array) -> None:
    """Fold consecutive elements starting at `column` of a row into the cells' maxima:
    a partial first row, whole rows (their maximum per column), a partial last row."""
    head = min(errors.size, (cols - column) % cols)
    if head:
        _fold_row_piece(cells, errors[:head], column, col_starts)
    whole = (errors.size - head) // cols
    if whole:
        _fold_row_piece(cells, errors[head : head + whole * cols].reshape(whole, cols).max(axis=0), 0, col_starts)
    tail = errors[head + whole * cols :]
    if tail.size:
        _fold_row_piece(cells, tail, 0, col_starts)


def _fold_row_piece(cells: Array, values: Array, column: int, col_starts: Array) -> None:
    """values sit at columns column .. column + len - 1 of one row."""
    first = int(np.searchsorted(col_starts, column, side="right")) - 1
    last = int(np.searchsorted(col_starts, column + values.size - 1, side="right")) - 1
    cuts = np.concatenate(([column], col_starts[first + 1 : last + 1])) - column
    np.maximum(cells[first : last + 1], np.maximum.reduceat(values, cuts), out=cells[first : last + 1])


def _flat(values: Array | torch.Tensor) -> Flat:
    """A flat view (torch or numpy, own dtype) of a leaf's values."""
    return values.detach().reshape(-1) if hasattr(values, "detach") else np.asarray(values).reshape(-1)


def _chunk(flat: Flat, start: int, stop: int) -> Array:
    import torch

    part = flat[start:stop]
    return part.to(torch.float64).numpy() if isinstance(part, torch.Tensor) else np.asarray(part, dtype=np.float64)


def _gather(flat: Flat, indices: Array) -> Array:
    import torch

    if isinstance(flat, torch.Tensor):
        return flat[torch.from_numpy(indices)].to(torch.float64).numpy()
    return np.asarray(flat[indices], dtype=np.float64)


def _rms(flat: Flat, size: int) -> float:
    """RMS of the finite values, CHUNK at a time."""
    total, count = 0.0, 0
    for start in range(0, size, CHUNK):
        values = _chunk(flat, start, min(size, start + CHUNK))
        finite = values[np.isfinite(values)]
        with np.errstate(over="ignore"):
            total += float(np.dot(finite, finite))
        count += finite.size
    return math.sqrt(total / count) if count else 0.0
