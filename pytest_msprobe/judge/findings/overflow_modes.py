"""The device's float overflow mode, read from its outputs: where the bench overflows the
output's dtype (or gives NaN), a device in CANN's saturation mode gives the largest
finite value of the dtype (and 0 for NaN), one in INF/NaN mode (IEEE 754, as every CPU
and GPU) gives +-inf (and NaN). Ascend devices run one or the other by a setting of the
device: the Atlas training series only saturates, Atlas A2/A3 default to INF/NaN and
may be switched (INF_NAN_MODE_ENABLE=0, aclrtSetDeviceSatMode); the sources are cited in
docs/explanation/accuracy-model.md.

Either is a behaviour of the device, not an accuracy error of the kernel: each output
that shows one gets a finding of that mode (judge/findings/finding.py: named in the message,
its columns in the metrics file, counted apart in the summary and the HTML report), and
its saturated elements are judged by the standards as the bench's +-inf/NaN they stand
for (`for_judgement`), like inf/NaN elements that agree, so the rest of the output is
judged as before. Where the user states the mode (--msprobe-overflow-mode) or torch_npu
tells it, an output that shows the other mode is an error.

An element saturates where the bench rounded to D overflows and the device holds D's
largest finite value of the same sign; where the bench overflows by less than
BORDERLINE_ULPS ULPs of D past that value, a correct IEEE kernel whose result lies a
rounding lower gives it too, so such elements are not held against a stated INF/NaN
mode. The reverse, a device that gives inf where the bench reaches D's largest finite
value without overflowing it, shows the INF/NaN mode too. Only outputs whose inputs are
all finite are read (an inf in the inputs, a mask's -inf, is the inputs' own). Cost: one
min/max reduction of each floating bench output; the elementwise work is done only where
the bench's extremes reach D's largest finite value or are NaN.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.judge.findings.finding import Finding
from pytest_msprobe.judge.findings.overflow import finite_inputs
from pytest_msprobe.standards.pairing import Leaf, pair_leaves

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Results

#: the modes --msprobe-overflow-mode states ("auto": read from torch_npu where it runs the
#: device, else unknown)
MODES = ("auto", "saturation", "inf-nan")
SATURATION, INF_NAN = "saturation", "inf-nan"
#: how far past D's largest finite value (in ULPs of D there) the bench must lie for a
#: device's largest finite value to be saturation rather than a correct kernel's rounding
BORDERLINE_ULPS = 2
#: bench dtypes whose extremes are read through numpy (`_may_show`)
NUMPY_FLOATS = (torch.float32, torch.float64)
#: the finding kinds, by the mode whose behaviour they show
KINDS = {SATURATION: "saturation mode", INF_NAN: "inf/nan mode"}
#: what each mode gives where the bench overflows (and where it gives NaN), for messages
GIVES = {SATURATION: ("+-max finite", "0"), INF_NAN: ("+-inf", "NaN")}


@dataclass(frozen=True)
class StatedMode:
    """The device's overflow mode where known ("" unknown) and who said so."""

    mode: str = ""
    source: str = ""


UNKNOWN = StatedMode()


def stated_mode(option: str, backend: str, offline: bool) -> StatedMode:
    """--msprobe-overflow-mode as stated, or on auto what torch_npu reads from the NPU
    under test (never offline: the dump's device is not this one); else unknown."""
    if option in (SATURATION, INF_NAN):
        return StatedMode(option, f"--msprobe-overflow-mode={option}")
    if backend != "npu" or offline:
        return UNKNOWN
    try:
        import torch_npu

        inf_nan = bool(torch_npu.npu.utils.is_support_inf_nan())
    except Exception:  # noqa: BLE001 - a torch_npu without it, or a device that cannot say: unknown
        return UNKNOWN
    return StatedMode(INF_NAN if inf_nan else SATURATION, "torch_npu.npu.utils.is_support_inf_nan()")


@dataclass(frozen=True)
class Shown:
    """One output's elements that show an overflow mode, as boolean masks of its shape."""

    path: str
    dtype: torch.dtype
    saturated: torch.Tensor  # the bench overflows D, the device gives D's largest finite value
    zeroed: torch.Tensor  # the bench gives NaN, the device 0
    clear: torch.Tensor  # saturated, with the bench past the borderline
    to_inf: torch.Tensor  # the bench at or past D's largest finite value, the device gives inf
    to_nan: torch.Tensor  # both give NaN

    def count(self, mode: str) -> tuple[int, int]:
        """(overflowed, NaN) elements that show `mode`."""
        over, nan = (self.saturated, self.zeroed) if mode == SATURATION else (self.to_inf, self.to_nan)
        return int(over.sum()), int(nan.sum())


def shown_modes(results: Results) -> list[Shown]:
    """Every output (of the results' flatten order) with elements that show a mode."""
    leaves = [leaf for leaf in pair_leaves(results.bench, results.device) if isinstance(leaf, Leaf)]
    suspects = [leaf for leaf in leaves if _may_show(leaf)]
    if not suspects or not finite_inputs(results.inputs):
        return []
    found = [_shown(leaf) for leaf in suspects]
    return [shown for shown in found if any(shown.count(SATURATION) + shown.count(INF_NAN))]


def _may_show(leaf: Leaf) -> bool:
    """The bench's extremes reach D's largest finite value or are NaN: one reduction, no
    copy."""
    bench, device = leaf.bench, leaf.device
    if not isinstance(bench, torch.Tensor) or not isinstance(device, torch.Tensor) or not device.is_floating_point():
        return False
    if not bench.is_floating_point() or bench.numel() == 0:
        return False
    # numpy's min and max (NaN propagates): a few times faster than torch's aminmax on the CPU
    values = bench.numpy() if bench.dtype in NUMPY_FLOATS else bench
    extreme = max(abs(float(values.min())), abs(float(values.max())))
    return not extreme < torch.finfo(device.dtype).max  # NaN too


def _shown(leaf: Leaf) -> Shown:
    bench, device = leaf.bench, leaf.device
    assert isinstance(bench, torch.Tensor) and isinstance(device, torch.Tensor)  # _may_show
    dtype = device.dtype
    b, d = bench.to(torch.float64), device.to(torch.float64)
    largest = torch.finfo(dtype).max
    over = torch.isinf(bench.to(dtype))  # the bench rounded to D overflows (or is inf itself)
    same_sign = torch.sign(d) == torch.sign(b)
    saturated = over & (d.abs() == largest) & same_sign
    top_ulp = largest * torch.finfo(dtype).eps / (2 - torch.finfo(dtype).eps)  # the ULP of D at its largest value
    nan_bench = torch.isnan(b)
    return Shown(
        path=leaf.path,
        dtype=dtype,
        saturated=saturated,
        zeroed=nan_bench & (d == 0),
        clear=saturated & (b.abs() > largest + BORDERLINE_ULPS * top_ulp),
        to_inf=(b.abs() >= largest) & torch.isinf(d) & same_sign,
        to_nan=nan_bench & torch.isnan(d),
    )


def mode_findings(shown: list[Shown], stated: StatedMode) -> list[Finding]:
    """A finding per output and mode it shows: an error where it contradicts the stated
    mode, else a note."""
    return [_finding(item, mode, stated) for item in shown for mode in (SATURATION, INF_NAN) if any(item.count(mode))]


def _finding(shown: Shown, mode: str, stated: StatedMode) -> Finding:
    over, nan = shown.count(mode)
    name = str(shown.dtype).removeprefix("torch.")
    largest = torch.finfo(shown.dtype).max
    gives_over, gives_nan = GIVES[mode]
    parts = [f"{over} elements where the bench overflows {name} give {gives_over}"] if over else []
    parts += [f"{nan} elements where the bench gives NaN give {gives_nan}"] if nan else []
    text = ", ".join(parts)
    if mode == SATURATION:
        text += (
            f" ({name}'s largest finite value {largest:.5g}): the device saturates (CANN's saturation mode), "
            "an overflow of the inputs' range, not an accuracy error of the kernel"
        )
    else:
        text += ": the device follows IEEE 754 (CANN's INF/NaN mode)"
    contradicted = _contradiction(shown, mode, stated)
    if contradicted:
        other = KINDS[stated.mode].removesuffix(" mode")
        text += (
            f"; this contradicts the device's stated {other} mode ({stated.source}), which gives "
            f"{' and '.join(GIVES[stated.mode])} there: {contradicted}"
        )
    elif mode == SATURATION:
        text += "; judged as the bench's +-inf/NaN, like inf/NaN elements that agree"
    columns: dict[str, Json] = {
        "overflow_mode": mode,
        "overflow_mode_elements": over,
        "overflow_mode_nan_elements": nan,
    }
    if stated.mode:
        columns.update(overflow_mode_stated=stated.mode, overflow_mode_contradicts=bool(contradicted))
    return Finding(KINDS[mode], shown.path, bool(contradicted), text, columns)


def _contradiction(shown: Shown, mode: str, stated: StatedMode) -> str:
    """What contradicts the stated mode ("" nothing): a device stated INF/NaN that
    saturates past the borderline or gives 0 for NaN, one stated saturating that gives
    inf or NaN."""
    if not stated.mode or stated.mode == mode:
        return ""
    if mode == SATURATION:
        clear, zeroed = int(shown.clear.sum()), int(shown.zeroed.sum())
        if not clear and not zeroed:
            return ""
        return f"{clear + zeroed} elements (saturated beyond {BORDERLINE_ULPS} ULPs past the largest finite value, or NaN given as 0)"
    return f"{sum(shown.count(INF_NAN))} elements"


def for_judgement(results: Results, shown: list[Shown], stated: StatedMode) -> Results:
    """The results the standards judge: each saturated element (and NaN given as 0)
    as the bench's +-inf (NaN), unless the device is stated to be in INF/NaN mode (its
    saturation is then an error, and its values are judged as they are)."""
    if stated.mode == INF_NAN or not any(item.count(SATURATION) != (0, 0) for item in shown):
        return results
    restored = {item.path: item for item in shown if item.count(SATURATION) != (0, 0)}
    return dataclasses.replace(results, device=_restore_leaves(results.device, "", restored))


def _restore_leaves(value: Nested, path: str, restored: dict[str, Shown]) -> Nested:
    """`value` with the leaves at the restored paths (pairing's paths) given their IEEE
    values."""
    if path in restored and isinstance(value, torch.Tensor):
        shown = restored[path]
        ieee = value.detach().clone()
        on_cpu = ieee.cpu() if ieee.device.type != "cpu" else ieee
        on_cpu[shown.saturated] = torch.copysign(torch.tensor(math.inf, dtype=ieee.dtype), on_cpu[shown.saturated])
        on_cpu[shown.zeroed] = math.nan
        return on_cpu.to(value.device)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        items = [_restore_leaves(item, f"{path}[{i}]", restored) for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {key: _restore_leaves(item, f"{path}[{key!r}]", restored) for key, item in value.items()}
    return value
