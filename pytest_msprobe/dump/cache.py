"""The compact index cache: a dump.json is parsed once; every later collection (each
xdist worker, each rerun, a replaced worker) reads a small .npz of names, byte spans
and element counts instead of scanning hundreds of MB of JSON.

The cache lives under the out folder (`<--msprobe-out>/.msprobe-index/`), one file
per dump, and is used only while the dump's size, mtime and SHA-256 are those it was
made from. It holds arrays and a JSON header only: loaded with allow_pickle=False,
it can never run code, whoever wrote it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import DIRECTIONS, DumpIndex, Record, read_index
from pytest_msprobe.errors import DumpError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_msprobe.standards.dtypes import Array

CACHE_FOLDER = ".msprobe-index"
FORMAT = 4  # bump when the arrays or the header change meaning
# DumpIndex's columns and their types: a cache holds them as they are. numpy is imported
# where arrays are read or written: the xdist controller checks a cache by its header
# (read without numpy) and sums a dump up from it (cached_summary).
COLUMNS = {"api": "int32", "number": "int64", "backward": "bool", "start": "int64", "end": "int64", "numel": "int64"}
HEADER_MEMBER = "header.npy"  # the header's bytes, as np.savez stores an array named "header"


def cache_file(folder: Path, dump: Path) -> Path:
    """One file per dump path: ranks of one step (same file name) do not collide."""
    tag = hashlib.sha256(str(dump.resolve()).encode()).hexdigest()[:16]
    return folder / f"{dump.parent.name}-{tag}.npz"


def dump_key(dump: Path) -> dict[str, object]:
    """What identifies a dump's content: size and mtime (cheap) and its SHA-256 (so a
    file rewritten within the mtime's resolution is not mistaken for the old one)."""
    stat = dump.stat()
    digest = hashlib.sha256()  # hashlib.file_digest needs Python 3.11
    with open(dump, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def load_index(dump: Path, folder: Path) -> DumpIndex:
    """The dump's index from its cache when the cache matches the dump, else parsed
    (and cached for next time). Raises DumpError as dump.read_index does."""
    try:
        key = dump_key(dump)
    except OSError:
        return read_index(dump)  # which says what is wrong with the file
    cached = _read(cache_file(folder, dump), dump, key)
    if cached is not None:
        return cached
    index = read_index(dump)
    _write(cache_file(folder, dump), index, key)
    return index


def ensure_cached(dump: Path, folder: Path) -> None:
    """Parse and cache the dump unless its cache is current; the xdist controller calls
    this before starting workers, so that they all load the cache instead of each
    parsing the dump. A broken dump is left to collection, which reports it."""
    if _stored_current_header(dump, folder) is not None:
        return
    with contextlib.suppress(DumpError):  # each worker's collection reports it
        load_index(dump, folder)


@dataclass(frozen=True)
class DumpSummary:
    """What a dump's cache says of it without its columns: what a summary line needs."""

    path: Path
    calls: int
    task: str
    framework: str
    modules: int
    skipped_names: list[str]

    def __len__(self) -> int:
        return self.calls


def cached_summary(dump: Path, folder: Path) -> DumpSummary | None:
    """The dump as its current cache sums it up (no numpy, no parse); None without one."""
    header = _stored_current_header(dump, folder)
    if header is None:
        return None
    return DumpSummary(
        dump,
        int(header["calls"]),
        header["task"],
        header["framework"],
        int(header["modules"]),
        list(header["skipped_names"]),
    )


def _stored_current_header(dump: Path, folder: Path) -> Record | None:
    """The cache's header if the cache is current, read without numpy: np.savez stores
    it as header.npy, a .npy preamble (magic, version, a length-prefixed description)
    and then the JSON's bytes."""
    try:
        key = dump_key(dump)
        with zipfile.ZipFile(cache_file(folder, dump)) as archive:
            raw = archive.read(HEADER_MEMBER)
        if not raw.startswith(b"\x93NUMPY"):
            return None
        width = 2 if raw[6] == 1 else 4  # the description's length field: 2 bytes in .npy 1.0, 4 after
        start = 8 + width + int.from_bytes(raw[8 : 8 + width], "little")
        header = json.loads(raw[start:].decode("utf-8"))
    except (OSError, ValueError, KeyError, IndexError, UnicodeDecodeError, zipfile.BadZipFile):
        return None
    return header if isinstance(header, dict) and header.get("format") == FORMAT and header.get("key") == key else None


def _read(path: Path, dump: Path, key: dict[str, object]) -> DumpIndex | None:
    """None when there is no usable cache (missing, stale, another format, damaged)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as arrays:
            header = _current_header(arrays, key)
            if header is None:
                return None
            columns = {name: arrays[name] for name in COLUMNS}
        apis = [(str(api_type), str(api_name)) for api_type, api_name in header["apis"]]
        if len({len(column) for column in columns.values()}) != 1 or (columns["api"] < 0).any():
            return None  # damaged: a short column, or an api that is not in the header
        prefixes = [f"{api_type}.{api_name}." for api_type, api_name in apis]
        suffixes = tuple(f".{direction}" for direction in DIRECTIONS)
        names = [
            f"{prefixes[api]}{number}{suffixes[backward]}"
            for api, number, backward in zip(
                columns["api"].tolist(), columns["number"].tolist(), columns["backward"].tolist(), strict=True
            )
        ]
    except (OSError, ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError, zipfile.BadZipFile):
        return None
    return DumpIndex(
        path=dump,
        task=header["task"],
        level=header["level"],
        framework=header["framework"],
        names=names,
        apis=apis,
        modules=header["modules"],
        skipped_names=header["skipped_names"],
        **{
            name: column.astype(dtype, copy=False)
            for (name, column), dtype in zip(columns.items(), COLUMNS.values(), strict=True)
        },
    )


def _current_header(arrays: Mapping[str, Array], key: dict[str, object]) -> Record | None:
    """The cache's header if it was written by this format for this very dump."""
    header = json.loads(arrays["header"].tobytes().decode("utf-8"))
    return header if header.get("format") == FORMAT and header.get("key") == key else None


def _write(path: Path, index: DumpIndex, key: dict[str, object]) -> None:
    """Written to a temporary file and renamed, so that workers collecting at the same
    time see the old cache, none, or the whole new one. A folder that cannot be written
    only costs the next collection a parse."""
    import numpy as np

    header = {
        "format": FORMAT,
        "key": key,
        "dump": str(index.path),
        "task": index.task,
        "level": index.level,
        "framework": index.framework,
        "calls": len(index),
        "modules": index.modules,
        "skipped_names": index.skipped_names,
        "apis": index.apis,
    }
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
        **{name: getattr(index, name) for name in COLUMNS},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **arrays)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
