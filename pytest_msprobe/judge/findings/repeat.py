"""Run the device again on the same inputs and compare its outputs bit for bit
(--msprobe-repeat, a script's --repeat).

A deterministic kernel gives the same bits every run. One that does not usually sums
in an order that varies between runs: atomic adds into an output (split-K matrix
products, scatter/index_add, the weight gradient of an embedding or a convolution)
land in whatever order the hardware threads finish, and floating-point addition is
not associative. Such a kernel can pass every accuracy standard and still make a
training run irreproducible, so the comparison is of raw bits, not of values:
NaNs with the same payload are equal, -0.0 and +0.0 differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pytest_msprobe.judge.findings.finding import Finding
from pytest_msprobe.judge.verdict.written_rows import Written, cut
from pytest_msprobe.run.replay import DeviceFailed, Results, Run, step_for
from pytest_msprobe.standards.pairing import Leaf, Mismatch, pair_leaves

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Side
    from pytest_msprobe.standards.dtypes import Array

# element size (bytes) -> the signed integer dtype its bits are viewed as
BIT_VIEWS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class DeviceRun:
    """The device's side of a call, as it is run again: its run, and what running the
    call means (its direction and framework: run/replay.py step_for)."""

    device: Side
    direction: str
    framework: str


def repeat_findings(run: DeviceRun, results: Results, runs: int, where: Written | None = None) -> list[Finding]:
    """--msprobe-repeat: run the device runs - 1 more times on the call's inputs and
    report every output whose bits differ from the first run's (`results`, whose verdict
    stands). `where`: the rows the kernel writes (judge/verdict/written_rows.py); leftover memory past
    them may differ from run to run, so the reruns are cut as the first run was. A device
    whose result shows the others a random draw (a dropout's mask: run/dropout.py)
    draws anew on every run: its bits differ by design, and it is not rerun."""
    device = run.device
    if runs <= 1 or (isinstance(device, Run) and device.api.reveal is not None):
        return []
    again = rerun(step_for(run.direction, results.inputs, run.framework), device, runs)
    if where is not None:
        again = [cut(value, where) for value in again]
    return bit_differences(results.device, again, runs)


def rerun(step: Callable[[Side], Nested], device: Side, runs: int) -> list[Nested]:
    """The device's outputs of runs 2..runs (the first is the replay's). The device
    raising now, after it ran once, is the call's error."""
    outputs = []
    for _ in range(runs - 1):
        try:
            outputs.append(step(device))
        except Exception as exc:
            raise DeviceFailed(exc) from exc
    return outputs


def bit_differences(first: Nested, others: list[Nested], runs: int) -> list[Finding]:
    """Every output of `first` whose bits differ in any of `others` (runs in all), in
    flatten order."""
    paired = [{leaf.path: leaf for leaf in pair_leaves(first, other)} for other in others]
    found = []
    for leaf in pair_leaves(first, first):
        if isinstance(leaf, Leaf):
            difference = _leaf_difference(leaf, [run.get(leaf.path) for run in paired], runs)
            if difference is not None:
                found.append(difference)
    return found


def _leaf_difference(first: Leaf, agains: list[Leaf | Mismatch | None], runs: int) -> Finding | None:
    base = _tensor(first.device)
    changed = torch.zeros(base.shape, dtype=torch.bool)
    largest: tuple[float, ...] = (0.0, 0.0)
    example = ""
    for again in agains:
        other = _tensor(again.device) if isinstance(again, Leaf) else None
        if other is None or other.dtype != base.dtype:
            how = (
                f"{again.reason} (the first run is 'bench', another 'device')"
                if isinstance(again, Mismatch)
                else f"{first.device_dtype} in the first run, {again and again.device_dtype} in another"
            )
            return _Changed(runs, base.numel(), math.nan, math.nan).finding(
                first.path, f"the output changed between {runs} runs of the device on the same inputs: {how}"
            )
        differs = _bits(base) != _bits(other)
        if not bool(differs.any()):
            continue
        if not example:
            index = tuple(int(i) for i in np.unravel_index(int(differs.flatten().nonzero()[0]), tuple(base.shape)))
            example = f"at {list(index)}: {base[index].item()!r} then {other[index].item()!r}"
        changed |= differs
        largest = tuple(map(max, largest, _largest_change(base, other, differs)))
    if not example:
        return None
    max_abs, max_ulp = largest
    # the dtype its bits were compared in: complex values as float64 pairs (pair_leaves)
    compared = str(base.dtype).removeprefix("torch.")
    size = (
        f"max |difference| {max_abs:.3g}, max {max_ulp:.0f} ULP of {compared}"
        if max_abs > 0
        else "no finite value changed: signs of zero, infinities or NaN payloads did"
    )
    differing = int(changed.sum())
    text = (
        f"{differing} of {base.numel()} elements differ bitwise between {runs} runs of the device on the same inputs "
        f"({size}; first {example}). Nondeterministic kernels are the usual cause: atomic adds that sum in a "
        "different order each run (split-K matrix products, scatter/index_add, weight gradients); the accuracy "
        "verdict is the first run's"
    )
    return _Changed(runs, differing, max_abs, max_ulp).finding(first.path, text)


@dataclass(frozen=True)
class _Changed:
    """How an output changed between the runs: the columns of its finding in the
    metrics file (NaN where the output changed dtype or structure)."""

    runs: int
    elements: int  # the elements that differ
    max_abs: float
    max_ulp: float

    def finding(self, path: str, text: str) -> Finding:
        columns = {
            "repeat_runs": self.runs,
            "nondeterministic_elements": self.elements,
            "nondeterministic_max_abs_diff": self.max_abs,
            "nondeterministic_max_ulp_diff": self.max_ulp,
        }
        return Finding("nondeterministic", path, True, text, columns)


def _tensor(value: Array | torch.Tensor) -> torch.Tensor:
    """A leaf as pair_leaves gives it (a torch tensor, or numpy for integer, bool and
    complex values), as a torch tensor with the same bits."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bits of a floating tensor as integers (so NaN == NaN with the same
    payload, -0.0 != +0.0); integer and bool tensors are their bits already."""
    if not tensor.is_floating_point():
        return tensor
    return tensor.contiguous().view(BIT_VIEWS[tensor.element_size()])


def _largest_change(first: torch.Tensor, again: torch.Tensor, differs: torch.Tensor) -> tuple[float, float]:
    """(max |difference|, max difference in ULPs) over the differing elements that are
    finite in both runs."""
    a, b = first[differs], again[differs]
    if not first.is_floating_point():
        units = float((a.double() - b.double()).abs().max())
        return units, units
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool(finite.any()):
        return 0.0, 0.0
    a, b = a[finite], b[finite]
    steps = (_to_ordinals(a) - _to_ordinals(b)).abs().double()
    return float((a.double() - b.double()).abs().max()), float(steps.max())


def _to_ordinals(values: torch.Tensor) -> torch.Tensor:
    """Each float's position among the dtype's representable values (as int64): the
    bit pattern of a negative float counts down from zero, so neighbours differ by 1
    across zero too and -0.0 and +0.0 are both 0."""
    bits = _bits(values).long()
    lowest = -(2 ** (8 * values.element_size() - 1))
    return torch.where(bits < 0, lowest - bits, bits)
