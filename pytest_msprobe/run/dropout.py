"""Dropout judged through the randomness the dump reveals.

A dropout's output is the input times a random mask over 1 - p: the dump does not
record the random state, but the device's result shows which elements (channels, for
dropout1d/2d/3d) it kept: the nonzero ones. So the device runs the call as it is (its
output is the dumped one offline, its own run single-run) and the bench and the
reference are told its mask (`reveal`): they compute input * kept / (1 - p), and the
standards judge the kept elements' scaling; a dropped element is 0 on every side. A
backward reads the mask from the device's input gradient (g * kept / (1 - p)) likewise:
offline the dumped gradient, which msprobe took from the same forward's mask. An element
whose input (forward) or incoming gradient (backward) is 0 shows no mask: it is 0 both
ways and left out of the dropped share.

torch's CPU kernel rounds the scale 1 / (1 - p) to the input's dtype before it
multiplies (its noise tensor is mask / (1 - p) in D); a kernel may as well multiply by
the exact scale. The bench takes whichever of the two is closer to the device's kept
elements (a shared rounding of up to half an ULP of D, which the bias tests would
otherwise call a bias), never any other: a kernel that scales by 1 / p, or by anything
else, is judged against 1 / (1 - p).

The dropped share itself is judged against p by a binomial bound (`dropped_share`): of
n units (elements, or channels) with a visible mask, the number dropped is
Binomial(n, p); |z| > Z_LIMIT (5: a correct kernel fails one call in 1.7 million) is an
error. p = 0, p = 1 and training=False are deterministic and replayed as they are.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Value


class Arguments(Protocol):
    """What this module reads of a call's decoded inputs (run/replay.py's Inputs, which
    imports the API tables that name this module: a protocol keeps the import graph acyclic)."""

    args: list[Value]
    kwargs: dict[str, Value]
    grads: list[Value] | None


CallInputs = TypeVar("CallInputs", bound=Arguments)


class Reveal(Protocol):
    """What the device's result shows the other sides (run/apis.py's Api.reveal)."""

    def __call__(self, inputs: CallInputs, device: Value, direction: str) -> CallInputs: ...


#: |z| of the dropped count against Binomial(n, p) beyond which the share is an error
Z_LIMIT = 5.0


def _argument(args: list[Value], kwargs: dict[str, Value], position: int, names: tuple[str, ...], default: Value) -> Value:
    if len(args) > position:
        return args[position]
    return next((kwargs[name] for name in names if name in kwargs), default)


def drop_rate(args: list[Value], kwargs: dict[str, Value]) -> float | None:
    """p where the call draws a mask (training, 0 < p < 1); None where it is deterministic.
    F.dropout(input, p, training, inplace) and torch.dropout(input, p, train) alike."""
    p = _argument(args, kwargs, 1, ("p",), 0.5)
    training = _argument(args, kwargs, 2, ("training", "train"), True)
    if not isinstance(p, (int, float)) or not training or not 0 < p < 1:
        return None
    return float(p)


def masked(function: Callable[..., Value]) -> Callable[..., Value]:
    """The dropout with the device's mask (keyword `kept`) and scale (`scale`): input *
    kept * scale, the mask and scale as one factor as torch's kernel multiplies; the
    call itself where it draws nothing. Without a mask (the device failed before it
    showed one) every element is kept, only to show that the bench can run."""

    def run(*args: Value, kept: torch.Tensor | None = None, scale: float | None = None, **kwargs: Value) -> Value:
        p = drop_rate(list(args), kwargs)
        if p is None:
            return function(*args, **kwargs)
        x = args[0] if args else kwargs["input"]
        assert isinstance(x, torch.Tensor)  # dropout takes a tensor input
        keep = torch.ones_like(x, dtype=torch.bool) if kept is None else kept
        return x * (keep.to(x.dtype) * (1 / (1 - p) if scale is None else scale))

    return run


def _scales(p: float, dtype: torch.dtype) -> tuple[float, float]:
    """The exact 1 / (1 - p), and that scale rounded to D (torch's CPU kernel)."""
    exact = 1 / (1 - p)
    return exact, float(torch.tensor(exact, dtype=torch.float64).to(dtype))


def _closest_scale(p: float, source: torch.Tensor, result: torch.Tensor, kept: torch.Tensor) -> float:
    """Of the two correct scales, the one nearer the device's kept elements."""
    wide_source, wide_result = source.double()[kept], result.double()[kept]
    return min(_scales(p, result.dtype), key=lambda scale: float((wide_result - wide_source * scale).abs().sum()))


@dataclass(frozen=True)
class Revealed:
    """What the device's result shows of a dropout call's draw."""

    p: float
    source: torch.Tensor  # the input (forward) or the incoming gradient (backward)
    result: torch.Tensor  # the device's output or input gradient


def revealed(inputs: Arguments, device: Value, direction: str) -> Revealed | None:
    """The masked tensors of a dropout call whose device result is at hand, else None."""
    p = drop_rate(inputs.args, inputs.kwargs)
    if p is None:
        return None
    if direction == "forward":
        source, result = (inputs.args[0] if inputs.args else inputs.kwargs.get("input")), device
    else:
        source = (inputs.grads or [None])[0]
        result = device[0] if isinstance(device, tuple) and device else None
    if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor) or source.shape != result.shape:
        return None
    return Revealed(p, source, result)


def reveal(inputs: CallInputs, device: Value, direction: str) -> CallInputs:
    """The inputs with the device's mask and scale for the bench and the reference."""
    shown = revealed(inputs, device, direction)
    if shown is None:
        return inputs
    kept = shown.result != 0
    scale = _closest_scale(shown.p, shown.source, shown.result, kept & (shown.source != 0))
    told = copy.copy(inputs)
    told.kwargs = {**inputs.kwargs, "kept": kept, "scale": scale}
    return told


def dropped_share(shown: Revealed, unit_dims: int) -> tuple[int, int, float]:
    """(dropped units, units with a visible mask, z of the dropped count against
    Binomial(n, p)). A unit is an element, or a channel: the trailing `unit_dims`
    dimensions together (dropout2d's H and W)."""
    visible, kept = shown.source != 0, shown.result != 0
    if unit_dims:
        visible, kept = (tensor.flatten(-unit_dims).any(-1) if tensor.dim() > unit_dims else tensor.any() for tensor in (visible, kept))
    n = int(visible.sum())
    dropped = int((visible & ~kept).sum())
    spread = math.sqrt(n * shown.p * (1 - shown.p))
    return dropped, n, (dropped - n * shown.p) / spread if spread else 0.0
