"""Cost of writing results per call (target: under 1 ms), on 10,000 small calls.

What the single writer does for every arriving test report: the record's to_dict
(worker side) and from_dict (controller side), the appends and flushes of the details
CSV, the metrics file and the journal, and the summary's counters (one round: the
10,000 calls, so the time per call is the round's time / 10,000). Then the resume
path: reading the 10,000-record journal back and rewriting the files from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support import fastest, passing_record
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.results.run_files import Entry, ResultWriter, RunFiles, read_journal
from pytest_msprobe.results.summary import Summary

CALLS = 10_000
pytestmark = pytest.mark.benchmark(group="reports")


def record(i: int) -> ResultRecord:
    """A typical small call: one output, the benchmark standard's and legacy metrics."""
    return passing_record(f"Functional.silu.{i}.forward", (1.2e-7, 3.4e-7, 1.1e-7, 1e-6, 0.0), 0.001)


def write_all(folder: Path, records: list[ResultRecord]) -> RunFiles:
    files = RunFiles.new(folder)
    writer, summary = ResultWriter(files), Summary()
    for item in records:
        entry = Entry(ResultRecord.from_dict(item.to_dict()))
        writer.add(entry)
        summary.add(entry.record)
    writer.close()
    return files


def test_write_per_call(benchmark, tmp_path: Path) -> None:
    records = [record(i) for i in range(CALLS)]
    folders = iter(range(1_000))

    def setup() -> tuple[tuple[Path, list[ResultRecord]], dict[str, object]]:
        folder = tmp_path / str(next(folders))
        folder.mkdir()
        return (folder, records), {}

    files = benchmark.pedantic(write_all, setup=setup, rounds=3, iterations=1)
    benchmark.extra_info["calls"] = CALLS
    benchmark.extra_info["ms_per_call"] = fastest(benchmark) * 1e3 / CALLS
    benchmark.extra_info["file_bytes"] = {
        path.name.split("_2")[0]: path.stat().st_size for path in files.folder.iterdir()
    }


def test_resume(benchmark, tmp_path: Path) -> None:
    files = write_all(tmp_path, [record(i) for i in range(CALLS)])

    def resume() -> int:
        entries = read_journal(files.journal)
        ResultWriter(files, entries).close()
        return len(entries)

    assert benchmark.pedantic(resume, rounds=3, iterations=1) == CALLS
