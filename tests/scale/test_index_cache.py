"""The index cache: a dump is parsed once, later collections read the cache, and a
cache that does not match its dump (changed, damaged, foreign) is never used."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pytest_msprobe.dump import cache as index_cache
from pytest_msprobe.dump.index import read_index


def _refuse_to_parse(path: Path) -> None:
    raise AssertionError(f"{path} was parsed again")


def test_a_dump_is_parsed_once(make_dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = make_dump(tmp_path / "dump", 300)
    first = index_cache.load_index(dump, tmp_path / "cache")
    monkeypatch.setattr(index_cache, "read_index", _refuse_to_parse)
    again = index_cache.load_index(dump, tmp_path / "cache")
    assert again.entries == first.entries == read_index(dump).entries
    assert again.names == first.names == read_index(dump).names == [str(entry.name) for entry in again.entries]
    assert (again.task, again.level, again.framework, again.modules) == (
        first.task,
        first.level,
        first.framework,
        first.modules,
    )
    record = again.read_record(again.entries[-1])  # byte spans still point at the records
    assert "input" in record or "input_args" in record


def test_the_cache_holds_arrays_only(make_dump, tmp_path: Path) -> None:
    dump = make_dump(tmp_path / "dump", 20)
    index_cache.load_index(dump, tmp_path / "cache")
    (path,) = (tmp_path / "cache").glob("*.npz")
    with np.load(path, allow_pickle=False) as arrays:  # an object array would raise here
        assert all(arrays[name].dtype != object for name in arrays.files)


def test_a_rewritten_dump_of_the_same_size_and_mtime_is_parsed_again(
    make_dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = make_dump(tmp_path / "dump", 20)
    index_cache.load_index(dump, tmp_path / "cache")
    stat = dump.stat()
    text = dump.read_text()
    dump.write_text(text.replace("Tensor.", "Tensor_", 1).replace("Tensor_", "Tensor.", 1).replace('"L1"', '"L0"'))
    os.utime(dump, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert dump.stat().st_size == stat.st_size
    parsed = []
    monkeypatch.setattr(index_cache, "read_index", lambda path: parsed.append(path) or read_index(path))
    assert index_cache.load_index(dump, tmp_path / "cache").level == "L0"
    assert parsed == [dump]


def test_a_damaged_cache_is_ignored(make_dump, tmp_path: Path) -> None:
    dump = make_dump(tmp_path / "dump", 20)
    index_cache.load_index(dump, tmp_path / "cache")
    (path,) = (tmp_path / "cache").glob("*.npz")
    path.write_bytes(path.read_bytes()[:200])
    assert index_cache.load_index(dump, tmp_path / "cache").entries == read_index(dump).entries


def test_an_unwritable_cache_folder_costs_only_a_parse(make_dump, tmp_path: Path) -> None:
    dump = make_dump(tmp_path / "dump", 20)
    (tmp_path / "file").write_text("")
    assert index_cache.load_index(dump, tmp_path / "file" / "cache").entries == read_index(dump).entries


def test_collection_writes_and_uses_the_cache_under_the_out_folder(pytester: pytest.Pytester, make_dump) -> None:
    make_dump(pytester.path / "dump", 50)
    args = ("--msprobe-dump=dump", "--msprobe-out=results", "--co", "-q", "-p", "no:cacheprovider")
    first = pytester.runpytest(*args)
    first.stdout.fnmatch_lines(["50 tests collected*"])
    (cache,) = (pytester.path / "results" / index_cache.CACHE_FOLDER).glob("*.npz")
    before = cache.stat().st_mtime_ns
    again = pytester.runpytest(*args)
    assert [line for line in again.stdout.lines if "::" in line] == [
        line for line in first.stdout.lines if "::" in line
    ]
    assert cache.stat().st_mtime_ns == before  # read, not rewritten
