"""Which function a dumped call name stands for, per api type: explicit tables only.

dump.json is untrusted, so a name is looked up in `api_tables/pytorch.toml` (pure
tensor operations) before anything is fetched from torch; nothing is ever evaluated.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import CallName
from pytest_msprobe.errors import CallSkip
from pytest_msprobe.private_apis import torch_vf

if TYPE_CHECKING:
    from types import ModuleType

    import torch

    from pytest_msprobe.dump.index import Json
    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.dropout import CallInputs, Reveal

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Api:
    """The functions one call runs: on the device under test and on the bench."""

    name: str
    device_fn: Callable[..., Nested]
    bench_fn: Callable[..., Nested]
    in_place: bool
    raise_bench: bool  # False where the bench must keep the device dtype (type_as)
    # what the device's result shows the other sides (a dropout's mask: run/dropout.py):
    # (inputs, device result, direction) -> the inputs the bench and the reference run on
    reveal: Reveal | None = None
    # the bench in a raised precision where it differs from bench_fn, which also reruns the
    # kernel in the device's dtype (offline, layouts, a reference run): gelu's erfc form
    raised_fn: Callable[..., Nested] | None = None

    @property
    def raised_bench_fn(self) -> Callable[..., Nested]:
        return self.bench_fn if self.raised_fn is None else self.raised_fn


@functools.cache
def _pytorch_toml() -> dict[str, Json]:
    return tomllib.loads(
        importlib.resources.files("pytest_msprobe.run").joinpath("api_tables/pytorch.toml").read_text("utf-8")
    )


@functools.cache
def pytorch_table() -> dict[str, frozenset[str]]:
    return {section: frozenset(body["names"]) for section, body in _pytorch_toml().items() if "names" in body}


@functools.cache
def terms_table() -> dict[str, frozenset[str]]:
    """direction -> the APIs whose terms' magnitudes judge/verdict/terms.py can measure."""
    terms = _pytorch_toml()["terms"]
    return {
        "forward": frozenset(terms["forward"]),
        "backward": frozenset(terms["forward"]) | frozenset(terms["backward"]),
    }


@dataclass(frozen=True)
class DropoutKind:
    """How a dropout API draws (run/dropout.py): the [dropout] table's row."""

    unit_dims: int | None  # the trailing dimensions one entry of its mask covers; None: all after the channel
    alpha: bool  # SELU's alpha dropout: kept elements a x + b, dropped ones a constant
    training_default: bool  # `training` where the call does not give it

    def units(self, rank: int) -> int:
        return max(rank - 2, 0) if self.unit_dims is None else self.unit_dims


@functools.cache
def dropout_table() -> dict[str, DropoutKind]:
    """dropout API -> how it draws (run/dropout.py)."""
    table = _pytorch_toml()["dropout"]
    return {
        name: DropoutKind(
            units if isinstance(units, int) else None,
            name in table["alpha"],
            bool(table["training_default"].get(name, True)),
        )
        for name, units in table["unit_dims"].items()
    }


@functools.cache
def summed_backward_table() -> frozenset[str]:
    """The APIs whose backward may sum several incoming values into one element (judge/verdict/summed.py)."""
    return frozenset(_pytorch_toml()["summed_backward"]["names"])


@functools.cache
def layout_sensitive_apis() -> frozenset[str]:
    """The APIs whose CPU kernels round differently on a channels_last tensor (judge/offline/layouts.py)."""
    return frozenset(_pytorch_toml()["layouts"]["names"])


@functools.cache
def fixed_shape_apis() -> frozenset[str]:
    """The APIs exploration never resizes (the [explore] table: kernels that crash on sizes that disagree)."""
    return frozenset(_pytorch_toml()["explore"]["fixed_shapes"])


@functools.cache
def summing_apis(intermediate: str) -> frozenset[str]:
    """The APIs whose definition computes an intermediate of their inputs (`sums`,
    `squares`, `centred`, `shifted`, `shifted_gradient`, `products`, `scores`): the [explore] table."""
    return frozenset(_pytorch_toml()["explore"][intermediate])


@functools.cache
def paired_apis() -> frozenset[str]:
    """The APIs whose definition takes the angle or the difference of their first two
    floating arguments (the [explore] table's `angles`): exploration moves the second
    near the first (judge/explore/neighbourhood.py near_variants)."""
    return frozenset(_pytorch_toml()["explore"]["angles"])


@functools.cache
def reduce_rules() -> dict[str, str]:
    """API -> the rule of its axes a reduction may cut (the [reduce] table; judge/reduce/reduction.py AXIS_RULES)."""
    return {api: rule for rule, apis in _pytorch_toml()["reduce"].items() for api in apis}


def normed_arguments(api_name: str) -> tuple[int, ...]:
    """The positions of the arguments whose norm `api_name` divides by (the [explore.norms]
    table; none where it divides by none)."""
    return tuple(_pytorch_toml()["explore"]["norms"].get(api_name, ()))


def is_in_place(api_name: str) -> bool:
    if api_name.startswith("__") and api_name.endswith("__"):
        return api_name.startswith("__i") and api_name not in ("__invert__", "__index__", "__int__")
    return api_name.endswith("_") and not api_name.startswith("_")


def _namespace(module_path: str) -> Callable[[], ModuleType]:
    def load() -> ModuleType:
        return importlib.import_module(module_path)

    return load


def _torch_attr(section: str, owner: Callable[[], object]) -> Callable[[str], Callable[..., Nested]]:
    def resolve(api_name: str) -> Callable[..., Nested]:
        if api_name not in pytorch_table()[section]:
            raise CallSkip(f"{section}.{api_name} is not in the replay table of {section} APIs")
        function: Callable[..., Nested] | None = getattr(owner(), api_name, None)
        if not callable(function):
            raise CallSkip(f"{section}.{api_name} does not exist in this torch version")
        return function

    return resolve


def _tensor_owner() -> type[torch.Tensor]:
    import torch

    return torch.Tensor


def _aten(api_name: str) -> Callable[..., Nested]:
    """`Aten.add.Tensor` names an overload; torch.ops.aten holds only operators."""
    import torch

    parts = api_name.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
        raise CallSkip(f"Aten.{api_name} is not an aten operator name")
    try:
        op: Callable[..., Nested] = getattr(torch.ops.aten, parts[0])
        overload: Callable[..., Nested] = getattr(op, parts[1]) if len(parts) == 2 else op
        return overload
    except (AttributeError, RuntimeError):
        raise CallSkip(f"Aten.{api_name} does not exist in this torch version") from None


def _refuse_distributed(api_name: str) -> Callable[..., Nested]:
    raise CallSkip(f"Distributed.{api_name} is communication between processes: it cannot be replayed in one")


# api type of a PyTorch dump -> how its names resolve to a torch function.
PYTORCH_RESOLVERS: dict[str, Callable[[str], Callable[..., Nested]]] = {
    "Functional": _torch_attr("Functional", _namespace("torch.nn.functional")),
    "Torch": _torch_attr("Torch", _namespace("torch")),
    "Tensor": _torch_attr("Tensor", _tensor_owner),
    "VF": _torch_attr("VF", torch_vf),
    "Aten": _aten,
    "Distributed": _refuse_distributed,
}


def resolve_pytorch(name: CallName, npu_ops: Callable[[str], Callable[..., Nested] | None] | None) -> Api:
    """The device and bench functions of a PyTorch call.

    `npu_ops` finds a torch_npu operator on the device under test (None when the
    device is not an NPU): NPU calls then run there and on the bench_functions
    reference; elsewhere the reference stands in on the device too.
    """
    api_name = name.api_name
    if api_name in pytorch_table()["random"]:
        raise CallSkip(
            f"{name.api_type}.{api_name} draws random numbers the dump does not record: its output cannot be compared element by element"
        )
    raise_bench = api_name not in pytorch_table()["not_raised"]
    if name.api_type == "NPU":
        return _resolve_npu(api_name, npu_ops, raise_bench)
    resolver = PYTORCH_RESOLVERS.get(name.api_type)
    if resolver is None:
        raise CallSkip(
            f"api type {name.api_type!r} is not known to PyTorch dumps ({', '.join(sorted([*PYTORCH_RESOLVERS, 'NPU']))})"
        )
    function = resolver(api_name)
    if api_name in _pytorch_toml()["writes_first"]["names"]:
        written = writes_first(function)
        return Api(f"{name.api_type}.{api_name}", written, written, is_in_place(api_name), raise_bench)
    random_argument = _pytorch_toml()["random_when"].get(api_name)
    if random_argument is not None:
        function = random_when(function, f"{name.api_type}.{api_name}", *random_argument)
    kind = dropout_table().get(api_name)
    if kind is not None:
        from pytest_msprobe.run import dropout

        drawn = dropout.Drawn(kind)
        return Api(
            f"{name.api_type}.{api_name}",
            function,
            drawn.apply_mask(function),
            is_in_place(api_name),
            raise_bench,
            drawn.reveal,
        )
    eps = DTYPE_EPS.get((name.api_type, api_name))
    reveal = _dtype_eps(*eps) if eps else None
    if (name.api_type, api_name) in (("Functional", "gelu"), ("Torch", "gelu")):
        bench, raised = _exact_gelu(function, ("float64",)), _exact_gelu(function, ("float32", "float64"))
        return Api(
            f"{name.api_type}.{api_name}", function, bench, is_in_place(api_name), raise_bench, reveal, raised_fn=raised
        )
    return Api(f"{name.api_type}.{api_name}", function, function, is_in_place(api_name), raise_bench, reveal)


#: The APIs whose `eps` (argument position, keyword) defaults, when None, to the epsilon of
#: the type they compute in: rms_norm's is float32's for a 16-bit input (torch's opmath
#: type), float32's or float64's for those.
DTYPE_EPS = {("Functional", "rms_norm"): (3, "eps"), ("Torch", "rms_norm"): (3, "eps")}


def _dtype_eps(position: int, keyword: str) -> Reveal:
    """The call's eps=None made explicit for the bench and the reference: raised to
    float64, they would read float64's epsilon (2.2e-16 where the float32 device adds
    1.2e-7), another function wherever mean(x**2) is not far above it (measured: an
    rms_norm row of max |x| 1e-4, 1.7e7 ULP of float32 apart)."""

    def reveal(inputs: CallInputs, device: Nested, direction: str) -> CallInputs:
        import torch

        args, kwargs = list(inputs.args), dict(inputs.kwargs)
        given = args[position] if len(args) > position else kwargs.get(keyword)
        first = args[0] if args else kwargs.get("input")
        if given is not None or not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return inputs
        eps = torch.finfo(torch.promote_types(first.dtype, torch.float32)).eps
        if len(args) > position:
            args[position] = eps
        else:
            kwargs[keyword] = eps
        told = copy.copy(inputs)
        told.args, told.kwargs = args, kwargs
        return told

    return reveal


def _exact_gelu(gelu: Callable[..., Nested], dtypes: tuple[str, ...]) -> Callable[..., Nested]:
    """gelu in `dtypes` (torch's names) as 0.5 x erfc(-x / sqrt 2). torch computes 0.5 x (1 + erf(x /
    sqrt 2)) in every dtype, whose sum cancels in the left tail (pytorch/pytorch#187806):
    in float64 it is 0 from about x = -8.3 on, where float32's exact gelu is still a
    normal number, so a bench computed that way would call a correct float32 kernel wrong
    there; in float32, the raised bench of bfloat16 and float16 calls, from about -5.8 on,
    its gradient's cdf term likewise (a bfloat16 gelu backward at x ~ -5.5: that bench 8
    ULP of bfloat16 off, the device 5). A float32 rerun of the kernel itself (offline,
    layouts, a reference run) stays torch's. The tanh approximation and the other dtypes
    are torch's own."""

    def bench(input: Nested, approximate: str = "none") -> Nested:
        import torch

        if (
            approximate != "none"
            or not isinstance(input, torch.Tensor)
            or str(input.dtype).removeprefix("torch.") not in dtypes
        ):
            return gelu(input, approximate=approximate)
        exact: torch.Tensor = 0.5 * input * torch.special.erfc(-input * 0.5**0.5)
        return exact

    return bench


def random_when(function: Callable[..., Nested], label: str, position: int, keyword: str) -> Callable[..., Nested]:
    """The call, which skips where its argument `keyword` (or `position`) is nonzero: a
    random draw inside the call that its output does not reveal (attention's dropout_p)."""

    def run(*args: Nested, **kwargs: Nested) -> Nested:
        value = args[position] if len(args) > position else kwargs.get(keyword)
        if value:
            raise CallSkip(
                f"{label} with {keyword}={value!r} draws random numbers the dump does not record "
                "(its dropout is inside the call, its mask not in any output): it cannot be compared element by element"
            )
        return function(*args, **kwargs)

    return run


def writes_first(function: Callable[..., Nested]) -> Callable[..., Nested]:
    """A call that writes into its first argument and returns nothing (`__setitem__`),
    as one that returns what it wrote: the replay runs it on a copy, and the copy is
    its output. msprobe records an index tuple as a list, so a list that holds a slice,
    an Ellipsis, None or a tensor is read as the tuple (as torch itself reads such a
    list); a list of ints is both `x[a, b]` and `x[[a, b]]` in the dump: the reading
    under which the value fits, and where both fit and write differently, a skip."""

    def run(target: torch.Tensor, index: Nested, value: Nested) -> torch.Tensor:
        readings = _index_readings(index)
        written = []
        for reading in readings:
            copy = target.clone() if len(readings) > 1 else target
            try:
                function(copy, reading, value)
            except (IndexError, RuntimeError, TypeError, ValueError):
                if len(readings) == 1:
                    raise
                continue
            written.append(copy)
        if not written:
            raise CallSkip(f"the index {index!r} writes the value under no reading of the recorded list")
        if any(not bool((other == written[0]).all()) for other in written[1:]):
            raise CallSkip(
                f"the index {index!r} is ambiguous: msprobe records x[a, b] and x[[a, b]] alike, and both readings fit the value"
            )
        return written[0]

    return run


def _index_readings(index: Nested) -> list[Nested]:
    """The indices a recorded index may stand for (writes_first)."""
    import torch

    if not isinstance(index, list):
        return [index]
    if any(item is None or item is Ellipsis or isinstance(item, (slice, torch.Tensor, list)) for item in index):
        return [tuple(index)]
    return [tuple(index), index]


def _resolve_npu(
    api_name: str, npu_ops: Callable[[str], Callable[..., Nested] | None] | None, raise_bench: bool
) -> Api:
    from pytest_msprobe import bench_functions

    if not _IDENTIFIER.match(api_name):
        raise CallSkip(f"NPU.{api_name} is not an operator name")
    reference = bench_functions.get(api_name)
    device_op = npu_ops(api_name) if npu_ops is not None else None
    if reference is None:
        raise CallSkip(
            f"NPU.{api_name} has no CPU reference in bench_functions; register one with "
            "pytest_msprobe.bench_functions.register(name, function) or the "
            "pytest_msprobe_register_bench_functions hook"
        )
    if npu_ops is not None and device_op is None:
        raise CallSkip(f"NPU.{api_name} does not exist in this torch_npu")
    return Api(f"NPU.{api_name}", device_op or reference, reference, is_in_place(api_name), raise_bench)
