"""Tensors of a call: read safely from the dump, or generated from its statistics.

Everything here distrusts the dump: file names are confined to the dump's own
`dump_tensor_data/`, `.pt` files are unpickled with no global but the two a saved
tensor needs (`_load_pt`; anything else goes to `torch.load(weights_only=True)`),
`.npy` files without pickle, and shapes are checked against a size limit before
anything is allocated.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import math
import os
import pickle
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pytest_msprobe.errors import CallError, CallSkip, MissingTensorFile
from pytest_msprobe.private_apis import file_reader, record_storage

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json, Record
    from pytest_msprobe.private_apis import PyTorchFileReader
    from pytest_msprobe.standards.dtypes import Array

# Every dtype spelling a dump may use, PyTorch's and MindSpore's, mapped to torch.
DTYPES: dict[str, torch.dtype] = {
    **{
        f"torch.{name}": getattr(torch, name)
        for name in (
            "float64",
            "float32",
            "float16",
            "bfloat16",
            "int64",
            "int32",
            "int16",
            "int8",
            "uint8",
            "bool",
            "complex64",
            "complex128",
            "float8_e4m3fn",
            "float8_e5m2",
        )
        if hasattr(torch, name)
    },
    "torch.double": torch.float64,
    "torch.float": torch.float32,
    "torch.half": torch.float16,
    "torch.long": torch.int64,
    "torch.int": torch.int32,
    "Float64": torch.float64,
    "Float32": torch.float32,
    "Float16": torch.float16,
    "BFloat16": torch.bfloat16,
    "Int64": torch.int64,
    "Int32": torch.int32,
    "Int16": torch.int16,
    "Int8": torch.int8,
    "UInt8": torch.uint8,
    "Bool": torch.bool,
    "Complex64": torch.complex64,
    "Complex128": torch.complex128,
}

TENSOR_SUFFIXES = (".pt", ".npy")


def torch_dtype(spelling: Json) -> torch.dtype:
    dtype = DTYPES.get(spelling) if isinstance(spelling, str) else None
    if dtype is None:
        raise CallSkip(f"unknown dtype {spelling!r}")
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    """A recorded tensor: what it must look like, and where its data may be."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stats: Record
    data_name: str
    requires_grad: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def tensor_spec(value: Record, where: str) -> TensorSpec:
    shape = value.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise CallError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    data_name = value.get("data_name") or ""
    if not isinstance(data_name, str):
        raise CallError(f"{where}: data_name {data_name!r} is not a string")
    stats = {key: value.get(key) for key in ("Max", "Min", "Mean", "Norm")}
    return TensorSpec(
        torch_dtype(value.get("dtype")), tuple(shape), stats, data_name, bool(value.get("requires_grad", False))
    )


def check_size(spec: TensorSpec, where: str, max_elements: int) -> None:
    if spec.numel > max_elements:
        raise CallSkip(
            f"{where}: shape {list(spec.shape)} has {spec.numel:,} elements, above the limit of "
            f"{max_elements:,} (raise it with --msprobe-max-elements)"
        )


def resolve_data_file(tensor_dir: Path, data_name: str, where: str) -> Path:
    """The file a data_name names, refused unless it lies inside dump_tensor_data/."""
    if not data_name.endswith(TENSOR_SUFFIXES) or "\x00" in data_name:
        raise CallError(f"{where}: data_name {data_name!r} is not a .pt or .npy file name")
    if os.sep not in data_name and not (os.altsep and os.altsep in data_name):
        # The common case, one lstat: a plain file right inside the (resolved) folder.
        candidate = os.path.join(_resolve_folder(str(tensor_dir)), data_name)
        try:
            found = os.lstat(candidate)
        except OSError:
            found = None
        if found is not None and stat.S_ISREG(found.st_mode):
            return Path(candidate)
    root = tensor_dir.resolve()
    path = (tensor_dir / data_name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise CallError(f"{where}: data_name {data_name!r} points outside {tensor_dir}; refused")
    if not path.is_file():
        raise MissingTensorFile(where, data_name, str(tensor_dir))
    return path


def load_tensor(tensor_dir: Path, spec: TensorSpec, where: str) -> torch.Tensor:
    path = resolve_data_file(tensor_dir, spec.data_name, where)
    try:
        loaded = _LOADERS[path.suffix](path, spec)
    except CallError:
        raise
    except Exception as exc:  # a corrupt or hostile file: name it, never crash the run
        raise CallError(f"{where}: cannot load {spec.data_name!r}: {load_failure(exc)}") from exc
    if tuple(loaded.shape) != spec.shape:
        raise CallError(
            f"{where}: {spec.data_name!r} holds shape {list(loaded.shape)}, the dump says {list(spec.shape)}"
        )
    if loaded.dtype != spec.dtype:
        raise CallError(f"{where}: {spec.data_name!r} holds {loaded.dtype}, the dump says {spec.dtype}")
    return loaded


@functools.lru_cache(maxsize=64)
def _resolve_folder(folder: str) -> str:
    return os.path.realpath(folder)


def _load_pt(path: Path, spec: TensorSpec) -> torch.Tensor:
    loaded = _saved_tensor(path)
    if loaded is None:  # not the plain layout of a saved tensor: torch's own safe loader decides
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(loaded, torch.Tensor):
        raise CallError(f"{path.name} holds a {type(loaded).__name__}, not a tensor")
    return loaded.detach()


def _load_npy(path: Path, spec: TensorSpec) -> torch.Tensor:
    array = np.load(path, allow_pickle=False)
    if not isinstance(array, np.ndarray):
        raise CallError(f"{path.name} holds a {type(array).__name__}, not an array")
    tensor = torch.from_numpy(np.require(array, requirements="C"))  # ascontiguousarray would make 0-d arrays 1-d
    if spec.dtype == torch.bfloat16 and tensor.dtype == torch.float32:
        tensor = tensor.to(torch.bfloat16)  # MindSpore saves bfloat16 as float32
    return tensor


_LOADERS = {".pt": _load_pt, ".npy": _load_npy}


# --- .pt files: the tensors msprobe saves, read without torch's Python unpickler --------
#
# torch.save(tensor) writes a zip: data.pkl, a pickle that calls
# torch._utils._rebuild_tensor_v2(<storage>, offset, size, stride, requires_grad,
# OrderedDict()) with the storage as a persistent id ('storage', torch.<Type>Storage,
# key, location, numel), and the storage's bytes in data/<key>. torch.load(
# weights_only=True) reads the pickle with an unpickler written in Python (0.3-0.6 ms a
# file, most of a small call's input decoding). Here torch's own archive reader (what
# torch.load opens the zip with) gives the records, and Python's C unpickler reads the
# pickle, allowed those two globals and nothing else: the rebuild is our own (a view of
# the storage's bytes, no hooks, no metadata) and a storage class is a name that gives a
# dtype, never called. A pickle that names anything else, or a file laid out otherwise,
# is left to torch.load(weights_only=True), which accepts or refuses it with its own
# reason.

_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}


@dataclass(frozen=True)
class _StorageName:
    """A storage class named by a pickle: only its dtype is read from it."""

    dtype: torch.dtype


@dataclass(frozen=True)
class _Storage:
    """A storage's bytes, as a persistent id names them, and their dtype."""

    untyped: torch.UntypedStorage
    dtype: torch.dtype


def _rebuild_tensor(  # noqa: PLR0913  torch's _rebuild_tensor_v2 signature: the unpickler calls it
    storage: object,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    backward_hooks: object,
    metadata: object = None,
) -> torch.Tensor:
    """torch._utils._rebuild_tensor_v2 for a plain tensor: a view of the storage's bytes
    (set_ checks that it lies inside them); hooks or metadata make the file not plain."""
    if not isinstance(storage, _Storage) or backward_hooks or metadata:
        raise _NotPlain("a tensor with hooks or metadata")
    tensor = torch.empty((0,), dtype=storage.dtype).set_(storage.untyped, storage_offset, size, stride)
    tensor.requires_grad = bool(requires_grad)
    return tensor


_GLOBALS: dict[tuple[str, str], object] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): _StorageName(dtype) for name, dtype in _STORAGE_DTYPES.items()},
}


class _NotPlain(Exception):
    """The file is not a plain saved tensor: torch.load decides."""


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, archive: PyTorchFileReader) -> None:
        super().__init__(io.BytesIO(archive.get_record("data.pkl")))
        self.archive = archive

    def find_class(self, module: str, name: str) -> object:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise _NotPlain(f"{module}.{name}")
        return found

    def persistent_load(self, pid: object) -> _Storage:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageName)
            and isinstance(pid[2], str)
            and pid[2].isdigit()
            and type(pid[4]) is int
            and pid[4] >= 0
        ):
            raise _NotPlain(repr(pid)[:80])
        dtype, record = pid[1].dtype, f"data/{pid[2]}"
        size = pid[4] * dtype.itemsize
        if self.archive.get_record_size(record) != size:
            raise _NotPlain(f"{record}: not {pid[4]} elements")
        # torch's stub names a dtype; the reader takes a storage class, as torch.serialization passes it
        storage = self.archive.get_storage_from_record(record, size, torch.UntypedStorage)  # type: ignore[arg-type]
        return _Storage(record_storage(storage), dtype)


def _saved_tensor(path: Path) -> torch.Tensor | None:
    """The tensor a plain torch.save(tensor) file holds; None for any other file."""
    reader = file_reader()
    if reader is None or sys.byteorder != "little":
        return None
    try:
        archive = reader(str(path))
        # has_record: a method of torch's reader that its type stub leaves out
        if archive.has_record("byteorder") and archive.get_record("byteorder") != b"little":  # type: ignore[attr-defined]
            return None
        loaded = _TensorUnpickler(archive).load()
    except Exception:  # noqa: BLE001 - not a plain saved tensor (or not a zip): torch.load says what it is
        return None
    return loaded if type(loaded) is torch.Tensor else None


# Lines of torch.load's message when weights_only=True refuses a file that advise loading
# it unsafely (weights_only=False, allowlisting its globals) or filing an issue: a file of
# an untrusted dump is never loaded that way, so the advice is never relayed.
TORCH_ADVICE = ("weights_only", "trust the source", "trusted source", "file an issue", "documentation of torch.load")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REFUSED = "it is not a plain tensor file (corrupt, or a pickle of something else) and is never loaded unsafely"


def load_failure(exc: BaseException) -> str:
    """Why a tensor file did not load, in one line without terminal escapes: torch's
    own reason where weights_only=True refused the file, without its advice."""
    lines = [line.strip() for line in ANSI_ESCAPE.sub("", str(exc)).splitlines()]
    if not any("Weights only load failed" in line for line in lines):
        first = next((line for line in lines if line), "")
        return f"{type(exc).__name__}: {first[:300]}"
    kept = [
        line.removeprefix("WeightsUnpickler error:").strip()
        for line in lines
        if line and not any(advice in line for advice in TORCH_ADVICE)
    ]
    reason = next((line for line in kept if line), "the unpickler refused it")
    reason = reason.split(". Please use", 1)[0].removesuffix(".")  # the allowlisting advice
    return f"{REFUSED} ({reason[:300]})"


# --- generation from statistics -------------------------------------------------


def seed_for(*parts: str) -> int:
    """A seed that depends only on the names given, so a generated input is the same
    whatever order, worker or selection the call runs in."""
    digest = hashlib.blake2b("\x1f".join(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generate_tensor(spec: TensorSpec, seed: int, where: str) -> torch.Tensor:
    """A tensor of the recorded dtype and shape whose Max/Min are exact and whose
    mean follows the recorded Mean; NaN/inf statistics put NaN/inf in place."""
    generator = np.random.default_rng(seed)
    if spec.numel == 0:
        return torch.empty(spec.shape, dtype=spec.dtype)
    maker = _GENERATORS.get(_dtype_kind(spec.dtype))
    if maker is None:
        raise CallSkip(f"{where}: cannot generate {spec.dtype} tensors from statistics")
    array = maker(spec, generator, where)
    return torch.from_numpy(array.reshape(spec.shape)).to(spec.dtype)


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "int"


def _number(stats: Record, key: str, where: str) -> float | None:
    value = stats.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise CallError(f"{where}: statistic {key}={value!r} is not a number")
    return float(value)


def _generate_float(spec: TensorSpec, generator: np.random.Generator, where: str) -> Array:
    high, low = _number(spec.stats, "Max", where), _number(spec.stats, "Min", where)
    mean = _number(spec.stats, "Mean", where)
    specials = [v for v in (high, low) if v is not None and not math.isfinite(v)]
    high = high if high is not None and math.isfinite(high) else None
    low = low if low is not None and math.isfinite(low) else None
    if high is None and low is None:
        high, low = 1.0, -1.0
    elif high is None or low is None:
        high = low = high if high is not None else low
    assert high is not None and low is not None  # both set above where either was missing
    if low > high:
        raise CallError(f"{where}: statistics Min={low} > Max={high}")
    finfo = torch.finfo(spec.dtype)
    low, high = max(low, finfo.min), min(high, finfo.max)
    unit = generator.random(spec.numel)
    if mean is not None and math.isfinite(mean) and low < mean < high:
        # u**k has mean 1/(k+1): shape the spread so the expected mean is the recorded one.
        share = (mean - low) / (high - low)
        unit = unit ** (1.0 / share - 1.0)
    values = low + (high - low) * unit
    positions = generator.permutation(spec.numel)
    values[positions[0]] = high
    if spec.numel > 1:
        values[positions[1]] = low
    for slot, special in zip(positions[2:], specials, strict=False):
        values[slot] = special
    if specials and spec.numel <= 2:
        values[positions[0]] = specials[0]
    return values


def _generate_int(spec: TensorSpec, generator: np.random.Generator, where: str) -> Array:
    info = torch.iinfo(spec.dtype)
    high, low = _number(spec.stats, "Max", where), _number(spec.stats, "Min", where)
    high = info.max if high is None or not math.isfinite(high) else int(high)
    low = info.min if low is None or not math.isfinite(low) else int(low)
    if low > high:
        raise CallError(f"{where}: statistics Min={low} > Max={high}")
    values = generator.integers(low, high, size=spec.numel, endpoint=True, dtype=np.int64)
    positions = generator.permutation(spec.numel)
    values[positions[0]] = high
    if spec.numel > 1:
        values[positions[1]] = low
    return values


def _generate_bool(spec: TensorSpec, generator: np.random.Generator, where: str) -> Array:
    high, low = spec.stats.get("Max"), spec.stats.get("Min")
    if high is not None and high == low:
        return np.full(spec.numel, bool(high))
    values = generator.random(spec.numel) < 0.5
    positions = generator.permutation(spec.numel)
    values[positions[0]] = True
    if spec.numel > 1:
        values[positions[1]] = False
    return values


_GENERATORS = {"float": _generate_float, "int": _generate_int, "bool": _generate_bool}
