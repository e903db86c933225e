"""Offline, a device may have run a call in any memory layout: the reference covers them.

A dump records values, not strides (msprobe saves every tensor contiguous), so it cannot
say whether the device ran a convolution, a norm or a gelu on a contiguous or a
channels_last tensor; and torch's CPU kernels for the two layouts are different kernels
(oneDNN's or ATen's channels_last paths sum in another order, or compute erf another way),
rounding differently. The offline reference (the CPU in the dump's dtype) runs the
contiguous kernel: measured here, a correct float32 gelu written channels_last was
"-0.485 ULP beyond the reference run, sign-test z 57" under ATEN_CPU_CAPABILITY=default
(studies/layout_kernels.py, studies/channels-last-kernels.md).

So for the `[layouts]` APIs (run/api_tables/pytorch.toml) on a 4-D or 5-D floating
input, a call judged error against the contiguous reference run is judged again against
the same reference run with every tensor (inputs and incoming gradients) laid out in
each other layout of LAYOUTS, each a complete alternative: the call's verdict is the
least severe of them. A device ran one layout for the whole call, so one reference run
must account for all of the device's statistics at once; the metrics of different
layouts are never mixed (a kernel beyond the contiguous run's bias and beyond the
channels_last run's error ratio is an error). The other layouts run only for a call
judged error, so a call that passes costs nothing more. A recovered gradient that
autograd summed over several calls (judge/offline/dumped_run.py's Shared) is judged against the
contiguous reference only: the other calls' layouts are unknown too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pytest_msprobe.run.apis import Api, layout_sensitive_apis
from pytest_msprobe.run.replay import Inputs, Run, evaluate, tree_map

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested

#: the layouts besides contiguous a device may run: tensor rank -> memory format
LAYOUTS: dict[str, dict[int, torch.memory_format]] = {
    "channels_last": {4: torch.channels_last, 5: torch.channels_last_3d}
}


def other_layouts(api: Api, tensors: Iterable[torch.Tensor]) -> list[str]:
    """The layouts besides contiguous in which this call's kernel may round otherwise:
    for a [layouts] API with a floating input (`tensors`) of a rank the layout lays out."""
    if api.name.split(".", 1)[-1] not in layout_sensitive_apis():
        return []
    ranks = {tensor.dim() for tensor in tensors if tensor.is_floating_point()}
    return [layout for layout, formats in LAYOUTS.items() if ranks & formats.keys()]


@dataclass
class LayoutReferences:
    """The reference run in the other layouts, run when first asked."""

    reference: Run
    inputs: Inputs
    direction: str
    framework: str
    layouts: list[str]
    _outputs: dict[str, Nested] | None = field(default=None, repr=False)

    def outputs(self, like: Nested) -> dict[str, Nested]:
        """layout -> the reference's outputs in it, left out (None) wherever `like` (the
        contiguous reference, as aligned with the dump) is; a layout whose run fails is
        not among them."""
        if self._outputs is None:
            self._outputs = {}
            for layout in self.layouts:
                placement = dataclasses.replace(self.reference.placement, formats=LAYOUTS[layout])
                output = evaluate(
                    dataclasses.replace(self.reference, placement=placement),
                    self.direction,
                    self.inputs,
                    self.framework,
                )
                if output is not None:
                    self._outputs[layout] = tree_map(_contiguous, output)
        return {layout: _aligned_like(output, like) for layout, output in self._outputs.items()}


def _contiguous(value: Nested) -> Nested:
    return value.contiguous() if isinstance(value, torch.Tensor) else value


def _aligned_like(value: Nested, like: Nested) -> Nested:
    if isinstance(value, tuple) and isinstance(like, tuple) and len(value) == len(like):
        return tuple(None if other is None else item for item, other in zip(value, like, strict=True))
    return value
