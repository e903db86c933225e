"""The one writer of a run's result files, and the resume state read back from them.

A run's files share a timestamp, as msprobe names them:

    msprobe_records_{ts}.jsonl             the journal: one ResultRecord per test, the truth
    accuracy_checking_details_{ts}.csv     one row per compared output (msprobe's columns)
    accuracy_checking_metrics_{ts}.jsonl   one flat object per output, every metric (pandas.read_json(lines=True))
    accuracy_checking_result_{ts}.csv      one row per dumped call, both directions (msprobe's columns)
    accuracy_checking_kernels_{ts}.csv     one row per pooled kernel (judge/gate/kernel_verdicts.py), the result CSV's columns
    msprobe_run_{ts}.json                  the sessions that wrote them: when, how long, the command
                                           and the environment (what a report rebuilt later shows)

Every arriving record is appended to the first three, the journal last and flushed at
once: a record is "done" once its journal line is complete. The details and metrics
files are flushed at most every FLUSH_EVERY seconds (two more flushes per call cost
about 45 us, 2% of a tiny call's time in the harness). A run killed at any point (SIGKILL
included) leaves at worst a torn last line, rows whose journal line is missing, or the
last second's rows unwritten; resume rewrites the files from the journal, then appends. The
result CSV needs both directions of a call, which arrive as two tests: it is written
from the per-call statuses when the session ends (a killed run has none until resumed).

One run writes into a folder at a time (OutFolderLock): two runs appending to one
folder at once would each start a run there, and "the newest run" that resume and
msprobe-merge read would be one of them, silently. A run's timestamp is reserved by
creating its journal exclusively, so two runs can never share files either.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from pytest_msprobe.judge.gate.kernel_verdicts import KernelPool, KernelVerdict
from pytest_msprobe.judge.gate.upgrade import worst_first
from pytest_msprobe.judge.verdict.record import EXPLORED_SUFFIX, ResultRecord

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.judge.gate.upgrade import Change
    from pytest_msprobe.standards.verdict import Status
from pytest_msprobe.results.msprobe_csv import (
    DETAILS_HEADER,
    DETAILS_PREFIX,
    ENCODING,
    KERNELS_PREFIX,
    RESULT_HEADER,
    RESULT_PREFIX,
    details_rows,
    output_name,
    result_row,
)

JOURNAL_PREFIX = "msprobe_records_"
METRICS_PREFIX = "accuracy_checking_metrics_"
RUN_PREFIX = "msprobe_run_"
REGRESSIONS_PREFIX = "msprobe_regressions_"
#: the regressions file's columns (judge/gate/upgrade.py's Change): the regressions (calls and
#: kernels), worst first, then every other compared call and kernel, which msprobe-merge
#: joins and pools again
REGRESSION_COLUMNS = (
    "kind",
    "dump",
    "name",
    "baseline name",
    "was",
    "now",
    "metric",
    "before",
    "after",
    "growth",
    "limit",
    "dtype",
)
_NUMBERS = ("before", "after", "growth", "limit")


class ResultFilesError(Exception):
    """Result files that cannot be read back: the message says which and what to do."""


@dataclass(frozen=True)
class RunFiles:
    """The paths of one run's files in a folder."""

    folder: Path
    stamp: str

    def _file(self, prefix: str, suffix: str) -> Path:
        return self.folder / f"{prefix}{self.stamp}{suffix}"

    @property
    def journal(self) -> Path:
        return self._file(JOURNAL_PREFIX, ".jsonl")

    @property
    def details(self) -> Path:
        return self._file(DETAILS_PREFIX, ".csv")

    @property
    def metrics(self) -> Path:
        return self._file(METRICS_PREFIX, ".jsonl")

    @property
    def result(self) -> Path:
        return self._file(RESULT_PREFIX, ".csv")

    @property
    def kernels(self) -> Path:
        return self._file(KERNELS_PREFIX, ".csv")

    @property
    def run(self) -> Path:
        return self._file(RUN_PREFIX, ".json")

    @property
    def regressions(self) -> Path:
        return self._file(REGRESSIONS_PREFIX, ".csv")

    @classmethod
    def of_journal(cls, journal: Path) -> RunFiles:
        """The run a journal belongs to (its timestamp names the other files)."""
        return cls(journal.parent, journal.name[len(JOURNAL_PREFIX) : -len(".jsonl")])

    @classmethod
    def new(cls, folder: Path) -> RunFiles:
        """A fresh timestamp (msprobe's %Y%m%d%H%M%S), suffixed if that second is taken;
        reserved by creating its (empty) journal, which fails if another run did first."""
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d%H%M%S")
        files, suffix = cls(folder, stamp), 1
        while files.details.exists() or not _claim(files.journal):
            files, suffix = cls(folder, f"{stamp}_{suffix}"), suffix + 1
        return files

    @classmethod
    def all(cls, folder: Path) -> list[RunFiles]:
        """Every run in a folder, oldest first (by the timestamps of their journals)."""
        stamps = sorted(
            path.name[len(JOURNAL_PREFIX) : -len(".jsonl")] for path in folder.glob(f"{JOURNAL_PREFIX}*.jsonl")
        )
        return [cls(folder, stamp) for stamp in stamps]

    @classmethod
    def latest(cls, folder: Path) -> RunFiles | None:
        """The newest run in a folder (by its journal's timestamp), None if there is none."""
        runs = cls.all(folder)
        return runs[-1] if runs else None


def _claim(path: Path) -> bool:
    """Whether this process created `path` (atomically: no other run can create it too)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


LOCK_FILE = ".msprobe-lock"


class OutFolderLock:
    """An exclusive lock on a result folder for one run (POSIX advisory locks: released
    by the system when the process ends, however it ends, so a killed run never leaves
    its folder locked). Where the platform has no fcntl the folder is not locked."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._handle: TextIO | None = None

    def acquire(self) -> None:
        """Lock the folder, or raise ResultFilesError naming the run that holds it."""
        try:
            import fcntl
        except ImportError:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # held open while the run lasts: the lock is the open handle (release() closes it)
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ResultFilesError(
                f"{self.path.parent} is in use by another run ({holder}); give each run that goes on at the "
                "same time its own --msprobe-out, and join their results with msprobe-merge"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file releases its lock
            self._handle = None


def record_key(record: ResultRecord) -> tuple[str, str]:
    """What identifies a test across runs: its dump and its call name (with direction)."""
    return record.dump, record.call


@dataclass(frozen=True)
class Entry:
    """A journal line: the record, and how many dumped calls its test stands for
    (more than 1 where --msprobe-dedup dropped calls with the same signature)."""

    record: ResultRecord
    represents: int = 1

    def to_json(self) -> str:
        return json.dumps({**self.record.to_dict(), "represents": self.represents})

    @classmethod
    def from_json(cls, line: bytes | str) -> Entry:
        data = json.loads(line)
        represents = data.pop("represents", 1)
        return cls(ResultRecord.from_dict(data), represents)


def read_journal(path: Path) -> list[Entry]:
    """Every complete entry of a journal, the last of each key winning. A torn last
    line (a run killed mid-write) is dropped; damage anywhere else is an error."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise ResultFilesError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    entries: dict[tuple[str, str], Entry] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = Entry.from_json(line)
        except (ValueError, TypeError, AttributeError) as exc:
            if number == len(lines):  # no newline after it: torn by a kill
                continue
            raise ResultFilesError(
                f"{path}: line {number} is not a result record ({exc}); the file was edited or "
                "damaged: delete that line, or run without --msprobe-resume to start over"
            ) from exc
        entries[record_key(entry.record)] = entry
    return list(entries.values())


def read_sessions(files: RunFiles) -> list[Record]:
    """The sessions recorded for a run, oldest first; none for a run that has no (or a
    damaged) run file: it only adds to a report, it is never needed to read results."""
    try:
        sessions = json.loads(files.run.read_text("utf-8")).get("sessions", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [session for session in sessions if isinstance(session, dict)] if isinstance(sessions, list) else []


def write_sessions(files: RunFiles, sessions: list[Record]) -> None:
    _replace(files.run, json.dumps({"sessions": sessions}, indent=1) + "\n")


def split_direction(record_call: str) -> tuple[str, str]:
    """A record's name -> (its row in the result CSV, the direction column): the
    exploration of `X.0.forward` is row `X.0.explore`, forward, beside row `X.0`."""
    call, _, direction = record_call.removesuffix(EXPLORED_SUFFIX).rpartition(".")
    return (call + EXPLORED_SUFFIX if record_call.endswith(EXPLORED_SUFFIX) else call), direction


def metrics_rows(entry: Entry) -> list[dict[str, object]]:
    """Flat objects, one per compared output, with every metric and threshold as its own
    column, and the columns of its findings (judge/findings/finding.py) where it has any:
    pandas.read_json(path, lines=True) gives one DataFrame of the whole run."""
    record = entry.record
    call, direction = split_direction(record.call)
    base = {
        "dump": record.dump,
        "call": call,
        "direction": direction,
        "device": record.device,
        "represents": entry.represents,
        "duration": record.duration,
        **({"known_defect": record.known_defect} if record.known_defect else {}),
    }
    return [
        {
            **base,
            "name": output_name(record.call, output),
            "output": output.index,
            "path": output.path,
            "status": output.status,
            "standard": output.standard,
            "reference": output.reference,
            "device_dtype": output.device_dtype,
            "bench_dtype": output.bench_dtype,
            "shape": output.shape,
            **output.metrics,
            **{f"threshold_{key}": value for key, value in output.thresholds.items()},
            **output.findings,
        }
        for output in record.outputs
    ]


def kernel_metrics_row(verdict: KernelVerdict) -> dict[str, object]:
    """A kernel's line in the metrics file: its pooled metrics, as a call's output's."""
    key = verdict.key
    return {
        "dump": key.dump,
        "call": key.row_name,
        "direction": key.direction,
        "name": key.name,
        "status": verdict.status,
        "standard": "kernel",
        "device_dtype": key.dtype,
        "pooled_calls": verdict.calls,
        **verdict.metrics,
        **{f"threshold_{name}": value for name, value in verdict.thresholds.items()},
    }


def kernel_rows(verdicts: Iterable[KernelVerdict]) -> list[list[str]]:
    """The rows of the kernels CSV: `{api}.{dtype}.kernel`, both directions."""
    rows: dict[tuple[str, str], CallStatus] = {}
    for verdict in verdicts:
        status = rows.setdefault((verdict.key.dump, verdict.key.row_name), CallStatus())
        status.status[verdict.key.direction] = verdict.status
        status.message[verdict.key.direction] = "; ".join(verdict.reasons)
    return [
        result_row(name, status.status.get("forward"), status.status.get("backward"), status.message.values())
        for (_, name), status in rows.items()
    ]


@dataclass
class CallStatus:
    """What the result CSV needs of a call: each direction's status and message."""

    status: dict[str, Status] = field(default_factory=dict)
    message: dict[str, str] = field(default_factory=dict)


FLUSH_EVERY = 1.0  # seconds between flushes of the details and metrics files


class ResultWriter:
    """Appends each record to the run's files as it arrives (the journal flushed per
    record, the others every FLUSH_EVERY seconds)."""

    def __init__(self, files: RunFiles, previous: Iterable[Entry] = ()) -> None:
        self.files = files
        self.calls: dict[tuple[str, str], CallStatus] = {}
        self.kernels = KernelPool()
        files.folder.mkdir(parents=True, exist_ok=True)
        previous = list(previous)
        self._rewrite(previous)
        # SIM115: appended to for the writer's lifetime, closed by close()
        self._journal = open(files.journal, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._details_file = open(files.details, "a", encoding="utf-8", newline="")  # noqa: SIM115
        self._details = csv.writer(self._details_file)
        self._metrics = open(files.metrics, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
        self._flushed = time.monotonic()
        for entry in previous:
            self._remember(entry.record)

    def add(self, entry: Entry) -> None:
        record = entry.record
        self._details.writerows(details_rows(record))
        self._metrics.write("".join(json.dumps(row) + "\n" for row in metrics_rows(entry)))
        now = time.monotonic()
        if now - self._flushed >= FLUSH_EVERY:
            self._details_file.flush()
            self._metrics.flush()
            self._flushed = now
        self._journal.write(entry.to_json() + "\n")
        self._journal.flush()
        self._remember(record)

    def close(self) -> None:
        """Write the result CSV from every call's statuses, and the kernel verdicts of
        every record (the kernels CSV, written whole, and their lines in the metrics file:
        a resumed run rewrites that file from the journal, so they are never twice), and
        close the files."""
        kernels = self.kernels.verdicts()
        self._metrics.write("".join(json.dumps(kernel_metrics_row(verdict)) + "\n" for verdict in kernels))
        for handle in (self._journal, self._details_file, self._metrics):
            handle.close()
        rows = [
            result_row(
                call,
                status.status.get("forward"),
                status.status.get("backward"),
                (status.message.get("forward", ""), status.message.get("backward", "")),
            )
            for (_, call), status in self.calls.items()
        ]
        _replace(self.files.result, _csv_text(RESULT_HEADER, rows), ENCODING)
        _replace(self.files.kernels, _csv_text(RESULT_HEADER, kernel_rows(kernels)), ENCODING)

    def _remember(self, record: ResultRecord) -> None:
        self.kernels.add(record)
        call, direction = split_direction(record.call)
        status = self.calls.setdefault((record.dump, call), CallStatus())
        status.status[direction] = record.status
        status.message[direction] = "" if record.status == "pass" else record.message

    def _rewrite(self, entries: list[Entry]) -> None:
        """Start the files afresh from these entries: headers, then their rows."""
        _replace(
            self.files.details,
            _csv_text(DETAILS_HEADER, [row for entry in entries for row in details_rows(entry.record)]),
            ENCODING,
        )
        _replace(
            self.files.metrics, "".join(json.dumps(row) + "\n" for entry in entries for row in metrics_rows(entry))
        )
        _replace(self.files.journal, "".join(entry.to_json() + "\n" for entry in entries))


def write_regressions(path: Path, calls: Iterable[Change], kernels: Iterable[Change]) -> Path:
    """A run's calls and kernels against its baseline (--msprobe-baseline): the
    regressions worst first, with verdict and key metric before and after, then the rest."""
    changes = [*calls, *kernels]
    regressions = worst_first(changes)
    rest = [change for change in changes if change.kind != "regression"]
    rows = [
        [c.kind, c.dump, c.name, c.recorded_as, c.was, c.now, c.metric]
        + ["" if value is None else f"{value:.6g}" for value in (c.before, c.after, c.growth, c.limit)]
        + [c.dtype]
        for c in [*regressions, *rest]
    ]
    _replace(path, _csv_text(REGRESSION_COLUMNS, rows), encoding="utf-8-sig")
    return path


def read_regressions(path: Path) -> list[Change]:
    """What write_regressions wrote ([] where no such file: a run without a baseline)."""
    from pytest_msprobe.judge.gate.upgrade import Change

    if not path.is_file():
        return []
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.DictReader(handle))
    found = []
    for row in rows:
        numbers = {key: float(row[key]) if row.get(key) else None for key in _NUMBERS}
        found.append(
            Change(
                row["kind"],
                row["name"],
                row["baseline name"],
                # the statuses write_regressions wrote
                cast("Status", row["was"]),
                cast("Status", row["now"]),
                row["metric"],
                **numbers,
                dump=row["dump"],
                dtype=row["dtype"],
            )
        )
    return found


def _csv_text(header: Iterable[str], rows: Iterable[list[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _replace(path: Path, text: str, encoding: str = "utf-8") -> None:
    """Write a whole file atomically: readers see the old file or the new, never half."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding=encoding, newline="") as handle:
        handle.write(text)
    os.replace(partial, path)
