"""Merge the result files of several runs (shards, ranks, reruns) into one set:

    msprobe-merge -o merged/ shard0-out/ shard1-out/ rank1-out/msprobe_records_20250101120000.jsonl

Each source is a --msprobe-out folder (its newest run is taken) or a journal file. The
journals are the truth: a test present in several sources keeps the record of the
last source named, so a rerun named after the first run replaces its results.
"""

from __future__ import annotations

import argparse
import sys
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


def merge_runs(sources: Sequence[Path], target: Path) -> tuple[RunFiles, int]:
    """Write one run's files into `target` from the sources' journals; returns the
    files and how many tests appeared in more than one source."""
    merged: dict[tuple[str, str], Entry] = {}
    repeated = 0
    for source in sources:
        for entry in read_journal(journal_of(source)):
            key = record_key(entry.record)
            repeated += key in merged
            merged[key] = entry
    files = RunFiles.new(target)
    ResultWriter(files, merged.values()).close()
    return files, repeated


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="msprobe-merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path, help="--msprobe-out folders or msprobe_records_*.jsonl files")
    parser.add_argument("-o", "--out", type=Path, required=True, help="folder for the merged files")
    args = parser.parse_args(argv)
    try:
        files, repeated = merge_runs(args.sources, args.out)
    except ResultFilesError as exc:
        print(f"msprobe-merge: {exc}", file=sys.stderr)
        return 2
    note = f" ({repeated} tests found in several sources: the last source's record kept)" if repeated else ""
    print(f"msprobe-merge: wrote {files.result}, {files.details}, {files.metrics}, {files.journal}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
