"""Cost of writing results per call (target: under 1 ms), on 10,000 small calls.

Measures what the single writer does for every arriving test report: the record's
to_dict (worker side) and from_dict (controller side), the appends and flushes of the
details CSV, the metrics file and the journal, and the summary's counters. Then the
resume path: reading the 10,000-record journal back and rewriting the files from it.

    python benchmarks/bench_reports.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pytest_msprobe.judge.verdict.record import OutputResult, ResultRecord
from pytest_msprobe.results.run_files import Entry, ResultWriter, RunFiles, read_journal
from pytest_msprobe.results.summary import Summary

CALLS = 10_000


def record(i: int) -> ResultRecord:
    """A typical small call: one output, the benchmark standard's and legacy metrics."""
    metrics = {
        "small_value_err_ratio": 0.0,
        "rmse": 1.2e-7,
        "max_rel_err": 3.4e-6,
        "mean_rel_err": 1.1e-7,
        "eb": 0.01,
        "cosine": 1.0,
        "max_abs_err": 2.2e-7,
        "rel_err_hundredth": 1.0,
        "rel_err_thousandth": 1.0,
        "rel_err_ten_thousandth": 0.9999,
    }
    output = OutputResult(
        0,
        "",
        "pass",
        "benchmark",
        "single-run",
        "float32",
        "float64",
        [4, 16],
        metrics,
        {"small": 2**-20, "atol_bm": 2**-30},
        [],
    )
    return ResultRecord(
        "/data/dump.json",
        f"Functional.silu.{i}.forward",
        "pass",
        "benchmark",
        "single-run",
        "cpu",
        "",
        [output],
        ["input_args[0]: generated from statistics (seed 1)"],
        0.001,
    )


def main() -> None:
    records = [record(i) for i in range(CALLS)]
    with tempfile.TemporaryDirectory() as folder:
        files = RunFiles.new(Path(folder))
        writer, summary = ResultWriter(files), Summary()
        started = time.perf_counter()
        for item in records:
            entry = Entry(ResultRecord.from_dict(item.to_dict()))
            writer.add(entry)
            summary.add(entry.record)
        writer.close()
        per_call = (time.perf_counter() - started) / CALLS
        started = time.perf_counter()
        entries = read_journal(files.journal)
        ResultWriter(files, entries).close()
        resume = time.perf_counter() - started
        sizes = {path.name.split("_2")[0]: path.stat().st_size for path in Path(folder).iterdir()}
    print(f"write: {per_call * 1e3:.3f} ms per call ({CALLS} calls, flush per record, result CSV at close)")
    print(f"resume: read and rewrite {len(entries)} records in {resume:.2f} s")
    print("file sizes (bytes):", sizes)


if __name__ == "__main__":
    main()
