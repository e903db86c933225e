"""Fixtures of the scale tests: synthetic dumps (pytest_msprobe.testing.synthetic_dumps) and
the records a run left in its out folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - imported before pytester's in-process runs, which must not import it a second time

from pytest_msprobe.results.merge import journal_of
from pytest_msprobe.results.run_files import read_journal
from pytest_msprobe.testing import synthetic_dumps


@pytest.fixture(scope="session")
def make_dump() -> Callable[..., Path]:
    """The synthetic dump maker, as a fixture the scale tests take."""
    return synthetic_dumps.make_dump


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
