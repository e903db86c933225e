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

SELU's alpha dropouts (alpha_dropout, feature_alpha_dropout: the [dropout] table's
`alpha`) keep SELU's mean and variance: a kept element is a x + b and a dropped one the
constant a alpha' + b, with alpha' = -SELU_ALPHA (SELU's -lambda alpha), a = 1 / sqrt((p
alpha'^2 + 1)(1 - p)) and b = -a alpha' p (torch's Dropout.cpp). Their mask is shown by
the elements at that constant (within an ULP of D); an element whose kept value a x + b
lies within two ULPs of it shows none. Their backward is g * a on the kept elements,
0 on the others, as a dropout's with the scale a.

torch's CPU kernel rounds its constants to the input's dtype D before it uses them (its
noise tensor is mask / (1 - p), or mask * a, in D; b is computed in D); a kernel may as
well use the exact constants. The bench takes whichever of the two sets is closer to the
device's result (a shared rounding of up to half an ULP of D, which the bias tests would
otherwise call a bias), never any other: a kernel that scales by 1 / p, or by anything
else, is judged against the exact constants.

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

from pytest_msprobe.dump.values import Carried

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested


class Arguments(Protocol):
    """What this module reads of a call's decoded inputs (run/replay.py's Inputs, which
    imports the API tables that name this module: a protocol keeps the import graph acyclic)."""

    args: list[Nested]
    kwargs: dict[str, Nested]
    grads: list[Nested] | None


CallInputs = TypeVar("CallInputs", bound=Arguments)


class Kind(Protocol):
    """What this module reads of a dropout API's [dropout] row (run/apis.py's DropoutKind:
    that module imports this one, a protocol keeps the import graph acyclic)."""

    @property
    def alpha(self) -> bool: ...

    @property
    def training_default(self) -> bool: ...


class Reveal(Protocol):
    """What the device's result shows the other sides (run/apis.py's Api.reveal)."""

    def __call__(self, inputs: CallInputs, device: Nested, direction: str) -> CallInputs: ...


#: |z| of the dropped count against Binomial(n, p) beyond which the share is an error
Z_LIMIT = 5.0

#: SELU's lambda * alpha (torch's Dropout.cpp): an alpha dropout's alpha' is its negative
SELU_ALPHA = 1.7580993408473766


def _argument(
    args: list[Nested], kwargs: dict[str, Nested], position: int, names: tuple[str, ...], default: Nested
) -> Nested:
    if len(args) > position:
        return args[position]
    return next((kwargs[name] for name in names if name in kwargs), default)


def drop_rate(args: list[Nested], kwargs: dict[str, Nested], training_default: bool = True) -> float | None:
    """p where the call draws a mask (training, 0 < p < 1); None where it is deterministic.
    F.dropout(input, p, training, inplace) and torch.dropout(input, p, train) alike."""
    p = _argument(args, kwargs, 1, ("p",), 0.5)
    training = _argument(args, kwargs, 2, ("training", "train"), training_default)
    if not isinstance(p, (int, float)) or not training or not 0 < p < 1:
        return None
    return float(p)


@dataclass(frozen=True)
class Affine(Carried):
    """What a dropout makes of an element: x * scale + shift where kept, `dropped` where
    not (a backward: g * scale where kept, 0 where not). Carried to the bench in the
    call's keyword arguments (`reveal`)."""

    scale: float
    shift: float = 0.0
    dropped: float = 0.0


def exact(p: float, alpha: bool, direction: str) -> Affine:
    """A correct kernel's constants, exactly."""
    if not alpha:
        return Affine(1 / (1 - p))
    a = 1 / math.sqrt((SELU_ALPHA**2 * p + 1) * (1 - p))
    return Affine(a) if direction == "backward" else Affine(a, SELU_ALPHA * a * p, -SELU_ALPHA * a * (1 - p))


def in_dtype(constants: Affine, alpha: bool, dtype: torch.dtype) -> Affine:
    """The constants as torch's CPU kernel rounds them in D: the scale (noise = mask * a,
    or mask / (1 - p), in D), b = (mask - 1) * (alpha a) + alpha a p in D."""
    if not alpha:
        return Affine(float(torch.tensor(constants.scale, dtype=torch.float64).to(dtype)))
    one, zero = torch.ones((), dtype=dtype), torch.zeros((), dtype=dtype)
    alpha_a = SELU_ALPHA * constants.scale
    return Affine(
        float(one * constants.scale),
        float(zero.mul(alpha_a).add(constants.shift)) if constants.shift else 0.0,
        float((-one).mul(alpha_a).add(constants.shift)) if constants.dropped else 0.0,
    )


@dataclass(frozen=True)
class Revealed:
    """What the device's result shows of a dropout call's draw."""

    p: float
    source: torch.Tensor  # the input (forward) or the incoming gradient (backward)
    result: torch.Tensor  # the device's output or input gradient
    kept: torch.Tensor  # the elements the device kept
    visible: torch.Tensor  # the elements whose result shows whether they were kept
    constants: Affine  # the exact constants


@dataclass(frozen=True)
class Drawn:
    """A dropout API's draw, as its device result reveals it."""

    kind: Kind

    def apply_mask(self, function: Callable[..., Nested]) -> Callable[..., Nested]:
        """The dropout with the device's mask (keyword `kept`) and constants
        (`constants`): input * kept * scale (the mask and scale as one factor, as torch's
        kernel multiplies), an alpha dropout's kept x * a + b and dropped constant; the
        call itself where it draws nothing. Without a mask (the device failed before it
        showed one) every element is kept, only to show that the bench can run."""
        kind = self.kind

        def run(
            *args: Nested, kept: torch.Tensor | None = None, constants: Affine | None = None, **kwargs: Nested
        ) -> Nested:
            p = drop_rate(list(args), kwargs, kind.training_default)
            if p is None:
                return function(*args, **kwargs)
            x = args[0] if args else kwargs["input"]
            assert isinstance(x, torch.Tensor)  # dropout takes a tensor input
            keep = torch.ones_like(x, dtype=torch.bool) if kept is None else kept
            given = exact(p, kind.alpha, "forward") if constants is None else constants
            if not kind.alpha:
                return x * (keep.to(x.dtype) * given.scale)
            return torch.where(keep, x * given.scale + given.shift, torch.full_like(x, given.dropped))

        return run

    def find_masks(self, inputs: Arguments, device: Nested, direction: str) -> Revealed | None:
        """The masked tensors of a dropout call whose device result is at hand, else None."""
        p = drop_rate(inputs.args, inputs.kwargs, self.kind.training_default)
        if p is None:
            return None
        if direction == "forward":
            source, result = (inputs.args[0] if inputs.args else inputs.kwargs.get("input")), device
        else:
            source = (inputs.grads or [None])[0]
            result = device[0] if isinstance(device, tuple) and device else None
        if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor) or source.shape != result.shape:
            return None
        constants = exact(p, self.kind.alpha, direction)
        if not constants.dropped:
            return Revealed(p, source, result, result != 0, source != 0, constants)
        ulp = abs(constants.dropped) * torch.finfo(result.dtype).eps
        at_constant = (result.double() - constants.dropped).abs() <= ulp
        visible = (source.double() * constants.scale + constants.shift - constants.dropped).abs() > 2 * ulp
        return Revealed(p, source, result, ~at_constant, visible, constants)

    def reveal(self, inputs: CallInputs, device: Nested, direction: str) -> CallInputs:
        """The inputs with the device's mask and constants for the bench and the reference."""
        shown = self.find_masks(inputs, device, direction)
        if shown is None:
            return inputs
        told = copy.copy(inputs)
        told.kwargs = {**inputs.kwargs, "kept": shown.kept, "constants": self._closest(shown)}
        return told

    def _closest(self, shown: Revealed) -> Affine:
        """Of the two correct sets of constants, the one nearer the device's result."""
        source, result = shown.source.double()[shown.visible], shown.result.double()[shown.visible]
        kept = shown.kept[shown.visible]

        def distance(constants: Affine) -> float:
            made = torch.where(
                kept, source * constants.scale + constants.shift, torch.full_like(source, constants.dropped)
            )
            return float((result - made).abs().sum())

        return min((shown.constants, in_dtype(shown.constants, self.kind.alpha, shown.result.dtype)), key=distance)


def dropped_share(shown: Revealed, unit_dims: int) -> tuple[int, int, float]:
    """(dropped units, units with a visible mask, z of the dropped count against
    Binomial(n, p)). A unit is an element, or a channel: the trailing `unit_dims`
    dimensions together (dropout2d's H and W)."""
    visible, kept = shown.visible, shown.kept
    if unit_dims:
        visible, kept = (
            tensor.flatten(-unit_dims).any(-1) if tensor.dim() > unit_dims else tensor.any()
            for tensor in (visible, kept)
        )
    n = int(visible.sum())
    dropped = int((visible & ~kept).sum())
    spread = math.sqrt(n * shown.p * (1 - shown.p))
    return dropped, n, (dropped - n * shown.p) / spread if spread else 0.0
