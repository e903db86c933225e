"""Which dimensions of a call's tensors a reduction may cut together (judge/reduce/reduction.py),
as data: the `[reduce]` table of api_tables/pytorch.toml names each API's rule, and
AXIS_RULES turns a rule and the call's recorded shapes and arguments into axes. An
axis cuts every tensor it names by the same slice: the output's with the inputs'
where the API maps slices of the inputs to slices of the output (maps_outputs), which
is what lets an offline reduction slice the dumped outputs with the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

from pytest_msprobe.dump.index import Json
from pytest_msprobe.run.apis import reduce_rules

#: where a tensor sits in a call's forward record: ("input_args", 0), ("input_kwargs", "weight"), ("output", 0)
Loc: TypeAlias = tuple[str, "int | str"]


@dataclass(frozen=True)
class Axis:
    """Dimensions cut together by one slice: (where, dim) of each tensor, its size, and
    whether the outputs' slices follow (False: the dumped outputs cannot be sliced with it)."""

    name: str
    members: tuple[tuple[Loc, int], ...]
    size: int
    maps_outputs: bool = True


@dataclass(frozen=True)
class CallShapes:
    """The forward record's tensors' shapes and its other arguments, as a rule reads them."""

    shapes: dict[Loc, tuple[int, ...]]
    values: dict[Loc, Json]

    def argument(self, position: int, keyword: str) -> Json:
        """An argument given by position or by keyword (None: not given)."""
        return self.values.get(("input_args", position), self.values.get(("input_kwargs", keyword)))

    @property
    def output(self) -> tuple[int, ...]:
        return self.shapes.get(("output", 0), ())

    def inputs(self) -> Iterator[tuple[Loc, tuple[int, ...]]]:
        return ((loc, shape) for loc, shape in self.shapes.items() if loc[0] != "output")


def _broadcast(call: CallShapes, kept: frozenset[int] = frozenset()) -> list[Axis]:
    """Any dim of the output but `kept`, cut in every output and every argument that
    spans it (an argument of size 1 there is broadcast, and kept)."""
    out = call.output
    axes = []
    for dim, size in enumerate(out):
        if size < 2 or dim in kept:
            continue
        members: list[tuple[Loc, int]] = [
            (loc, dim) for loc, shape in call.shapes.items() if loc[0] == "output" and shape == out
        ]
        for loc, shape in call.inputs():
            aligned = dim - (len(out) - len(shape))
            if aligned >= 0 and shape[aligned] == size:
                members.append((loc, aligned))
        axes.append(Axis(f"dim {dim}", tuple(members), size))
    return axes


def _reduced_dim(call: CallShapes) -> list[Axis]:
    """A softmax: every dim but the one it reduces (argument `dim`)."""
    dim = _int(call.argument(1, "dim"))
    if dim is None:
        return []
    return _broadcast(call, frozenset({dim % max(len(call.output), 1)}))


def _norm_axes(call: CallShapes) -> list[Axis]:
    """A norm over the trailing `normalized_shape` dims: the leading dims only."""
    normalized = _ints(call.argument(1, "normalized_shape"))
    rank = len(call.output)
    return _broadcast(call, frozenset(range(rank - len(normalized), rank))) if normalized is not None else []


def _matmul(call: CallShapes) -> list[Axis]:
    """Rows of the first operand (its every dim but the last, with the output's), the
    columns of the second (its last), and the inner dim (no output maps it)."""
    a, b, out = call.shapes.get(("input_args", 0)), call.shapes.get(("input_args", 1)), call.output
    if a is None or b is None or len(a) < 2 or len(b) < 2 or len(out) < 2:
        return []
    axes = []
    for dim in range(len(a) - 1):
        out_dim = dim + len(out) - len(a)
        members: list[tuple[Loc, int]] = [(("input_args", 0), dim), (("output", 0), out_dim)]
        b_dim = out_dim - (len(out) - len(b))
        if dim < len(a) - 2 and b_dim >= 0 and b[b_dim] == a[dim]:  # a batch dim b shares
            members.append((("input_args", 1), b_dim))
        axes.append(Axis(f"rows dim {dim}", tuple(members), a[dim]))
    axes.append(Axis("columns", ((("input_args", 1), len(b) - 1), (("output", 0), len(out) - 1)), b[-1]))
    inner = ((("input_args", 0), len(a) - 1), (("input_args", 1), len(b) - 2))
    return [*axes, Axis("inner", inner, a[-1], maps_outputs=False)]


def _linear(call: CallShapes) -> list[Axis]:
    """Rows of the input, the weight's output features with the bias's and the output's
    last dim, and the inner dim (input features: no output maps it)."""
    x, weight, out = call.shapes.get(("input_args", 0)), call.shapes.get(("input_args", 1)), call.output
    if x is None or weight is None or len(weight) != 2 or not out:
        return []
    axes = [
        Axis(f"rows dim {dim}", ((("input_args", 0), dim), (("output", 0), dim)), x[dim]) for dim in range(len(x) - 1)
    ]
    features: list[tuple[Loc, int]] = [(("input_args", 1), 0), (("output", 0), len(out) - 1)]
    features += [(loc, 0) for loc in (("input_args", 2), ("input_kwargs", "bias")) if loc in call.shapes]
    axes.append(Axis("features", tuple(features), weight[0]))
    return [*axes, Axis("inner", ((("input_args", 0), len(x) - 1), (("input_args", 1), 1)), x[-1], maps_outputs=False)]


#: a rule of the [reduce] table -> the axes of a call
AXIS_RULES: dict[str, Callable[[CallShapes], list[Axis]]] = {
    "broadcast": _broadcast,
    "reduced_dim": _reduced_dim,
    "normalized": _norm_axes,
    "matmul": _matmul,
    "linear": _linear,
}


def _int(value: Json) -> int | None:
    value = value.get("value") if isinstance(value, dict) else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(value: Json) -> list[int] | None:
    value = value.get("value") if isinstance(value, dict) else value
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        found = [_int(item) for item in value]
        return [item for item in found if item is not None] if None not in found else None
    return None


def call_axes(operator: str, call: CallShapes) -> list[Axis]:
    """The axes of a call of `operator` (none where the [reduce] table has no rule for it)."""
    rule = reduce_rules().get(operator)
    return AXIS_RULES[rule](call) if rule is not None else []
