"""Turn a recorded value of dump.json into the Python object the call receives.

One decoder per `"type"` in a table: a newcomer adds a value type in one place. An
unknown type skips that call only, with the type named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any, TypeAlias

import numpy as np
import torch

from pytest_msprobe.dump.index import Json, Record
from pytest_msprobe.dump.tensors import (
    TensorSpec,
    check_size,
    generate_tensor,
    load_tensor,
    seed_for,
    tensor_spec,
    torch_dtype,
)
from pytest_msprobe.errors import CallError, CallSkip


class Carried:
    """A leaf a later stage adds to a call's arguments for its own bench function to read
    (run/dropout.py's scaling constants): every walk over the arguments passes it on
    untouched, as it passes any leaf it does not convert."""


@dataclass(frozen=True)
class RecordedDevice:
    """A `device=` argument: replaced by the device under test when the call runs."""

    recorded: str


#: a decoded value, what a replay passes (after placement) and returns, and what the
#: judging stage (judge/) reads of a side's outputs: a tensor (or a numpy array where
#: pair_leaves gives one), a Python or numpy scalar, a string, None, a dtype, device,
#: memory format, slice or Ellipsis, a recorded device (before placement), a carried leaf,
#: or a list/tuple/dict of them, as the API takes or returns
Nested: TypeAlias = (
    torch.Tensor
    | np.ndarray[Any, np.dtype[Any]]
    | np.generic
    | int
    | float
    | complex
    | str
    | None
    | slice
    | EllipsisType
    | torch.dtype
    | torch.device
    | torch.memory_format
    | RecordedDevice
    | Carried
    | list["Nested"]
    | tuple["Nested", ...]
    | dict[str, "Nested"]
)


@dataclass
class TensorLeaf:
    path: str
    spec: TensorSpec
    tensor: torch.Tensor
    origin: str  # "file <name>" or "generated (seed N)"


@dataclass
class DecodeContext:
    """What decoding one call needs: where tensors are, whether to generate them,
    the call's identity for seeds, and the size limit."""

    tensor_dir: Path
    task: str
    call: str
    max_elements: int
    leaves: list[TensorLeaf] = field(default_factory=list)
    # data_name -> (tensor, origin): tensors made in memory (judge/explore/search.py's inputs),
    # used instead of files of that name
    provided: dict[str, tuple[torch.Tensor, str]] = field(default_factory=dict)

    def tensor(self, value: Record, path: str) -> torch.Tensor:
        where = f"{self.call} {path}"
        spec = tensor_spec(value, where)
        check_size(spec, where, self.max_elements)
        if spec.data_name in self.provided:
            tensor, origin = self.provided[spec.data_name]
        elif self.task == "tensor" and spec.data_name:
            tensor, origin = load_tensor(self.tensor_dir, spec, where), f"file {spec.data_name}"
        else:
            seed = seed_for(self.call, path)
            tensor, origin = generate_tensor(spec, seed, where), f"generated from statistics (seed {seed})"
        self.leaves.append(TensorLeaf(path, spec, tensor, origin))
        return tensor


def decode(value: Json, ctx: DecodeContext, path: str) -> Nested:
    """The Python object for one recorded value (lists and dicts recurse)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [decode(item, ctx, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, dict):
        raise CallError(
            f"{ctx.call} {path}: a bare {type(value).__name__} {value!r} where a recorded value was expected"
        )
    kind = value.get("type")
    if kind is None:
        return {key: decode(item, ctx, f"{path}[{key!r}]") for key, item in value.items()}
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        if isinstance(kind, str) and kind.startswith("numpy."):
            return _numpy_scalar(value, ctx, path)
        raise CallSkip(f"{ctx.call} {path}: unsupported value type {kind!r}")
    return decoder(value, ctx, path)


def _plain(expected: tuple[type[int | float | bool | str], ...]) -> Callable[[Record, DecodeContext, str], Nested]:
    def decode_plain(value: Record, ctx: DecodeContext, path: str) -> Nested:
        item = value.get("value")
        if not isinstance(item, expected) or (bool not in expected and isinstance(item, bool)):
            raise CallError(f"{ctx.call} {path}: {value.get('type')} value {item!r} is not a {expected[0].__name__}")
        return float(item) if expected[0] is float and isinstance(item, (int, float)) else item

    return decode_plain


def _slice(value: Record, ctx: DecodeContext, path: str) -> slice:
    bounds = value.get("value")
    if not (
        isinstance(bounds, list)
        and len(bounds) == 3
        and all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds)
    ):
        raise CallError(f"{ctx.call} {path}: slice value {bounds!r} is not [start, stop, step]")
    return slice(*bounds)


def _size(value: Record, ctx: DecodeContext, path: str) -> torch.Size:
    dims = value.get("value")
    if not (isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in dims)):
        raise CallError(f"{ctx.call} {path}: torch.Size value {dims!r} is not a list of integers")
    return torch.Size(dims)


def _dtype(value: Record, ctx: DecodeContext, path: str) -> torch.dtype:
    return torch_dtype(value.get("value"))


def _device(value: Record, ctx: DecodeContext, path: str) -> RecordedDevice:
    return RecordedDevice(str(value.get("value")))


MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}


def _memory_format(value: Record, ctx: DecodeContext, path: str) -> torch.memory_format:
    name = str(value.get("format", value.get("value", ""))).removeprefix("torch.")
    if name not in MEMORY_FORMATS:
        raise CallSkip(f"{ctx.call} {path}: unknown memory format {name!r}")
    return MEMORY_FORMATS[name]


def _process_group(value: Record, ctx: DecodeContext, path: str) -> Nested:
    raise CallSkip(f"{ctx.call} {path}: takes a process group (communication cannot be replayed in one process)")


def _ellipsis(value: Record, ctx: DecodeContext, path: str) -> Nested:
    return Ellipsis


def _tensor(value: Record, ctx: DecodeContext, path: str) -> torch.Tensor:
    return ctx.tensor(value, path)


NUMPY_SCALARS = {
    name: getattr(np, name)
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool_")
}


def _numpy_scalar(value: Record, ctx: DecodeContext, path: str) -> Nested:
    kind = value["type"].removeprefix("numpy.")
    maker = NUMPY_SCALARS.get(kind)
    item = value.get("value")
    if maker is None or not isinstance(item, (int, float, bool)):
        raise CallSkip(f"{ctx.call} {path}: unsupported value type {value['type']!r} ({item!r})")
    scalar: np.generic = maker(item)
    return scalar


def _mindspore_dtype(value: Record, ctx: DecodeContext, path: str) -> torch.dtype:
    return torch_dtype(str(value.get("value")))


# The "type"s of a recorded tensor.
TENSOR_TYPES = ("torch.Tensor", "mindspore.Tensor", "torch.nn.parameter.Parameter", "mindspore.Parameter")

_DECODERS: dict[str, Callable[[Record, DecodeContext, str], Nested]] = {
    **{kind: _tensor for kind in TENSOR_TYPES},
    "int": _plain((int,)),
    "float": _plain((float, int)),
    "bool": _plain((bool,)),
    "str": _plain((str,)),
    "slice": _slice,
    "ellipsis": _ellipsis,
    "torch.Size": _size,
    "torch.dtype": _dtype,
    "mindspore.dtype": _mindspore_dtype,
    "torch.device": _device,
    "torch.memory_format": _memory_format,
    "torch.ProcessGroup": _process_group,
    "ProcessGroup": _process_group,
}
