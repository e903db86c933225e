"""The compact index cache: a dump.json is parsed once; every later collection (each
xdist worker, each rerun, a replaced worker) reads a small .npz of names, byte spans
and element counts instead of scanning hundreds of MB of JSON.

The cache lives under the out folder (`<--msprobe-out>/.msprobe-index/`), one file
per dump, and is used only while the dump's size, mtime and SHA-256 are those it was
made from. It holds arrays and a JSON header only: loaded with allow_pickle=False,
it can never run code, whoever wrote it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pytest_msprobe import options
from pytest_msprobe.dump import DumpIndex, IndexEntry, parse_call_name, read_index

CACHE_FOLDER = ".msprobe-index"
FORMAT = 1  # bump when the arrays or the header change meaning


def cache_folder(config: pytest.Config) -> Path:
    return Path(config.invocation_params.dir) / options.get(config, "msprobe_out") / CACHE_FOLDER


def cache_file(folder: Path, dump: Path) -> Path:
    """One file per dump path: ranks of one step (same file name) do not collide."""
    tag = hashlib.sha256(str(dump.resolve()).encode()).hexdigest()[:16]
    return folder / f"{dump.parent.name}-{tag}.npz"


def dump_key(dump: Path) -> dict[str, object]:
    """What identifies a dump's content: size and mtime (cheap) and its SHA-256 (so a
    file rewritten within the mtime's resolution is not mistaken for the old one)."""
    stat = dump.stat()
    with open(dump, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}


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


def _read(path: Path, dump: Path, key: dict[str, object]) -> DumpIndex | None:
    """None when there is no usable cache (missing, stale, another format, damaged)."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            header = json.loads(arrays["header"].tobytes().decode("utf-8"))
            if header.get("format") != FORMAT or header.get("key") != key:
                return None
            blob = arrays["names"].tobytes().decode("utf-8")
            name_ends, starts, ends, numels = (arrays[name].tolist() for name in ("name_ends", "starts", "ends", "numel"))
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None
    entries = []
    begin = 0
    for name_end, start, end, numel in zip(name_ends, starts, ends, numels):
        name = parse_call_name(blob[begin:name_end])
        if name is None:  # the cache was not written by this code: parse the dump instead
            return None
        entries.append(IndexEntry(name, start, end, numel))
        begin = name_end
    return DumpIndex(path=dump, task=header["task"], level=header["level"], framework=header["framework"],
                     entries=entries, modules=header["modules"], skipped_names=header["skipped_names"])


def _write(path: Path, index: DumpIndex, key: dict[str, object]) -> None:
    """Written to a temporary file and renamed, so that workers collecting at the same
    time see the old cache, none, or the whole new one. A folder that cannot be written
    only costs the next collection a parse."""
    names = [str(entry.name) for entry in index.entries]
    header = {"format": FORMAT, "key": key, "dump": str(index.path), "task": index.task, "level": index.level,
              "framework": index.framework, "modules": index.modules, "skipped_names": index.skipped_names}
    name_ends = np.cumsum([len(name) for name in names], dtype=np.int64)
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
        "names": np.frombuffer("".join(names).encode("utf-8"), dtype=np.uint8),
        "name_ends": name_ends,  # in characters of the joined names
        "starts": np.fromiter((entry.start for entry in index.entries), dtype=np.int64, count=len(names)),
        "ends": np.fromiter((entry.end for entry in index.entries), dtype=np.int64, count=len(names)),
        "numel": np.fromiter((entry.numel for entry in index.entries), dtype=np.int64, count=len(names)),
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
