"""Fixtures of the scale tests: synthetic dumps from benchmarks/make_dump.py, and the
records a run left in its out folder."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - imported before pytester's in-process runs, which must not import it a second time

from pytest_msprobe.results.merge import journal_of
from pytest_msprobe.results.run_files import read_journal

MAKE_DUMP = Path(__file__).parents[2] / "benchmarks" / "make_dump.py"


@pytest.fixture(scope="session")
def make_dump() -> Callable[..., Path]:
    """benchmarks/make_dump.make_dump (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_dump", MAKE_DUMP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.make_dump


@pytest.fixture
def records() -> Callable[[Path], dict[str, Any]]:
    """call name -> ResultRecord of the newest run in an out folder."""

    def read(out: Path) -> dict[str, Any]:
        return {entry.record.call: entry.record for entry in read_journal(journal_of(out))}

    return read


@pytest.fixture
def comparable_records() -> Callable[[Path], dict[str, dict]]:
    """call name -> its journal record as written, without what differs from run to run
    (its duration): two runs of the same calls compare equal."""

    def read(out: Path) -> dict[str, dict]:
        found = {}
        for line in journal_of(out).read_text().splitlines():
            record = json.loads(line)
            record.pop("duration", None)
            found[record["call"]] = record
        return found

    return read
