"""How far a correct kernel's rounding may move an explored example's result, and the
rounding excuses built on it (EXCUSED_ROUNDINGS): an example judged error passes once
its errors lie within EXCUSED_SENSITIVITY times the bench's change when the inputs
(input_sensitivity) or a recurrent API's gates (gate_sensitivity) move by a rounding in
the device's dtype. Explored inputs can be as ill-conditioned as inputs get; the dumped
call's own test judges it without these excuses (judge/explore/search.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import torch

from pytest_msprobe.judge.explore.recurrent import DEFINITIONS as RECURRENT_DEFINITIONS
from pytest_msprobe.judge.verdict.judgement import Judgement, Rejudgement, judge, relabel
from pytest_msprobe.judge.verdict.terms import term_magnitudes
from pytest_msprobe.run.replay import Placement, Run, evaluate, flat_outputs, tree_map

if TYPE_CHECKING:
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.replay import Inputs, Side

#: how exploration moves a floating input: (original, raised to the bench's dtype) -> moved
Move: TypeAlias = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: what _pairwise applies to each pair of floating tensors of one shape
Pairwise: TypeAlias = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Why a judged example passes only once its errors are conditioned (EXCUSED_ROUNDINGS).
WITHIN_ROUNDING = "errors within 16x the inputs' rounding (and flushed subnormals)"
# Why a recurrent backward passes only once its gates' rounding joins that (EXCUSED_ROUNDINGS).
GATES_ROUNDED = "errors within 16x the rounding of its saturating gates' results (recurrent backward)"


# How many times the inputs' rounding sensitivity a correct kernel's error may be: a few
# roundings of intermediates, each comparable to one of an input.
EXCUSED_SENSITIVITY = 16


def excused_by_rounding(judgement: Judgement) -> tuple[Judgement, str | None]:
    """The example judged error, excused by the first row of EXCUSED_ROUNDINGS that
    applies and passes it, and that row's cause; the error and None where none does."""
    for row in EXCUSED_ROUNDINGS:
        if row.applies(judgement):
            again = row.run(judgement)
            if not again.error:
                return again, row.name
    return judgement, None


def _excuse_conditioning(judgement: Judgement, sensitivity: Nested, excused: str) -> Judgement:
    """The judgement again, with each element's error excused up to EXCUSED_SENSITIVITY
    times its sensitivity to the rounding of the inputs (`sensitivity`); where that is
    still an error, the error stands.

    Explored inputs can be as ill-conditioned as inputs get (a large common offset under
    a normalisation): there a correct kernel in D errs by the condition number times D's
    rounding, far beyond the result's own ULP. That error is what the bench shows when
    the inputs move as a correct kernel may move them (input_sensitivity): Delta. The
    device's error within 16 Delta, plus D's smallest normal value times the longest
    dimension of the inputs (a kernel that flushes subnormal results to zero, as the
    CPU's bfloat16 GEMM and many accelerators do, loses up to that much on each term of
    a sum; measured: the CPU's bfloat16 matmul of 13 terms scaled into the subnormals,
    2.3e-38 = 2 smallest normals) times the largest incoming gradient of a backward
    (_largest_incoming), is taken off, the rest judged as before, with the
    terms' magnitudes where the call sums products: a NaN, an inf, or an error of a
    naive algorithm (a variance as E[x^2] - E[x]^2 loses u mean^2, hundreds of Delta)
    still fails. `excused` names the cause."""
    results = judgement.results
    longest = max((size for leaf in results.inputs.leaves for size in leaf.tensor.shape), default=1)
    flushed = longest * _largest_incoming(results.inputs)
    allowed = _pairwise(
        lambda delta, device: EXCUSED_SENSITIVITY * delta + flushed * torch.finfo(device.dtype).smallest_normal,
        sensitivity,
        results.device,
    )
    device = _excused_device(results.device, results.bench, allowed)
    terms = term_magnitudes(judgement.name, judgement.bench, results.inputs, judgement.framework)
    again = Judgement(
        judgement.registry,
        judgement.name,
        dataclasses.replace(results, device=device),
        judgement.bench,
        judgement.framework,
        terms=terms,
    )
    verdict = judge(again)
    return (
        judgement
        if verdict.status == "error"
        else dataclasses.replace(again, verdict=relabel(verdict, f"{excused} excused"))
    )


def _within_inputs_rounding(judgement: Judgement) -> Judgement:
    """_conditioned on input_sensitivity; the judgement as it was where that cannot be measured."""
    sensitivity = input_sensitivity(judgement)
    return judgement if sensitivity is None else _excuse_conditioning(judgement, sensitivity, WITHIN_ROUNDING)


def _recurrent_backward(judgement: Judgement) -> bool:
    return judgement.name.direction == "backward" and judgement.name.operator in RECURRENT_DEFINITIONS


def _within_gates_rounding(judgement: Judgement) -> Judgement:
    """_conditioned with the sensitivity to the rounding of the gates' results besides
    the inputs' (gate_sensitivity): a recurrent backward's (1 - z) and 1 - n**2 are
    formed from gates that D holds rounded, and cancel where the gates saturate
    (measured: torch's fused float32 GRU backward and the GRU's definition run cell by
    cell in float32 err alike, 659 to 8e5 scaled ULP of the weight gradient as inputs
    and state grow). The judgement as it was where either cannot be measured."""
    inputs, gates = input_sensitivity(judgement), gate_sensitivity(judgement)
    if inputs is None or gates is None:
        return judgement
    return _excuse_conditioning(judgement, _pairwise(torch.maximum, inputs, gates), GATES_ROUNDED)


#: How an explored example judged error is judged again, in order (excused_by_rounding): its
#: errors excused within a rounding a correct kernel's error may reach on such inputs.
#: Each row's name is its cause, counted in the message and the metrics file.
EXCUSED_ROUNDINGS = (
    Rejudgement(WITHIN_ROUNDING, lambda judgement: True, _within_inputs_rounding),
    Rejudgement(GATES_ROUNDED, _recurrent_backward, _within_gates_rounding),
)


def gate_sensitivity(judgement: Judgement) -> Nested | None:
    """Element by element, the largest change of the bench's gradients when every gate's
    result of the API's definition (judge/explore/recurrent.py) moves by a rounding in D, y (1 +- u)
    under SENSITIVITY_PATTERNS random sign patterns; None where the definition cannot
    run the call."""
    name, bench, inputs = judgement.name, judgement.bench, judgement.results.inputs
    definition = RECURRENT_DEFINITIONS.get(name.operator)
    floats = [leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.is_floating_point()]
    if definition is None or not floats or not isinstance(bench, Run):
        return None
    unit = max(torch.finfo(dtype).eps for dtype in floats) / 2

    def gradients(gate: Callable[[torch.Tensor], torch.Tensor] | None) -> Nested | None:
        function = definition if gate is None else functools.partial(definition, gate=gate)
        return evaluate(dataclasses.replace(bench, function=function), name.direction, inputs, judgement.framework)

    plain = gradients(None)
    moved = [gradients(_rounded_gate(unit, seed)) for seed in range(SENSITIVITY_PATTERNS)]
    if plain is None or any(change is None for change in moved):
        return None
    changes = [_pairwise(lambda a, b: (a.double() - b.double()).abs(), change, plain) for change in moved]
    return functools.reduce(lambda merged, change: _pairwise(torch.maximum, merged, change), changes)


def _rounded_gate(unit: float, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """y (1 +- unit), signs at random, for each gate's result in turn."""
    generator = torch.Generator().manual_seed(seed)

    def gate(value: torch.Tensor) -> torch.Tensor:
        signs = torch.randint(0, 2, value.shape, generator=generator).to(value.dtype) * 2 - 1
        return value * (1 + unit * signs)

    return gate


def _largest_incoming(inputs: Inputs) -> float:
    """max(1, the largest |incoming gradient|): a backward multiplies its intermediates by
    it, a flushed one among them too (layer_norm's weight gradient sums g x_hat, and x_hat
    of subnormal inputs is subnormal itself)."""
    grads = [g for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point() and g.numel()]
    return max([1.0, *(float(g.double().abs().nan_to_num(posinf=0.0, neginf=0.0).max()) for g in grads)])


def _excused_device(device: Nested, bench: Nested, allowed: Nested) -> Nested:
    """The device's outputs with the error within `allowed` taken off (NaN stays NaN)."""
    if isinstance(device, (list, tuple)) and isinstance(bench, (list, tuple)) and isinstance(allowed, (list, tuple)):
        return tuple(_excused_device(d, b, a) for d, b, a in zip(device, bench, allowed, strict=False))
    if not (
        isinstance(device, torch.Tensor)
        and isinstance(bench, torch.Tensor)
        and isinstance(allowed, torch.Tensor)
        and device.is_floating_point()
        and device.shape == bench.shape == allowed.shape
    ):
        return device
    error = device.double() - bench.double()
    kept = error - torch.maximum(torch.minimum(error, allowed), -allowed)
    return (bench.double() + kept).to(device.dtype)


def input_sensitivity(judgement: Judgement) -> Nested | None:
    """Element by element, in the bench's structure, the largest change of the bench's
    result when its inputs move as a correct kernel in D may move them: by a rounding,
    x (1 +- u) (u: D's unit roundoff) under a few random sign patterns, with D's
    subnormals flushed to zero (kernels that treat subnormal inputs as zero), and, for a
    backward defined from the forward's result (RESULT_BACKWARDS), that result rounded to
    D. None where the bench cannot run it."""
    inputs, bench = judgement.results.inputs, judgement.bench
    floats = [leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.is_floating_point()]
    if not floats or not isinstance(bench, Run):
        return None
    unit = max(torch.finfo(dtype).eps for dtype in floats) / 2
    moves = [_round_inputs(unit, seed) for seed in range(SENSITIVITY_PATTERNS)] + [_flush_subnormals]
    changes = [_change(judgement, bench, move) for move in moves]
    if any(change is None for change in changes):
        return None
    changes += [
        _round_result(judgement, unit, seed)
        for seed in range(SENSITIVITY_PATTERNS)
        if judgement.name.operator in RESULT_BACKWARDS
    ]
    merged = changes[0]
    for change in changes[1:]:
        merged = merged if change is None else _pairwise(torch.maximum, merged, change)
    return merged


#: The backwards derivatives.yaml defines from the forward's result, not its input:
#: sigmoid_backward(grad, result) = grad (1 - y) y, tanh_backward(grad, result) =
#: grad (1 - y**2). Every kernel of that definition reads y rounded to D, and 1 - y
#: cancels where y nears 1 (from x the same derivative is accurate: measured 0.28 ULP
#: where torch's is 2e5 at x = 15.6).
RESULT_BACKWARDS = {"sigmoid": "sigmoid_backward", "tanh": "tanh_backward"}


def _round_result(judgement: Judgement, unit: float, seed: int) -> Nested | None:
    """|backward(g, y (1 +- u)) - backward(g, y)| (y: the forward's exact result), as the
    bench's one input gradient; None where the call is not that backward's."""
    name, inputs = judgement.name, judgement.results.inputs
    grad = next((g for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()), None)
    result = forward_result(judgement.bench, inputs, judgement.framework)
    if name.direction != "backward" or grad is None or result is None or grad.shape != result.shape:
        return None
    backward = getattr(torch.ops.aten, RESULT_BACKWARDS[name.operator])
    y, g = result.double(), grad.double()
    moved = _round_inputs(unit, seed)(y, y)
    return (torch.as_tensor(backward(g, moved) - backward(g, y)).abs(),)


def forward_result(bench: Side, inputs: Inputs, framework: str) -> torch.Tensor | None:
    """A backward's forward result on the bench (its first floating output), None where
    the bench cannot run it."""
    forward = evaluate(bench, "forward", dataclasses.replace(inputs, grads=None), framework)
    return next((y for y in flat_outputs(forward) if isinstance(y, torch.Tensor) and y.is_floating_point()), None)


# Random sign patterns the sensitivity is the largest over: a row of two elements moved
# the same way by one pattern keeps x - mean(x) as it was (probability 1/2 each).
SENSITIVITY_PATTERNS = 4


def _round_inputs(unit: float, seed: int) -> Move:
    """x (1 +- unit), signs at random: a rounding of every input."""
    generator = torch.Generator().manual_seed(seed)

    def move(original: torch.Tensor, raised: torch.Tensor) -> torch.Tensor:
        signs = torch.randint(0, 2, raised.shape, generator=generator).to(raised.dtype) * 2 - 1
        return raised * (1 + unit * signs)

    return move


def _flush_subnormals(original: torch.Tensor, raised: torch.Tensor) -> torch.Tensor:
    """The input with what is subnormal in its own dtype set to zero."""
    return torch.where(original.abs() < torch.finfo(original.dtype).smallest_normal, torch.zeros_like(raised), raised)


def _change(judgement: Judgement, bench: Run, move: Move) -> Nested | None:
    """|bench(moved inputs) - bench(inputs)|, the inputs moved in the bench's precision."""
    inputs = judgement.results.inputs

    def move_leaf(value: Nested) -> Nested:
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            return value
        return move(value, value.to(bench.placement.dtypes.get(value.dtype, value.dtype)))

    perturbed = dataclasses.replace(
        inputs,
        args=tree_map(move_leaf, inputs.args),
        kwargs=tree_map(move_leaf, inputs.kwargs),
        grads=tree_map(move_leaf, inputs.grads) if inputs.grads is not None else None,
    )
    again = evaluate(
        dataclasses.replace(bench, placement=Placement(bench.placement.device)),
        judgement.name.direction,
        perturbed,
        judgement.framework,
    )
    if again is None:
        return None
    return _pairwise(lambda a, b: (a.double() - b.double()).abs(), again, judgement.results.bench)


def _pairwise(function: Pairwise, left: Nested, right: Nested) -> Nested:
    """function(l, r) over two outputs of one structure (None where a side is not a
    floating tensor of the same shape)."""
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)) and len(left) == len(right):
        return tuple(_pairwise(function, l, r) for l, r in zip(left, right, strict=True))
    if (
        isinstance(left, torch.Tensor)
        and isinstance(right, torch.Tensor)
        and left.is_floating_point()
        and right.is_floating_point()
        and left.shape == right.shape
    ):
        return function(left, right)
    return None
