"""Merge the result files of several runs (shards, ranks, reruns) into one set:

    msprobe-merge -o merged/ shard0-out/ shard1-out/ rank1-out/msprobe_records_20250101120000.jsonl [--html report.html]

Each source is a --msprobe-out folder (its newest run is taken; the older runs there are
named as not read) or a journal file. The journals are the truth: a test present in
several sources keeps the record of the last source named, so a rerun named after the
first run replaces its results. It prints what it read from each source.

The HTML report of result folders, merged the same way in memory (html_page.py):

    msprobe-report msprobe-out/ [more sources] -o report.html [--scripts DIR] [--baseline DIR ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.judge.gate.upgrade import merged_changes
from pytest_msprobe.results.run_files import (
    JOURNAL_PREFIX,
    Entry,
    ResultFilesError,
    ResultWriter,
    RunFiles,
    read_journal,
    read_regressions,
    read_sessions,
    record_key,
    write_regressions,
    write_sessions,
)

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record


def journal_of(source: Path) -> Path:
    """A journal file as named, or the newest journal in a folder."""
    if source.is_file():
        return source
    files = RunFiles.latest(source) if source.is_dir() else None
    if files is None:
        raise ResultFilesError(
            f"{source}: no {JOURNAL_PREFIX}*.jsonl here; name a --msprobe-out folder or a journal file"
        )
    return files.journal


@dataclass(frozen=True)
class SourceRead:
    """What merge read of one source: its journal, how many records, and the older
    runs of a folder that it did not read."""

    source: Path
    journal: Path
    records: int
    older: tuple[Path, ...] = ()

    def line(self) -> str:
        text = f"read {self.records} records from {self.journal}"
        if self.older:
            text += (
                f" (the newest of {len(self.older) + 1} runs in {self.source}; not read: "
                f"{', '.join(path.name for path in self.older)}: name a journal file to merge it too)"
            )
        return text


@dataclass(frozen=True)
class Merged:
    """The sources' journal entries (the last source's record of a test kept), how many
    tests appeared in more than one source, the sources' sessions (their run files), and
    what was read of each source."""

    entries: list[Entry]
    repeated: int
    sessions: list[Record]
    read: list[SourceRead]


def merged_entries(sources: Sequence[Path]) -> Merged:
    merged: dict[tuple[str, str], Entry] = {}
    sessions: list[Record] = []
    repeated = 0
    read: list[SourceRead] = []
    for source in sources:
        journal = journal_of(source)
        entries = read_journal(journal)
        older = tuple(files.journal for files in RunFiles.all(source)[:-1]) if source.is_dir() else ()
        read.append(SourceRead(source, journal, len(entries), older))
        for entry in entries:
            key = record_key(entry.record)
            repeated += key in merged
            merged[key] = entry
        sessions += read_sessions(RunFiles.of_journal(journal))
    return Merged(list(merged.values()), repeated, sessions, read)


def merge_runs(sources: Sequence[Path], target: Path) -> tuple[RunFiles, Merged]:
    """Write one run's files into `target` from the sources' journals."""
    merged = merged_entries(sources)
    files = RunFiles.new(target)
    ResultWriter(files, merged.entries).close()
    if merged.sessions:
        write_sessions(files, merged.sessions)
    compared = [read_regressions(RunFiles.of_journal(source.journal).regressions) for source in merged.read]
    if any(compared):  # runs against a baseline: their calls joined, their kernels pooled again
        write_regressions(files.regressions, *merged_changes(compared))
    return files, merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="msprobe-merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, help="--msprobe-out folders or msprobe_records_*.jsonl files")
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the merged files")
    parser.add_argument("--html", type=Path, help="also write the HTML report of the merged results to this file")
    args = parser.parse_args(argv)
    try:
        files, merged = merge_runs(args.sources, args.out)
    except ResultFilesError as exc:
        print(f"msprobe-merge: {exc}", file=sys.stderr)
        return 2
    for source in merged.read:
        print(f"msprobe-merge: {source.line()}")
    note = (
        f" ({merged.repeated} tests found in several sources: the last source's record kept)" if merged.repeated else ""
    )
    total = sum(source.records for source in merged.read) - merged.repeated
    print(
        f"msprobe-merge: wrote {total} records to {files.result}, {files.details}, {files.kernels}, {files.metrics}, {files.journal}{note}"
    )
    if args.html is not None:
        from pytest_msprobe.results.html_page import ReportContext, write_report

        report = write_report(merged.entries, args.html, ReportContext(sessions=tuple(read_sessions(files))))
        print(f"msprobe-merge: wrote {report}")
    return 0


def report_main(argv: Sequence[str] | None = None) -> int:
    """msprobe-report: the HTML report of result folders, rebuilt from their journals."""
    from pytest_msprobe.judge.gate.baseline import BaselineError
    from pytest_msprobe.results.html_page import ReportContext, read_baselines, write_report

    parser = argparse.ArgumentParser(
        prog="msprobe-report",
        description="Write the HTML report of result folders "
        "(--msprobe-out folders or msprobe_records_*.jsonl journals; several are merged).",
    )
    parser.add_argument("sources", nargs="+", type=Path, help="--msprobe-out folders or msprobe_records_*.jsonl files")
    parser.add_argument("-o", "--out", type=Path, default=Path("msprobe-report.html"), help="the HTML file to write")
    parser.add_argument(
        "--scripts", type=Path, help="the run's --msprobe-scripts folder: its scripts are the reproduce commands"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="a --msprobe-baseline-save folder (repeatable: the trend runs over all, the newest is compared with)",
    )
    parser.add_argument("--title", default="pytest-msprobe report")
    args = parser.parse_args(argv)
    try:
        merged = merged_entries(args.sources)
        baselines = read_baselines(args.baseline)
    except (ResultFilesError, BaselineError) as exc:
        print(f"msprobe-report: {exc}", file=sys.stderr)
        return 2
    path = write_report(
        merged.entries, args.out, ReportContext(args.title, tuple(merged.sessions), args.scripts, baselines)
    )
    print(f"msprobe-report: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
