"""How a MindSpore call runs: the MindSpore API on MindSpore's device target, and its
torch twin from `api_tables/mindspore.toml` on the raised-precision CPU bench.

The device under test of a MindSpore dump is MindSpore itself, so `--msprobe-device`
picks MindSpore's device target: cpu -> "CPU", npu -> "Ascend", cuda -> "GPU"; auto
follows the plugin's choice (an NPU where torch_npu works), else takes Ascend when
MindSpore sees one, else the CPU. Calls run in
PyNative mode, op by op, as msprobe's L1 dumps record them. Inputs arrive as torch CPU
tensors and cross to MindSpore through numpy (bfloat16 through float32, since numpy
has no bfloat16); outputs and gradients come back the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import torch

from pytest_msprobe.dump.index import CallName
from pytest_msprobe.errors import CallSkip
from pytest_msprobe.run.apis import Api
from pytest_msprobe.run.devices import Backend
from pytest_msprobe.run.mindspore.tables import INSTALL_HINT, TABLE_FILE, TwinSpec, mindspore_table
from pytest_msprobe.run.replay import Gradients, Inputs, Placement, Run, bench_dtypes, tree_map

if TYPE_CHECKING:
    from types import ModuleType

    from pytest_msprobe.dump.values import Nested
    from pytest_msprobe.run.devices import Backend

#: a MindSpore object (an API function, a tensor, a dtype), or a value as a MindSpore API
#: takes or returns it: one of those, a number, None, or a tuple/dict of them. Any:
#: MindSpore ships no type information (pyproject.toml's mypy settings import it
#: untyped), so its objects are Any statically whatever is written
MsValue: TypeAlias = Any

# --msprobe-device backend -> MindSpore device target.
TARGETS = {"cpu": "CPU", "npu": "Ascend", "cuda": "GPU"}

# Where no torch twin exists MindSpore is its own bench: every float raised to float64.
GOLDEN = {torch.float16: torch.float64, torch.bfloat16: torch.float64, torch.float32: torch.float64}

# torch dtype -> MindSpore dtype attribute (bfloat16 crosses numpy as float32).
MINDSPORE_DTYPES = {
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool_",
}

# What MindSpore raises (a RuntimeError) when its build has no kernel for an operator,
# or none for these dtypes; group 1 names the kernel. Anything else is the call's error.
MISSING_KERNEL = (
    re.compile(r"The kernel (\w+) unregistered"),
    re.compile(r"Create kernelmod for op (\w+) failed"),
)


@functools.cache
def import_mindspore() -> ModuleType:
    """MindSpore, imported on the first MindSpore call only."""
    # MindSpore's C++ log repeats, on stderr, every failure the call's report already names.
    os.environ.setdefault("GLOG_v", "3")
    try:
        import mindspore
    except Exception as exc:  # a broken install raises anything
        raise CallSkip(f"MindSpore cannot be imported ({type(exc).__name__}: {exc}): {INSTALL_HINT}") from exc
    module: ModuleType = mindspore
    return module


@functools.cache
def configure(target: str, device_id: int) -> ModuleType:
    """MindSpore set to run op by op on `target`; once per process, as MindSpore allows."""
    mindspore = import_mindspore()
    try:
        mindspore.set_device(target, device_id)
    except Exception as exc:
        raise CallSkip(f"MindSpore cannot use device target {target}:{device_id}: {type(exc).__name__}: {exc}") from exc
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    return mindspore


def device_target(backend: Backend, request: str = "auto") -> str:
    """MindSpore's own device target: on `auto`, an Ascend MindSpore sees is used even
    where torch_npu is absent (a MindSpore-only Ascend machine), else the backend's."""
    if request == "auto" and backend.name == "cpu" and import_mindspore().hal.is_available("Ascend"):
        return "Ascend"
    return TARGETS[backend.name]


def missing_kernel(exc: BaseException) -> str | None:
    """The kernel MindSpore lacks, when that is why `exc` was raised."""
    if not isinstance(exc, RuntimeError):
        return None
    for pattern in MISSING_KERNEL:
        match = pattern.search(str(exc))
        if match:
            return match.group(1)
    return None


@contextlib.contextmanager
def missing_kernel_is_skip(target: str) -> Iterator[None]:
    try:
        yield
    except RuntimeError as exc:
        kernel = missing_kernel(exc)
        if kernel is None:
            raise
        version = import_mindspore().__version__
        raise CallSkip(
            f"MindSpore {version} has no {kernel} kernel on {target} for these inputs: run on a device target that has one"
        ) from None


# --- the torch twin -----------------------------------------------------------------


@dataclass(frozen=True)
class TorchTwin:
    """A torch function called with MindSpore's arguments translated by the table (judge/verdict/terms.py
    TranslatesArguments: the terms' formulas read the translation)."""

    function: Callable[..., Nested]
    spec: TwinSpec

    def __call__(self, *args: Nested, **kwargs: Nested) -> Nested:
        torch_args, torch_kwargs = self.torch_arguments(list(args), kwargs)
        return self.function(*torch_args, **torch_kwargs)

    def torch_arguments(self, args: list[Nested], kwargs: dict[str, Nested]) -> tuple[list[Nested], dict[str, Nested]]:
        """MindSpore's arguments as the torch function takes them (the same objects: the
        terms' formulas in judge/verdict/terms.py read them by torch's names)."""
        if self.spec.params:
            kwargs = {**dict(zip(self.spec.params[1:], args[1:], strict=False)), **kwargs}
            args = args[:1]
        kwargs = {self.spec.rename.get(key, key): value for key, value in kwargs.items()}
        return args, {**self.spec.defaults, **kwargs}


def torch_function(path: str) -> Callable[..., Nested]:
    """`torch.nn.functional.relu` -> the function (paths come from the table, not the dump)."""
    value: object = torch
    for part in path.split(".")[1:]:
        value = getattr(value, part)
    return cast("Callable[..., Nested]", value)  # the table names torch functions (tables.py reads it)


# --- MindSpore runs -----------------------------------------------------------------


def to_mindspore(mindspore: ModuleType, dtypes: dict[torch.dtype, torch.dtype]) -> Callable[[Nested], MsValue]:
    """A converter of one decoded value to what the MindSpore API takes."""

    def convert(value: Nested) -> MsValue:
        if isinstance(value, torch.Tensor):
            tensor = value.to(dtypes.get(value.dtype, value.dtype))
            array = (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
            return mindspore.Tensor(array, dtype=mindspore_dtype(mindspore, tensor.dtype))
        if isinstance(value, torch.dtype):
            return mindspore_dtype(mindspore, value)
        if isinstance(value, torch.Size):
            return tuple(value)
        return value

    return convert


def mindspore_dtype(mindspore: ModuleType, dtype: torch.dtype) -> object:
    if dtype not in MINDSPORE_DTYPES:
        raise CallSkip(f"dtype {dtype} has no MindSpore counterpart known to the replay")
    return getattr(mindspore, MINDSPORE_DTYPES[dtype])


def to_torch(value: MsValue) -> Nested:
    """MindSpore outputs as torch CPU tensors; reading them waits for the kernels, so a
    kernel's failure is raised here, inside the call."""
    mindspore = import_mindspore()
    if isinstance(value, mindspore.Tensor):
        if value.dtype == mindspore.bfloat16:
            return torch.from_numpy(value.astype(mindspore.float32).asnumpy().copy()).to(torch.bfloat16)
        return torch.from_numpy(value.asnumpy().copy())
    if isinstance(value, (tuple, list)):
        converted = [to_torch(item) for item in value]
        return tuple(converted) if isinstance(value, tuple) else converted
    plain: Nested = value  # a Python scalar, None, or what MindSpore returned as is
    return plain


def _flat(value: MsValue) -> list[MsValue]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flat(part)]
    return [value]


@dataclass
class MindsporeRun:
    """One run of a call through MindSpore, on its configured device target."""

    function: Callable[..., MsValue]
    target: str
    dtypes: dict[torch.dtype, torch.dtype]

    def _convert(self) -> Callable[[Nested], MsValue]:
        leaf = to_mindspore(import_mindspore(), self.dtypes)

        def convert(value: Nested) -> MsValue:
            # dump.json records tuples as lists, and MindSpore wants tuples (permute's dims)
            if isinstance(value, (list, tuple)):
                return tuple(convert(item) for item in value)
            if isinstance(value, dict):
                return {key: convert(item) for key, item in value.items()}
            return leaf(value)

        return convert

    def forward(self, inputs: Inputs) -> Nested:
        convert = self._convert()
        args, kwargs = convert(inputs.args), convert(inputs.kwargs)
        with missing_kernel_is_skip(self.target):
            return to_torch(self.function(*args, **kwargs))

    def backward(self, inputs: Inputs, needs_grad: list[bool]) -> Gradients:
        """MindSpore autodiff (vjp) with the dumped incoming gradients as sens."""
        mindspore = import_mindspore()
        convert = self._convert()
        tree: MsValue = (convert(inputs.args), convert(inputs.kwargs))
        leaves: list[MsValue] = []
        tree_map(lambda item: leaves.append(item) if isinstance(item, mindspore.Tensor) else None, tree)
        wanted = [position for position, flag in enumerate(needs_grad) if flag]
        sens = [None if grad is None else convert(grad) for grad in inputs.grads or []]
        chosen: list[int] = []

        def call(*primals: MsValue) -> tuple[MsValue, ...]:
            substitutes = dict(zip(wanted, primals, strict=False))
            counter = iter(range(len(leaves)))

            def substitute(item: MsValue) -> MsValue:
                return substitutes.get(next(counter), item) if isinstance(item, mindspore.Tensor) else item

            substituted: MsValue = tree_map(substitute, tree)
            args, kwargs = substituted
            outputs = _flat(self.function(*args, **kwargs))
            chosen[:] = _outputs_with_gradients(mindspore, outputs, sens)
            return tuple(outputs[i] for i in chosen)

        with missing_kernel_is_skip(self.target):
            _, pullback = mindspore.vjp(call, *(leaves[i] for i in wanted))
            grads = pullback(tuple(sens[i] for i in chosen))
            # vjp gives a MindSpore tensor per primal: to_torch makes each a torch tensor
            return tuple(
                cast("torch.Tensor", to_torch(grad)) for grad in (grads if isinstance(grads, tuple) else (grads,))
            )


def _outputs_with_gradients(mindspore: ModuleType, outputs: list[MsValue], sens: list[MsValue]) -> list[int]:
    """Positions of the outputs that receive an incoming gradient (as replay pairs them
    for torch: one gradient per forward output, None where it got none)."""
    if len(sens) != len(outputs):
        raise CallSkip(
            f"the dump has {len(sens)} incoming gradients for {len(outputs)} forward outputs; cannot pair them"
        )
    chosen = []
    for position, (output, grad) in enumerate(zip(outputs, sens, strict=False)):
        if grad is None or not isinstance(output, mindspore.Tensor) or not output.is_floating_point():
            continue
        if tuple(grad.shape) != tuple(output.shape):
            raise CallSkip(
                f"incoming gradient {position} has shape {list(grad.shape)}, the output has {list(output.shape)}"
            )
        chosen.append(position)
    if not chosen:
        raise CallSkip("no output of the forward call carries a gradient to backpropagate")
    return chosen


# --- the framework seam (pytest_msprobe.judge.check.call.FRAMEWORKS) ----------------------------


def _mindspore_attribute(owner: str, api_name: str) -> MsValue:
    value = import_mindspore()
    for part in owner.split(".")[1:]:
        value = getattr(value, part)
    return getattr(value, api_name, None)


class RunSettings(Protocol):
    """What a MindSpore run reads of the call's settings (judge.call.Settings)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def device_index(self) -> int: ...

    @property
    def device_request(self) -> str: ...

    @property
    def offline(self) -> bool: ...


class MindsporeReplay:
    """How a MindSpore call runs: MindSpore on its device target; the torch twin on the
    CPU bench at raised precision (MindSpore in float64 where no twin exists) and, off
    the CPU, the twin in the device dtype as an independent reference."""

    # MindSpore's kernels refuse a dimension of size 0 ("the shape of input cannot
    # contain zero", a warning) and return what their output memory held (ReduceSum on
    # the CPU, 2.10): exploration never makes an empty tensor for them.
    smallest_size = 1

    def resolve(self, name: CallName, backend: Backend) -> Api:
        table = mindspore_table()
        label = f"{name.api_type}.{name.api_name}"
        if name.api_type in table.unreplayable:
            raise CallSkip(f"{label}: {table.unreplayable[name.api_type]}")
        if name.api_type not in table.apis:
            known = ", ".join(sorted([*table.apis, *table.unreplayable]))
            raise CallSkip(f"api type {name.api_type!r} is not known to MindSpore dumps ({known})")
        if name.api_name in table.random:
            raise CallSkip(
                f"{label} draws random numbers the dump does not record: its output cannot be compared element by element"
            )
        spec = table.apis[name.api_type].get(name.api_name)
        if spec is None:
            raise CallSkip(
                f"{label} is not in the MindSpore->torch table ({TABLE_FILE}); add it with its torch twin to replay it"
            )
        function = _mindspore_attribute(table.owners[name.api_type], name.api_name)
        if not callable(function):
            raise CallSkip(f"{label} does not exist in MindSpore {import_mindspore().__version__}")
        bench = TorchTwin(torch_function(spec.torch), spec) if spec.torch else function
        return Api(label, function, bench, in_place=False, raise_bench=True)

    def runs(
        self, api: Api, inputs: Inputs, settings: RunSettings
    ) -> tuple[MindsporeRun, MindsporeRun | Run, Run | None]:
        # Offline the device is the dump: MindSpore runs here only as bench or reference, on the CPU.
        target = "CPU" if settings.offline else device_target(settings.backend, settings.device_request)
        configure(target, 0 if settings.offline else settings.device_index)
        device = MindsporeRun(api.device_fn, target, {})
        if not isinstance(api.bench_fn, TorchTwin):
            return device, MindsporeRun(api.bench_fn, target, GOLDEN), None
        cpu = torch.device("cpu")
        bench = Run(api, api.bench_fn, Placement(cpu, bench_dtypes(inputs, api.raise_bench)))
        reference = Run(api, api.bench_fn, Placement(cpu)) if target != "CPU" else None
        return device, bench, reference

    def reference_in_dump_dtype(self, api: Api, settings: RunSettings) -> MindsporeRun:
        """Offline, the reference: MindSpore's own CPU kernel in the dump's dtypes (its
        torch twin would hold a MindSpore kernel to torch's rounding)."""
        configure("CPU", 0)
        return MindsporeRun(api.device_fn, "CPU", {})
