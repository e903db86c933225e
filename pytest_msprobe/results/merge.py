"""Merge the result files of several runs (shards, ranks, reruns) into one set:

    msprobe-merge -o merged/ shard0-out/ shard1-out/ rank1-out/msprobe_records_20250101120000.jsonl [--html report.html]

Each source is a --msprobe-out folder (its newest run is taken) or a journal file. The
journals are the truth: a test present in several sources keeps the record of the
last source named, so a rerun named after the first run replaces its results.

The HTML report of result folders, merged the same way in memory (html.py):

    msprobe-report msprobe-out/ [more sources] -o report.html [--scripts DIR] [--baseline DIR ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pytest_msprobe.results.writer import (Entry, JOURNAL_PREFIX, ResultFilesError, ResultWriter, RunFiles, read_journal, read_sessions,
                                           record_key, write_sessions)


def journal_of(source: Path) -> Path:
    """A journal file as named, or the newest journal in a folder."""
    if source.is_file():
        return source
    files = RunFiles.latest(source) if source.is_dir() else None
    if files is None:
        raise ResultFilesError(f"{source}: no {JOURNAL_PREFIX}*.jsonl here; name a --msprobe-out folder or a journal file")
    return files.journal


def merged_entries(sources: Sequence[Path]) -> tuple[list[Entry], int, list[dict]]:
    """The sources' journal entries (the last source's record of a test kept), how many
    tests appeared in more than one source, and the sources' sessions (their run files)."""
    merged: dict[tuple[str, str], Entry] = {}
    sessions: list[dict] = []
    repeated = 0
    for source in sources:
        journal = journal_of(source)
        for entry in read_journal(journal):
            key = record_key(entry.record)
            repeated += key in merged
            merged[key] = entry
        sessions += read_sessions(RunFiles.of_journal(journal))
    return list(merged.values()), repeated, sessions


def merge_runs(sources: Sequence[Path], target: Path) -> tuple[RunFiles, int, list[Entry]]:
    """Write one run's files into `target` from the sources' journals; returns the
    files, how many tests appeared in more than one source, and the merged entries."""
    entries, repeated, sessions = merged_entries(sources)
    files = RunFiles.new(target)
    ResultWriter(files, entries).close()
    if sessions:
        write_sessions(files, sessions)
    return files, repeated, entries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="msprobe-merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, help="--msprobe-out folders or msprobe_records_*.jsonl files")
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the merged files")
    parser.add_argument("--html", type=Path, help="also write the HTML report of the merged results to this file")
    args = parser.parse_args(argv)
    try:
        files, repeated, entries = merge_runs(args.sources, args.out)
    except ResultFilesError as exc:
        print(f"msprobe-merge: {exc}", file=sys.stderr)
        return 2
    note = f" ({repeated} tests found in several sources: the last source's record kept)" if repeated else ""
    print(f"msprobe-merge: wrote {files.result}, {files.details}, {files.metrics}, {files.journal}{note}")
    if args.html is not None:
        from pytest_msprobe.results.html import ReportContext, write_report

        report = write_report(entries, args.html, ReportContext(sessions=tuple(read_sessions(files))))
        print(f"msprobe-merge: wrote {report}")
    return 0


def report_main(argv: Sequence[str] | None = None) -> int:
    """msprobe-report: the HTML report of result folders, rebuilt from their journals."""
    from pytest_msprobe.judge.baseline import BaselineError
    from pytest_msprobe.results.html import ReportContext, read_baselines, write_report

    parser = argparse.ArgumentParser(prog="msprobe-report", description="Write the HTML report of result folders "
                                     "(--msprobe-out folders or msprobe_records_*.jsonl journals; several are merged).")
    parser.add_argument("sources", nargs="+", type=Path, help="--msprobe-out folders or msprobe_records_*.jsonl files")
    parser.add_argument("-o", "--out", type=Path, default=Path("msprobe-report.html"), help="the HTML file to write")
    parser.add_argument("--scripts", type=Path, help="the run's --msprobe-scripts folder: its scripts are the reproduce commands")
    parser.add_argument("--baseline", type=Path, action="append", default=[],
                        help="a --msprobe-baseline-save folder (repeatable: the trend runs over all, the newest is compared with)")
    parser.add_argument("--title", default="pytest-msprobe report")
    args = parser.parse_args(argv)
    try:
        entries, _, sessions = merged_entries(args.sources)
        baselines = read_baselines(args.baseline)
    except (ResultFilesError, BaselineError) as exc:
        print(f"msprobe-report: {exc}", file=sys.stderr)
        return 2
    path = write_report(entries, args.out, ReportContext(args.title, tuple(sessions), args.scripts, baselines))
    print(f"msprobe-report: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
