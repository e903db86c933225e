"""Pairing nested outputs: walk bench and device together, leaf by leaf.

Like torch.testing's comparison, structures must match exactly: same kind of container
(sequence vs mapping), same length, same keys; leaves must agree in shape and kind of
dtype. Any mismatch is reported with its path ("[0]", "[1]['k']") instead of a leaf.
Leaves are visited depth-first in the device's order (mapping keys in the device's
insertion order), which is the stable "flatten order" of Verdict.outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from .dtypes import DTYPES, Array, dtype_name, is_float_name

if TYPE_CHECKING:
    from .verdict import Status

__all__ = ["Leaf", "Mismatch", "pair_leaves", "to_array"]

_SCALARS = (bool, int, float, complex, np.generic)


@dataclass
class Leaf:
    """A comparable pair: values (real floats as given, torch or numpy; integers as
    numpy) and the original dtypes."""

    path: str
    bench: Array | torch.Tensor
    device: Array | torch.Tensor
    bench_dtype: str
    device_dtype: str


@dataclass
class Mismatch:
    """A place where bench and device cannot be paired; status is "error" or "skip"."""

    path: str
    status: Status
    reason: str
    device_dtype: str = ""
    bench_dtype: str = ""
    shape: tuple[int, ...] = ()


def _is_leaf(x: object) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray) + _SCALARS)


def _from_tensor(x: torch.Tensor) -> tuple[Array | torch.Tensor, str]:
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    name = dtype_name(t.dtype)
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj()).to(torch.float64).numpy(), name
    if t.is_floating_point():
        return t, name  # kept as is: converted lazily (metrics.Pair / fast)
    return t.resolve_neg().numpy(), name


def _from_array(x: object) -> tuple[Array | torch.Tensor, str]:
    """A numpy array, a numpy scalar or anything numpy reads as one."""
    a = np.asarray(x)
    if a.dtype.kind == "c":
        return np.stack([a.real, a.imag], axis=-1).astype(np.float64), a.dtype.name
    return a, a.dtype.name


#: the kinds of leaf to_array converts, tested in this order (bool before int: a bool is
#: an int; numpy's float64 is a float); anything else is read by numpy (_from_array). Any:
#: each row's converter takes the kind its row tests
_LEAF_KINDS: tuple[tuple[type, Callable[[Any], tuple[Array | torch.Tensor, str]]], ...] = (
    (torch.Tensor, _from_tensor),
    (bool, lambda x: (np.asarray(x, dtype=np.bool_), "bool")),
    (int, lambda x: (np.asarray(x, dtype=np.int64), "int64")),
    (float, lambda x: (np.asarray(x, dtype=np.float64), "float64")),
    (complex, lambda x: (np.asarray([x.real, x.imag], dtype=np.float64), "complex128")),
)


def to_array(x: object) -> tuple[Array | torch.Tensor, str]:
    """(values, dtype name): real floats are returned as they are (a torch tensor or a
    numpy array, converted to float64 only when a standard reads them), ints/bools as
    exact numpy arrays.

    Complex values are compared as their real and imaginary parts (a trailing axis of 2).
    """
    for kind, convert in _LEAF_KINDS:
        if isinstance(x, kind):
            return convert(x)
    return _from_array(x)


def _kind(name: str) -> str:
    if name == "bool":
        return "bool"
    if name.startswith("complex"):
        return "complex"
    if is_float_name(name):
        return "float"
    return "integer"


def _bits(name: str) -> int:
    name = {"complex64": "float32", "complex128": "float64", "complex32": "float16"}.get(name, name)
    return DTYPES[name].mantissa_bits if name in DTYPES else 0


def _leaf(path: str, bench: object, device: object, any_precision: bool = False) -> Leaf | Mismatch:
    b, bname = to_array(bench)
    d, dname = to_array(device)
    where = path or "output"
    if _kind(bname) != _kind(dname):
        return Mismatch(
            path, "error", f"{where}: dtype mismatch: device {dname}, bench {bname}", dname, bname, tuple(d.shape)
        )
    if not any_precision and _kind(dname) in ("float", "complex") and _bits(bname) < _bits(dname):
        return Mismatch(
            path,
            "error",
            f"{where}: bench dtype {bname} is narrower than the device's {dname}",
            dname,
            bname,
            tuple(d.shape),
        )
    if b.shape != d.shape:
        return Mismatch(
            path,
            "error",
            f"{where}: shape mismatch: device {tuple(d.shape)}, bench {tuple(b.shape)}",
            dname,
            bname,
            tuple(d.shape),
        )
    return Leaf(path, b, d, bname, dname)


#: a row's pairing: the leaf or mismatch it is, or the walk into a container's items
_Pairing = Callable[[object, object, str, bool], Iterable[Leaf | Mismatch]]


def _nones(bench: object, device: object, path: str, any_precision: bool) -> Iterable[Mismatch]:
    where = path or "output"
    if bench is None and device is None:
        return (Mismatch(path, "skip", f"{where}: None on both sides"),)
    side = "bench" if bench is None else "device"
    return (Mismatch(path, "error", f"{where}: None on the {side} side only"),)


def _leaves(bench: object, device: object, path: str, any_precision: bool) -> Iterable[Leaf | Mismatch]:
    return (_leaf(path, bench, device, any_precision),)


def _mappings(bench: object, device: object, path: str, any_precision: bool) -> Iterator[Leaf | Mismatch]:
    bench, device = cast("Mapping[object, object]", bench), cast("Mapping[object, object]", device)  # its row's test
    dkeys, bkeys = list(device.keys()), set(bench.keys())
    if set(dkeys) != bkeys:
        missing = sorted(map(repr, bkeys - set(dkeys)))
        extra = sorted(map(repr, set(dkeys) - bkeys))
        yield Mismatch(
            path,
            "error",
            f"{path or 'output'}: keys differ: missing on the device {missing}, extra on the device {extra}",
        )
        return
    for key in dkeys:
        yield from pair_leaves(bench[key], device[key], f"{path}[{key!r}]", any_precision)


def _sequences(bench: object, device: object, path: str, any_precision: bool) -> Iterator[Leaf | Mismatch]:
    bench, device = cast("Sequence[object]", bench), cast("Sequence[object]", device)  # its row's test
    if len(device) != len(bench):
        yield Mismatch(path, "error", f"{path or 'output'}: length mismatch: device {len(device)}, bench {len(bench)}")
        return
    for i, (b, d) in enumerate(zip(bench, device, strict=True)):
        yield from pair_leaves(b, d, f"{path}[{i}]", any_precision)


def _structures(bench: object, device: object, path: str, any_precision: bool) -> Iterable[Mismatch]:
    return (
        Mismatch(
            path,
            "error",
            f"{path or 'output'}: structure mismatch: device {type(device).__name__}, bench {type(bench).__name__}",
        ),
    )


def _non_numeric(bench: object, device: object, path: str, any_precision: bool) -> Iterable[Mismatch]:
    """Not numeric (str, dtype, device, slice, ...): equality or nothing."""
    where = path or "output"
    try:
        equal = bool(device == bench)
    except Exception:  # noqa: BLE001 - any odd __eq__
        equal = False
    if equal:
        return (
            Mismatch(
                path, "skip", f"{where}: non-numeric output {type(device).__name__} {device!r}, equal on both sides"
            ),
        )
    return (Mismatch(path, "error", f"{where}: non-numeric output differs: device {device!r}, bench {bench!r}"),)


def _is_sequence(x: object) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))


def _kinds_differ(bench: object, device: object) -> bool:
    """One side numeric or a container where the other is not its like (the rows
    before have taken every matching pair); two strings are compared as values."""
    either = (
        _is_leaf(device)
        or _is_leaf(bench)
        or isinstance(device, (Mapping, Sequence))
        or isinstance(bench, (Mapping, Sequence))
    )
    return either and not (isinstance(device, (str, bytes)) and isinstance(bench, (str, bytes)))


#: how two nested outputs pair, by what they are, as torch.testing's pair_types: the first
#: row whose test holds pairs them (None before leaves: a None is no leaf; both leaves
#: before containers: a 0-d array is no container); the last row takes any pair
_STRUCTURES: tuple[tuple[Callable[[object, object], bool], _Pairing], ...] = (
    (lambda bench, device: bench is None or device is None, _nones),
    (lambda bench, device: _is_leaf(device) and _is_leaf(bench), _leaves),
    (lambda bench, device: isinstance(device, Mapping) and isinstance(bench, Mapping), _mappings),
    (lambda bench, device: _is_sequence(device) and _is_sequence(bench), _sequences),
    (_kinds_differ, _structures),
    (lambda bench, device: True, _non_numeric),
)


def pair_leaves(
    bench: object, device: object, path: str = "", any_precision: bool = False
) -> Iterator[Leaf | Mismatch]:
    """Yield every leaf pair (or mismatch) of two nested outputs, in flatten order.
    `any_precision`: the device side may be wider than the bench (each element's terms'
    magnitudes, which a caller may give in float64 for a float32 bench)."""
    for applies, pair in _STRUCTURES:
        if applies(bench, device):
            yield from pair(bench, device, path, any_precision)
            return
