"""The overflows no correct kernel of an API avoids (EXCUSES): an explored example whose
inputs drive an intermediate the API's definition computes beyond the range it is
computed in is discarded as the input's fault, never reported (judge/explore/search.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from pytest_msprobe.judge.defects.intermediates import BACKWARD_INTERMEDIATES, Arguments, magnitude, underflows, widen
from pytest_msprobe.judge.explore.rounding_excuses import forward_result
from pytest_msprobe.judge.verdict.terms import has_terms, term_magnitudes
from pytest_msprobe.run.apis import normed_arguments, summing_apis
from pytest_msprobe.run.replay import evaluate, flat_outputs

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import CallName
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.judge.check.call import Replayed
    from pytest_msprobe.run.replay import Results

# The dtype a correct kernel accumulates D's sums in: 16-bit floats in float32 (torch's
# opmath type, and what accelerators' reductions use for them); others in D itself.
ACCUMULATOR = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@dataclass(frozen=True)
class Excuse:
    """An overflow no correct kernel of an API avoids: an intermediate that the API's
    definition computes (`computes`), beyond the range it is computed in (`beyond`)."""

    cause: str  # named in the counts of the message and the metrics file
    computes: Callable[[CallName], bool]
    beyond: Callable[[CallName, Replayed, str], bool]


def beyond_range(name: CallName, replayed: Replayed, framework: str) -> str | None:
    """The cause that excuses an example the device got wrong, None where none does.

    Each intermediate (EXCUSES) counts only for the APIs that compute it: a softmax
    computes no sum of squares, so its large or masked logits excuse nothing. Masked
    positions (inf/NaN in an input) are left out of each: an infinity counts only
    where every input is finite (the bench's range holds D's: rsqrt's derivative
    -x**-1.5 / 2 at a bfloat16 subnormal overflows float32 too), and a sum of squares
    sums the finite elements."""
    return next(
        (excuse.cause for excuse in EXCUSES if excuse.computes(name) and excuse.beyond(name, replayed, framework)), None
    )


def _largest(results: Results) -> float | None:
    """The largest finite value of the device outputs' dtypes; None: no floating output."""
    outputs = [d for d in flat_outputs(results.device) if isinstance(d, torch.Tensor) and d.is_floating_point()]
    return max(torch.finfo(d.dtype).max for d in outputs) if outputs else None


def _beyond(values: Nested, results: Results) -> bool:
    """Whether a value of `values` is beyond the device dtype's range (see beyond_range)."""
    largest = _largest(results)
    if largest is None:
        return False
    finite = all(
        bool(torch.isfinite(leaf.tensor).all()) for leaf in results.inputs.leaves if leaf.tensor.is_floating_point()
    )
    return any(magnitude(value, finite) > largest for value in flat_outputs(values) if isinstance(value, torch.Tensor))


def _result_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    return _beyond(replayed.results.bench, replayed.results)


def _sum_beyond(power: int) -> Callable[[CallName, Replayed, str], bool]:
    """Whether the sum of the first argument's finite |elements|**power lies above the
    accumulator's largest value, or, for squares, so far below its smallest normal
    one that the sum keeps fewer bits than the accumulator has (the squares of tiny
    inputs underflow)."""

    def beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
        first = next(
            (arg for arg in replayed.results.inputs.args if isinstance(arg, torch.Tensor) and arg.is_floating_point()),
            None,
        )
        if first is None or _largest(replayed.results) is None:
            return False
        info = torch.finfo(ACCUMULATOR.get(first.dtype, first.dtype))
        wide = first.double()
        total = float(wide[torch.isfinite(wide)].abs().pow(power).sum())
        return total > info.max or (power == 2 and 0 < total < info.smallest_normal / info.eps)

    return beyond


def _group_norm_groups(args: list[Nested], kwargs: dict[str, Nested]) -> torch.Tensor | None:
    """group_norm's input as (sample, group, elements of the group)."""
    x, groups = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("num_groups")
    if not isinstance(x, torch.Tensor) or not isinstance(groups, int) or x.dim() < 2 or not groups:
        return None
    return x.reshape(x.shape[0], groups, -1)


#: How each API of the [explore] centred table groups its input for the mean and variance
#: its definition forms: the input reshaped to (..., the elements of one group).
CENTRED_GROUPS: dict[str, Callable[[list[Nested], dict[str, Nested]], torch.Tensor | None]] = {
    "group_norm": _group_norm_groups
}


def _centred_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A group's sum of (x - mean)**2 (its finite elements) beyond the accumulator's range
    or so far below its smallest normal value that it keeps fewer bits than it has: the
    definition's variance. x**2 itself is no intermediate of the definition: under a large
    common offset it overflows where the centred squares fit (measured: a variance by
    E[x**2] - E[x]**2 must still fail there)."""
    inputs = replayed.results.inputs
    grouped = CENTRED_GROUPS[name.operator](list(inputs.args), dict(inputs.kwargs))
    if grouped is None or not grouped.is_floating_point() or _largest(replayed.results) is None:
        return False
    info = torch.finfo(ACCUMULATOR.get(grouped.dtype, grouped.dtype))
    wide = grouped.double()
    finite = torch.isfinite(wide)
    count = finite.sum(-1, keepdim=True).clamp_min(1)
    mean = wide.where(finite, torch.zeros_like(wide)).sum(-1, keepdim=True) / count
    totals = (wide - mean).square().where(finite, torch.zeros_like(wide)).sum(-1)
    positive = totals[totals > 0]
    return float(totals.max()) > info.max or (
        bool(positive.numel()) and float(positive.min()) < info.smallest_normal / info.eps
    )


def _floats(replayed: Replayed) -> list[torch.Tensor]:
    """The forward's floating tensors, their finite elements only (masked positions left out)."""
    tensors = [leaf.tensor for leaf in replayed.results.inputs.leaves if leaf.tensor.is_floating_point()]
    return [tensor.double()[torch.isfinite(tensor)] for tensor in tensors]


def _shifted_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """x - max(x) of the first argument beyond the dtype's range (its finite elements)."""
    first = next(
        (arg for arg in replayed.results.inputs.args if isinstance(arg, torch.Tensor) and arg.is_floating_point()), None
    )
    largest = _largest(replayed.results)
    if first is None or largest is None:
        return False
    finite = first.double()[torch.isfinite(first)]
    return finite.numel() > 0 and float(finite.max() - finite.min()) > largest


def _products_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A gate's sum of products beyond the dtype's range: the largest |weight| times the
    largest |input| (at least 1: a state is bounded by 1) times the longest dimension."""
    largest = _largest(replayed.results)
    magnitudes = sorted((float(tensor.abs().max()) for tensor in _floats(replayed) if tensor.numel()), reverse=True)
    if largest is None or not magnitudes:
        return False
    longest = max(int(size) for leaf in replayed.results.inputs.leaves for size in [*leaf.tensor.shape, 1])
    return bool(magnitudes[0] * max([1.0, *magnitudes[1:2]]) * longest > largest)


def _scores_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """An attention's scores beyond the dtype's range: their terms' sums |q| |k|^T scale,
    or a query row's x - max(x) (the finite scores only: masked positions left out). In
    float32, q and k of 1e19 overflow every correct kernel's scores; the bench in float64
    does not (measured: 14 inf on the device)."""
    inputs = replayed.results.inputs
    q, k = (next(iter(inputs.args[i : i + 1]), None) for i in (0, 1))
    largest = _largest(replayed.results)
    if (
        not isinstance(q, torch.Tensor)
        or not isinstance(k, torch.Tensor)
        or largest is None
        or q.dim() < 2
        or k.dim() < 2
    ):
        return False
    given = inputs.kwargs.get("scale")
    scale = float(given) if isinstance(given, (int, float)) else 1 / math.sqrt(q.shape[-1])
    wide_q, wide_k = (tensor.double().nan_to_num(0.0, 0.0, 0.0) for tensor in (q, k))  # masked positions left out
    try:
        terms = (wide_q.abs() @ wide_k.abs().transpose(-2, -1)) * abs(scale)
        scores = (wide_q @ wide_k.transpose(-2, -1)) * scale
    except RuntimeError:  # shapes that do not broadcast: no evidence
        return False
    spread = scores.amax(-1) - scores.amin(-1) if scores.numel() else scores
    return _beyond((terms, spread), replayed.results)


def _terms_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    terms = term_magnitudes(name, replayed.bench, replayed.results.inputs, framework)
    return terms is not None and _beyond(terms, replayed.results)


def _shifted_gradient_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A softmax-like backward's shifted gradient beyond the dtype's range (finite
    elements only): softmax's and softmin's gradient is defined as y * (g - sum(g * y))
    along dim, log_softmax's as g - exp(y) * sum(g): g - sum(g * y) is up to twice the
    largest |g| (the backward's x - max(x)), and sum(g)'s partial sums up to sum(|g|)."""
    inputs = replayed.results.inputs
    first = next((arg for arg in inputs.args if isinstance(arg, torch.Tensor) and arg.is_floating_point()), None)
    grad = next((g for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()), None)
    largest = _largest(replayed.results)
    if first is None or grad is None or largest is None or grad.shape != first.shape or not first.dim():
        return False
    dim = inputs.kwargs.get("dim", inputs.args[1] if len(inputs.args) > 1 else None)
    dim = dim if isinstance(dim, int) else -1
    g = grad.double().nan_to_num(0.0, 0.0, 0.0)  # masked positions left out
    if name.operator == "log_softmax":
        return float(g.abs().sum(dim).max()) > largest
    x = first.double()
    y = torch.softmax(-x if name.operator == "softmin" else x, dim).nan_to_num(0.0, 0.0, 0.0)
    return magnitude(g - (g * y).sum(dim, keepdim=True), False) > largest


def _norm_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    """A norm the API divides by ([explore.norms]: its arguments, along `dim`, argument 2,
    default 1) beyond the dtype's range, or its sum of |x|**p beyond the accumulator's
    (finite elements only)."""
    args, kwargs = replayed.results.inputs.args, replayed.results.inputs.kwargs
    largest = _largest(replayed.results)
    dim = kwargs.get(
        "dim", args[2] if len(args) > 2 and isinstance(args[2], int) else 1
    )  # cosine_embedding_loss's is a target
    power = kwargs.get("p", args[1] if len(args) > 1 and isinstance(args[1], (int, float)) else 2)
    if largest is None or not isinstance(dim, int) or not isinstance(power, (int, float)) or power <= 0:
        return False
    for position in normed_arguments(name.operator):
        tensor = args[position] if position < len(args) else None
        if not (
            isinstance(tensor, torch.Tensor)
            and tensor.is_floating_point()
            and -tensor.dim() <= dim < max(tensor.dim(), 1)
        ):
            continue
        wide = tensor.double()
        powers = (
            wide.abs().pow(power).where(torch.isfinite(wide), torch.zeros_like(wide)).sum(dim)
            if wide.dim()
            else wide.abs() ** power
        )
        accumulator = torch.finfo(ACCUMULATOR.get(tensor.dtype, tensor.dtype)).max
        if float(powers.max()) > accumulator or float(powers.max()) ** (1 / power) > largest:
            return True
    return False


def _backward_intermediate_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    inputs = replayed.results.inputs
    grads = [g.double() for g in inputs.grads or [] if isinstance(g, torch.Tensor) and g.is_floating_point()]
    result = forward_result(replayed.bench, inputs, framework)
    if not grads or result is None:
        return False
    call = Arguments(
        [widen(arg) for arg in inputs.args],
        {key: widen(value) for key, value in inputs.kwargs.items()},
        grads,
        result.double(),
    )
    try:
        intermediates = BACKWARD_INTERMEDIATES[name.operator](call)
    except (IndexError, RuntimeError):  # another overload, shapes that do not broadcast: no evidence
        return False
    floats = [
        d.dtype for d in flat_outputs(replayed.results.device) if isinstance(d, torch.Tensor) and d.is_floating_point()
    ]
    tiny = min((torch.finfo(dtype).smallest_normal for dtype in floats), default=0.0)
    return _beyond(tuple(intermediates), replayed.results) or any(underflows(value, tiny) for value in intermediates)


def _derivative_beyond(name: CallName, replayed: Replayed, framework: str) -> bool:
    return _beyond(_derivative(replayed, framework), replayed.results)


#: The intermediates a correct kernel cannot avoid, and which calls compute them: the
#: exact result (every call), a sum of squares (norms, variances, distances: the
#: [explore] squares table; for the centred table a group's (x - mean)**2), a sum before a division (means, average pools: sums),
#: x - max(x) (softmax and its kin: shifted), a softmax-like backward's g - sum(g * y)
#: (shifted_gradient), an attention's scores q k^T scale (scores), a recurrent gate's products (products), the terms of a sum of
#: products (the [terms] table, which bound a partial sum, not the result), a norm it
#: divides by ([explore.norms]), an intermediate of a backward's formula
#: (BACKWARD_INTERMEDIATES), and a backward's derivative (computed before it is
#: multiplied by the incoming gradient).
EXCUSES = (
    Excuse("exact result beyond the dtype's range", lambda name: True, _result_beyond),
    Excuse(
        "sum of squares beyond its accumulator's range",
        lambda name: name.operator in summing_apis("squares"),
        _sum_beyond(2),
    ),
    Excuse(
        "a group's centred squares (x - mean)**2 beyond its accumulator's range",
        lambda name: name.operator in summing_apis("centred"),
        _centred_beyond,
    ),
    Excuse("sum beyond its accumulator's range", lambda name: name.operator in summing_apis("sums"), _sum_beyond(1)),
    Excuse(
        "x - max(x) beyond the dtype's range", lambda name: name.operator in summing_apis("shifted"), _shifted_beyond
    ),
    Excuse(
        "a gate's products beyond the dtype's range",
        lambda name: name.operator in summing_apis("products"),
        _products_beyond,
    ),
    Excuse(
        "attention scores q k^T scale beyond the dtype's range",
        lambda name: name.operator in summing_apis("scores"),
        _scores_beyond,
    ),
    Excuse("terms of its sums of products beyond the dtype's range", has_terms, _terms_beyond),
    Excuse(
        "g - sum(g * y) of a softmax-like backward beyond the dtype's range",
        lambda name: name.direction == "backward" and name.operator in summing_apis("shifted_gradient"),
        _shifted_gradient_beyond,
    ),
    Excuse(
        "a norm it divides by beyond the dtype's range",
        lambda name: bool(normed_arguments(name.operator)),
        _norm_beyond,
    ),
    Excuse(
        "an intermediate of its backward's formula (derivatives.yaml) beyond the dtype's range or below its normal values",
        lambda name: name.direction == "backward" and name.operator in BACKWARD_INTERMEDIATES,
        _backward_intermediate_beyond,
    ),
    Excuse("derivative beyond the dtype's range", lambda name: name.direction == "backward", _derivative_beyond),
)


def _derivative(replayed: Replayed, framework: str) -> tuple[Nested, ...]:
    """The gradients for unit incoming gradients: the derivative itself (a correct
    kernel computes it before it multiplies by the incoming gradient)."""
    inputs = replayed.results.inputs
    # an incoming gradient is a tensor or None, as msprobe records it
    unit = dataclasses.replace(
        inputs, grads=[None if g is None else torch.ones_like(cast(torch.Tensor, g)) for g in inputs.grads or []]
    )
    return tuple(evaluate(replayed.bench, "backward", unit, framework) or ())
