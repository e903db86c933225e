"""Replay one dumped call: forward or backward, on the device under test, on the
raised-precision CPU bench, and on a reference where an independent one exists.

A call is a pure function of (record, seed, device): inputs are decoded fresh for
every run, each run gets its own copies, and nothing is kept after the call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, TypeAlias, cast, overload

import torch

from pytest_msprobe.dump.index import Json, Record
from pytest_msprobe.dump.values import DecodeContext, Nested, RecordedDevice, TensorLeaf, decode
from pytest_msprobe.errors import CallError, CallSkip
from pytest_msprobe.private_apis import engine_run_backward
from pytest_msprobe.run.apis import Api

#: sees a backward's graph before its gradients flow: (the inputs taking gradients, the outputs)
Observer: TypeAlias = Callable[[list[torch.Tensor], list[torch.Tensor]], None]

#: what a backward gives: each gradient-receiving input's gradient, None where it got none
Gradients: TypeAlias = tuple[torch.Tensor | None, ...]

# The bench's raised precision (spec "Bench"); integers and bools are never raised.
RAISED = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}
MIXED_RAISED = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@dataclass
class Inputs:
    """A call's decoded arguments (CPU tensors in the dump's dtypes)."""

    args: list[Nested]
    kwargs: dict[str, Nested]
    leaves: list[TensorLeaf]
    grads: list[Nested] | None = None  # backward: the incoming gradient per forward output
    # the record's "output" as dumped (forward outputs, or the gradients a backward
    # produced), not decoded: the overflow re-check reads their statistics (judge/findings/overflow.py)
    recorded_outputs: Json | None = None

    @property
    def origins(self) -> list[str]:
        return [f"{leaf.path}: {leaf.origin}" for leaf in self.leaves]

    def describe_arguments(self) -> list[str]:
        """Every argument as a failure's message lists it: a tensor by where it came from,
        its dtype and shape; anything else (the 0.79788456 of `x + 0.79788456`, a size, a
        dtype, None) by its value, as the API received it. Built for failures only."""
        leaves = {id(leaf.tensor): leaf for leaf in self.leaves}
        lines: list[str] = []
        named = [(f"input_args[{i}]", value) for i, value in enumerate(self.args)]
        named += [(f"input_kwargs[{key!r}]", value) for key, value in self.kwargs.items()]
        named += [(f"backward.input[{i}]", value) for i, value in enumerate(self.grads or [])]
        for path, value in named:
            _describe(path, value, leaves, lines)
        return lines


def _describe(path: str, value: Nested, leaves: dict[int, TensorLeaf], lines: list[str]) -> None:
    """One line per tensor of `value` and one for each of its other values."""
    if isinstance(value, torch.Tensor):
        leaf = leaves.get(id(value))
        origin = leaf.origin if leaf is not None else "made by the replay"
        lines.append(f"{path}: {origin}, {str(value.dtype).removeprefix('torch.')}, shape {tuple(value.shape)}")
    elif isinstance(value, (list, tuple)) and any(
        isinstance(item, (torch.Tensor, list, tuple, dict)) for item in value
    ):
        for position, item in enumerate(value):
            _describe(f"{path}[{position}]", item, leaves, lines)
    elif isinstance(value, dict):
        for key, item in value.items():
            _describe(f"{path}[{key!r}]", item, leaves, lines)
    else:
        lines.append(f"{path}: {value!r} ({type(value).__name__})")


def decode_inputs(forward: Record, backward: Record | None, ctx: DecodeContext) -> Inputs:
    """A call's inputs from its forward record; a backward call's (`backward` given) also
    takes the incoming gradients and the recorded outputs from its own record. Every
    caller reads both records first, so decoding is one step after reading."""
    return _decode_forward(forward, ctx) if backward is None else _decode_backward(forward, backward, ctx)


def _decode_forward(record: Record, ctx: DecodeContext) -> Inputs:
    args = record.get("input_args", [])
    kwargs = record.get("input_kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise CallError(f"{ctx.call}: input_args must be a list and input_kwargs an object")
    decoded_args = [decode(value, ctx, f"input_args[{i}]") for i, value in enumerate(args)]
    decoded_kwargs = {key: decode(value, ctx, f"input_kwargs[{key!r}]") for key, value in kwargs.items()}
    if ctx.task != "tensor" and ctx.call.startswith("NPU."):
        _fit_generated(ctx, decoded_args, decoded_kwargs)
    return Inputs(decoded_args, decoded_kwargs, ctx.leaves, recorded_outputs=record.get("output"))


def _fit_generated(ctx: DecodeContext, args: list[Nested], kwargs: dict[str, Nested]) -> None:
    """Arguments generated from a statistics dump that index rows (a grouped kernel's
    group_list) made ones the kernel can read, as the op's reference knows how
    (bench_functions' fit_generated); the leaf's origin says what was done."""
    import pytest_msprobe.bench_functions as bench_functions  # NPU calls only (a script embeds it for them only)

    reference = bench_functions.get(ctx.call.removeprefix("NPU.").rsplit(".", 1)[0])
    fit = reference.companions.fit_generated if reference is not None else None
    if fit is None:
        return
    try:
        changed, how = fit(*args, **kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError):
        return  # as generated: the reference names what it cannot read
    for leaf in ctx.leaves:
        if leaf.tensor is changed:
            leaf.origin = f"{leaf.origin}, {how}"


def _decode_backward(forward: Record, backward: Record, ctx: DecodeContext) -> Inputs:
    inputs = _decode_forward(forward, ctx)
    grads = backward.get("input")
    if not isinstance(grads, list):
        raise CallError(f'{ctx.call}: the backward record\'s "input" (incoming gradients) is not a list')
    inputs.grads = [decode(value, ctx, f"backward.input[{i}]") for i, value in enumerate(grads)]
    inputs.leaves = ctx.leaves
    inputs.recorded_outputs = backward.get("output")
    return inputs


# --- placement ------------------------------------------------------------------


def bench_dtypes(inputs: Inputs, raise_bench: bool) -> dict[torch.dtype, torch.dtype]:
    """dtype -> bench dtype. Mixed floating inputs all go to float32, so the bench
    keeps the device's promotion between them."""
    if not raise_bench:
        return {}
    floats = {leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.dtype.is_floating_point}
    return dict(MIXED_RAISED) if len(floats - {torch.float64}) > 1 else dict(RAISED)


@overload
def tree_map(function: Callable[[Nested], Nested], value: list[Nested]) -> list[Nested]: ...
@overload
def tree_map(function: Callable[[Nested], Nested], value: dict[str, Nested]) -> dict[str, Nested]: ...
@overload
def tree_map(function: Callable[[Nested], Nested], value: Nested) -> Nested: ...
def tree_map(function: Callable[[Nested], Nested], value: Nested) -> Nested:
    """`function` applied to every leaf; a list stays a list, a dict a dict (the
    overloads), any other tuple becomes a plain one (torch's named tuples)."""
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        mapped = [tree_map(function, item) for item in value]
        return mapped if isinstance(value, list) else tuple(mapped)
    if isinstance(value, dict):
        return {key: tree_map(function, item) for key, item in value.items()}
    return function(value)


@dataclass
class Placement:
    """Where and in which dtypes one run happens."""

    device: torch.device
    dtypes: dict[torch.dtype, torch.dtype] = field(default_factory=dict)
    # tensor rank -> the memory format its tensors (inputs and incoming gradients) are laid
    # out in; none given: contiguous, as decoded (judge/offline/layouts.py runs the other layouts)
    formats: dict[int, torch.memory_format] = field(default_factory=dict)

    def __call__(self, value: Nested) -> Nested:
        if isinstance(value, torch.Tensor):
            return self.laid_out(
                value.to(device=self.device, dtype=self.dtypes.get(value.dtype, value.dtype), copy=True)
            )
        if isinstance(value, RecordedDevice):
            return self.device
        return value

    def laid_out(self, tensor: torch.Tensor) -> torch.Tensor:
        memory_format = self.formats.get(tensor.dim())
        return tensor if memory_format is None else tensor.contiguous(memory_format=memory_format)


def to_cpu(value: Nested) -> Nested:
    """Outputs detached on the CPU; torch's named tuples become plain tuples."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        return tuple(to_cpu(item) for item in value)
    return tree_map(lambda item: item.detach().cpu() if isinstance(item, torch.Tensor) else item, value)


# --- running --------------------------------------------------------------------


def tensors_in(value: Nested) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda item: found.append(item) if isinstance(item, torch.Tensor) else None, value)
    return found


def flat_outputs(value: Nested) -> list[Nested]:
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return [item for part in value for item in flat_outputs(part)]
    return [value]


class Side(Protocol):
    """What runs a call on one side (device, bench or reference): Run here, MindSpore's
    MindsporeRun (run/mindspore/replay.py), the dump's own outputs offline (judge/offline/dumped_run.py)."""

    def forward(self, inputs: Inputs) -> Nested: ...

    def backward(self, inputs: Inputs, needs_grad: list[bool]) -> Gradients: ...


@dataclass
class Run:
    """One run of a call (device, bench or reference)."""

    api: Api
    function: Callable[..., Nested]
    placement: Placement
    synchronize: Callable[[], None] = lambda: None
    saved_in: tuple[torch.dtype, torch.dtype] | None = None  # (raised, D): see saved_in_device_dtype
    absolute: bool = False  # every floating value, incoming gradients too, as its |.|: see judge/verdict/terms.py
    # entered around the run: an accelerator bench's strict float32 (run/precision.py)
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
    site: str = ""  # where a bench ran, for the verdict's reference text (run/precision.py)

    @overload
    def place(self, value: list[Nested]) -> list[Nested]: ...
    @overload
    def place(self, value: dict[str, Nested]) -> dict[str, Nested]: ...
    @overload
    def place(self, value: Nested) -> Nested: ...
    def place(self, value: Nested) -> Nested:
        placed = tree_map(self.placement, value)
        return tree_map(_absolute, placed) if self.absolute else placed

    def _incoming(self, grads: list[Nested]) -> list[Nested]:
        return tree_map(_absolute, grads) if self.absolute else grads

    def forward(self, inputs: Inputs) -> Nested:
        with self.context():
            args, kwargs = self.place(inputs.args), self.place(inputs.kwargs)
            with torch.no_grad():
                output = self.function(*args, **kwargs)
            self.synchronize()
            return to_cpu(output)

    def backward(self, inputs: Inputs, needs_grad: list[bool]) -> Gradients:
        with self.context():
            return self._backward(inputs, needs_grad)

    def observed_backward(self, inputs: Inputs, needs_grad: list[bool], observe: Observer) -> Gradients:
        """backward, calling `observe(wanted inputs, outputs)` on the built graph before
        the gradients flow (to hook its nodes: judge/verdict/summed.py gradient_pieces)."""
        with self.context():
            return self._backward(inputs, needs_grad, observe)

    def _backward(self, inputs: Inputs, needs_grad: list[bool], observe: Observer | None = None) -> Gradients:
        args, kwargs = self.place(inputs.args), self.place(inputs.kwargs)
        leaves = [t for t in tensors_in((args, kwargs))]
        wanted = [t for t, flag in zip(leaves, needs_grad, strict=False) if flag]
        for tensor in wanted:
            tensor.requires_grad_(True)
        with torch.enable_grad(), _round_saved(self.saved_in):
            args, kwargs = in_place_copies(self.api, self.function, args, kwargs)
            output = self.function(*args, **kwargs)
            outputs, grads = _pair_gradients(flat_outputs(output), self._incoming(inputs.grads or []), self.placement)
            if not outputs:
                raise CallSkip("no output of the forward call carries a gradient to backpropagate")
            if observe is not None:
                observe(wanted, outputs)
            run_backward(outputs, grads)
        self.synchronize()
        return tuple(None if t.grad is None else t.grad.detach().cpu() for t in wanted)


def run_backward(outputs: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """torch.autograd.backward(outputs, grads) for gradients already paired with their
    outputs (_pair_gradients: same shapes, the outputs' dtype and device).

    torch.autograd.backward checks each gradient's shape through torch's symbolic-shape
    module, whose first use imports sympy: 0.8 s in every process that replays a backward
    call, a tenth of a small dump's whole run. The pairing has checked the shapes, so the
    gradients go to autograd's engine as torch.autograd.backward hands them over; where
    this torch has no such entry point, torch.autograd.backward."""
    engine_run = engine_run_backward()
    if engine_run is None or torch.overrides.has_torch_function((*outputs, *grads)):
        torch.autograd.backward(outputs, grads)
        return
    engine_run(tuple(outputs), tuple(grads), False, False, (), allow_unreachable=True, accumulate_grad=True)


def saved_in_device_dtype(bench: Run, inputs: Inputs) -> Run | None:
    """The bench as a device in D must run a backward: what autograd saves for it (a
    softmax's output, a norm's statistics) rounded to D, the rest in raised precision.

    A correct D kernel cannot do better: its backward reads the forward's results as
    D stored them. Where the gradient cancels far below the scale of its terms (softmax's
    y * (g - sum(g * y)) for a near-constant g), that rounding alone costs tens of ULPs
    at the gradient's scale, against the plain bench; against this one the CPU's own
    float16/bfloat16 softmax gradient is within 0.5 ULP. None unless every floating
    input has one dtype D that the bench raises."""
    floats = {leaf.tensor.dtype for leaf in inputs.leaves if leaf.tensor.dtype.is_floating_point}
    if len(floats) != 1:
        return None
    device_dtype = floats.pop()
    raised = bench.placement.dtypes.get(device_dtype)
    return replace(bench, saved_in=(raised, device_dtype)) if raised is not None else None


@contextlib.contextmanager
def _round_saved(saved_in: tuple[torch.dtype, torch.dtype] | None) -> Iterator[None]:
    if saved_in is None:
        yield
        return
    raised, device_dtype = saved_in
    rounded = lambda t: t.to(device_dtype).to(raised) if t.dtype == raised else t
    with torch.autograd.graph.saved_tensors_hooks(rounded, lambda t: t):
        yield


def _absolute(value: Nested) -> Nested:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.abs()
    return abs(value) if isinstance(value, float) else value


def writes_in_place(api: Api, function: Callable[..., object], args: list[Nested], kwargs: dict[str, Nested]) -> bool:
    """Whether the call writes into its input: by its name (`add_`, `__iadd__`) or by
    its `inplace` argument (`relu(x, inplace=True)`, `dropout(..., inplace=True)`), given
    by keyword or by position (bound to the function's signature where it has one)."""
    if api.in_place:
        return True
    if "inplace" in kwargs:
        return bool(kwargs["inplace"])
    try:
        position = _cached_inplace_position(function)
    except TypeError:  # an unhashable callable (MindSpore's ops hash as dicts): read each time
        position = _inplace_position(function)
    return position is not None and len(args) > position and bool(args[position])


def _inplace_position(function: Callable[..., object]) -> int | None:
    """The position of the function's `inplace` parameter, None where it has none (or no
    signature: a builtin)."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("inplace") if "inplace" in names else None


#: read once per function: a signature costs 50-200 us
_cached_inplace_position = functools.lru_cache(maxsize=512)(_inplace_position)


def in_place_copies(
    api: Api, function: Callable[..., object], args: list[Nested], kwargs: dict[str, Nested]
) -> tuple[list[Nested], dict[str, Nested]]:
    """An in-place call may not write into a leaf that requires grad: it runs on copies
    (each one a CloneBackward node between the call and its leaf, which carries the
    gradient through unchanged). Any other call runs on its arguments as they are."""
    if not writes_in_place(api, function, args, kwargs):
        return args, kwargs
    clone = lambda value: value.clone() if isinstance(value, torch.Tensor) else value
    return tree_map(clone, args), tree_map(clone, kwargs)


def _pair_gradients(
    outputs: list[Nested], grads: list[Nested], placement: Placement
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if len(grads) != len(outputs):
        grads = _grads_by_shape(outputs, grads)
    paired_outputs, paired_grads = [], []
    for position, (output, grad) in enumerate(zip(outputs, grads, strict=False)):
        if grad is None or not isinstance(output, torch.Tensor) or not output.requires_grad:
            continue
        grad = cast(torch.Tensor, grad)  # an incoming gradient is a tensor or None, as msprobe records it
        if tuple(grad.shape) != tuple(output.shape):
            raise CallSkip(
                f"incoming gradient {position} has shape {list(grad.shape)}, the output has {list(output.shape)}"
            )
        paired_outputs.append(output)
        paired_grads.append(placement.laid_out(grad.to(device=output.device, dtype=output.dtype)))
    return paired_outputs, paired_grads


def _grads_by_shape(outputs: list[Nested], grads: list[Nested]) -> list[Nested]:
    """msprobe leaves out the gradients of outputs that got none (a GRU's h_n when only
    its output sequence is used), and records None for those of an autograd node's outputs
    the API does not return (group_norm's node also outputs the mean and rstd): the
    gradients given are paired, in order, with the outputs of their shapes, where that
    choice is unique; the other outputs get None."""
    shapes = [tuple(output.shape) if isinstance(output, torch.Tensor) else None for output in outputs]
    paired: list[Nested] = [None] * len(outputs)
    # an incoming gradient is a tensor or None, as msprobe records it
    given = [cast(torch.Tensor, grad) for grad in grads if grad is not None]
    start = 0
    for grad in given:
        matches = [i for i in range(start, len(outputs)) if shapes[i] == tuple(grad.shape)]
        if len(given) > len(outputs) or len(matches) != 1:
            raise CallSkip(
                f"the dump has {len(grads)} incoming gradients for {len(outputs)} forward outputs; cannot pair them by shape"
            )
        paired[matches[0]], start = grad, matches[0] + 1
    return paired


def needs_grad(inputs: Inputs, framework: str) -> list[bool]:
    """Which input tensors get gradients: floating ones that required grad when dumped
    (MindSpore dumps do not record it: every floating input)."""
    flags = []
    for leaf in inputs.leaves:
        if leaf.path.startswith("backward."):
            continue
        floating = leaf.tensor.dtype.is_floating_point or leaf.tensor.dtype.is_complex
        flags.append(floating and (leaf.spec.requires_grad or framework == "mindspore"))
    return flags


@dataclass
class Results:
    """The outputs of the runs of one call, on the CPU."""

    device: Nested
    bench: Nested
    reference: Nested | None
    inputs: Inputs


def step_for(direction: str, inputs: Inputs, framework: str) -> Callable[[Side], Nested]:
    """What running the call means on any side: its forward, or its forward and the
    backpropagation of the incoming gradients into the inputs that required grad."""
    if direction == "forward":
        return lambda run: run.forward(inputs)
    flags = needs_grad(inputs, framework)
    if not any(flags):
        raise CallSkip("no floating input required grad when dumped: nothing to backpropagate to")
    return lambda run: run.backward(inputs, flags)


@overload
def evaluate(run: Side, direction: Literal["backward"], inputs: Inputs, framework: str) -> Gradients | None: ...
@overload
def evaluate(run: Side, direction: str, inputs: Inputs, framework: str) -> Nested | None: ...
def evaluate(run: Side, direction: str, inputs: Inputs, framework: str) -> Nested | None:
    """One more evaluation of the call on a side (a re-judgement's: the terms, the
    bench saving in D, exploration's bounds), None where it fails: the verdict then
    stands without it."""
    try:
        return step_for(direction, inputs, framework)(run)
    except Exception:  # noqa: BLE001 - any failure: no extra evidence
        return None


@dataclass(frozen=True)
class Sides:
    """The sides one call runs on (a framework's `runs`, or offline the dump's own)."""

    device: Side
    bench: Side
    reference: Side | None  # None: no independent reference


def replay(direction: str, api: Api, inputs: Inputs, sides: Sides, framework: str) -> Results:
    """Run the call on every side. The bench raising is a skip (no verdict possible);
    then the device raising is the call's error."""
    step = step_for(direction, inputs, framework)
    device_error: BaseException | None = None
    try:
        device_out = step(sides.device)
    except (CallSkip, CallError):  # the call's own data (offline, the dumped outputs): not the device's failure
        raise
    except Exception as exc:  # noqa: BLE001 - the device failing is the finding, reported after the bench
        device_error, device_out = exc, None
    if api.reveal is not None and device_error is None:
        inputs = api.reveal(inputs, device_out, direction)
        step = step_for(direction, inputs, framework)
    try:
        bench_out = step(sides.bench)
    except CallSkip:
        raise
    except Exception as exc:
        raise CallSkip(f"the bench cannot run this call: {type(exc).__name__}: {_first_line(exc)}") from exc
    if device_error is not None:
        raise DeviceFailed(device_error)
    reference_out = None
    if sides.reference is not None:
        try:
            reference_out = step(sides.reference)
        except Exception:  # noqa: BLE001 - no reference: the standards fall back to their single-run rule
            reference_out = None
    return Results(device_out, bench_out, reference_out, inputs)


class DeviceFailed(Exception):
    """The device under test raised where the bench did not."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the device raised {type(cause).__name__}: {_first_line(cause)}")
        self.cause = cause


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:500] if lines else ""
