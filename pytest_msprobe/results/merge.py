"""Merge the result files of several runs (shards, ranks, reruns) into one set:

    msprobe-merge -o merged/ shard0-out/ shard1-out/ rank1-out/msprobe_records_20250101120000.jsonl

Each source is a --msprobe-out folder (its newest run is taken; the older runs there are
named as not read) or a journal file. The journals are the truth: a test present in
several sources keeps the record of the last source named, so a rerun named after the
first run replaces its results. It prints what it read from each source.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pytest_msprobe.results.writer import Entry, JOURNAL_PREFIX, ResultFilesError, ResultWriter, RunFiles, read_journal, record_key


def journal_of(source: Path) -> Path:
    """A journal file as named, or the newest journal in a folder."""
    if source.is_file():
        return source
    files = RunFiles.latest(source) if source.is_dir() else None
    if files is None:
        raise ResultFilesError(f"{source}: no {JOURNAL_PREFIX}*.jsonl here; name a --msprobe-out folder or a journal file")
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
            text += (f" (the newest of {len(self.older) + 1} runs in {self.source}; not read: "
                     f"{', '.join(path.name for path in self.older)}: name a journal file to merge it too)")
        return text


def merge_runs(sources: Sequence[Path], target: Path) -> tuple[RunFiles, int, list[SourceRead]]:
    """Write one run's files into `target` from the sources' journals; returns the
    files, how many tests appeared in more than one source, and what was read."""
    merged: dict[tuple[str, str], Entry] = {}
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
    files = RunFiles.new(target)
    ResultWriter(files, merged.values()).close()
    return files, repeated, read


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="msprobe-merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, help="--msprobe-out folders or msprobe_records_*.jsonl files")
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the merged files")
    args = parser.parse_args(argv)
    try:
        files, repeated, read = merge_runs(args.sources, args.out)
    except ResultFilesError as exc:
        print(f"msprobe-merge: {exc}", file=sys.stderr)
        return 2
    for source in read:
        print(f"msprobe-merge: {source.line()}")
    note = f" ({repeated} tests found in several sources: the last source's record kept)" if repeated else ""
    total = sum(source.records for source in read) - repeated
    print(f"msprobe-merge: wrote {total} records to {files.result}, {files.details}, {files.metrics}, {files.journal}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
