"""The terminal summary a person reads first: how many calls did what, by status,
standard and API type; the worst calls with the metric that failed them; the pace of
the run; where the files are. Built from ResultRecords as they arrive, in constant
memory (counters and a bounded list of the worst)."""

from __future__ import annotations

import heapq
import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_msprobe.judge.verdict.record import EXPLORED_SUFFIX, ResultRecord
from pytest_msprobe.standards.verdict import STATUS_ORDER, Status

#: the order statuses are shown in
STATUSES: tuple[Status, ...] = ("pass", "warning", "error", "skip")
WORST_SHOWN = 10
MOST_REPEATED_SHOWN = 10  # with --msprobe-dedup: the tests that stand for the most dumped calls
LINE_CUT = 200  # a failure's reason can be long; worst calls show its start, the message the rest
SKIP_REASONS_SHOWN = 12
#: the overflow modes as judge/findings/overflow_modes.py names them in the metrics columns, as the
#: summary and the report count them (spelled here: that module imports torch, and the
#: xdist controller, which writes the summary, does not)
OVERFLOW_MODES = ("saturation", "inf-nan")
CONTRADICTS = "contradicts"
# what varies from call to call in a skip's message: call names, file names, numbers
_CALL = re.compile(r"\b[A-Z][A-Za-z]*\.[A-Za-z_][\w.]*?\.\d+(?:\.(?:forward|backward))?\b")
_FILE = re.compile(r"\S+\.(?:pt|npy)\b")
_NUMBER = re.compile(r"(?<![\w\[])\d[\d,.]*(?:e[+-]?\d+)?")


def skip_reason(message: str) -> str:
    """A skip's message as a reason shared by calls: its call and file names and its
    numbers replaced, its first line whole (coverage: what was not judged, and why; a
    reason ends with what the user can do, so it is never cut)."""
    line = message.strip().splitlines()[0] if message.strip() else "(no reason given)"
    line = _NUMBER.sub("N", _FILE.sub("<file>", _CALL.sub("<call>", line)))
    return line.removeprefix("<call>: ")


def overflow_mode_counts(record: ResultRecord) -> Counter[str]:
    """The overflow modes the call's outputs showed where the bench overflows
    (judge/findings/overflow_modes.py), each counted once, and `contradicts` where one
    contradicts the device's stated mode."""
    modes = {str(output.findings["overflow_mode"]) for output in record.outputs if "overflow_mode" in output.findings}
    if any(output.findings.get("overflow_mode_contradicts") for output in record.outputs):
        modes.add(CONTRADICTS)
    return Counter(modes)


def overflow_modes_line(counts: Counter[str]) -> str:
    """The summary's line on overflow modes: counted apart from accuracy errors."""
    shown = ", ".join(f"{counts[mode]} {mode}" for mode in OVERFLOW_MODES if counts[mode])
    line = f"overflow modes, calls whose outputs overflow their dtype on the bench: {shown}"
    if counts[CONTRADICTS]:
        line += f"; {counts[CONTRADICTS]} contradict the device's stated mode (errors)"
    return line


def badness(record: ResultRecord) -> tuple[int, float, str]:
    """Worst first: errors before warnings, then the larger share of failing outputs,
    then the name (for a stable order)."""
    failing = sum(1 for output in record.outputs if output.status == record.status)
    share = failing / len(record.outputs) if record.outputs else 1.0
    return STATUS_ORDER.get(record.status, 0), share, record.call


def failing_metric(record: ResultRecord) -> str:
    """The first reason of the first output with the call's status, else the message's
    first line (a call that failed before any comparison), cut to one short line; never
    starting with the call's name, which the summary's line names already."""
    text = next(
        (
            f"{output.path or 'output'}: {output.reasons[0]}"
            for output in record.outputs
            if output.status == record.status and output.reasons
        ),
        record.message,
    )
    line = text.strip().splitlines()[0] if text.strip() else ""
    while line.startswith(f"{record.call}: "):  # a device's error may name the call again
        line = line.removeprefix(f"{record.call}: ")
    return line if len(line) <= LINE_CUT else line[:LINE_CUT] + " ..."


def known_label(record: ResultRecord) -> str:
    """A failing call's label where it matches a known library defect (judge/defects/table.py):
    the summary, the report and the worst calls tell it from a new fault."""
    return f"known defect {record.known_defect}: " if record.known_defect else ""


def known_line(known: Counter[str]) -> str:
    """How many failing calls are known library defects, by row, and what a CI can do."""
    total = sum(known.values())
    rows = ", ".join(f"{row} ({count})" for row, count in known.most_common())
    calls = (
        "call is a known library defect, not a new fault"
        if total == 1
        else "calls are known library defects, not new faults"
    )
    return f"{total} failing {calls}: {rows}; --msprobe-known-defects=xfail makes them expected failures"


def dump_names(dumps: Iterable[str]) -> dict[str, str]:
    """Each dump.json as the summary names it: its path from the folder the dumps share
    (`rank3/dump.json`)."""
    paths = [Path(dump) for dump in dumps]
    if len(paths) < 2:  # one dump: its path alone
        return {str(path): path.name for path in paths}
    common = Path(os.path.commonpath([path.parent for path in paths]))
    return {str(path): path.relative_to(common).as_posix() for path in paths}


@dataclass
class Summary:
    by_status: Counter[Status] = field(default_factory=Counter)
    by_standard: dict[str, Counter[Status]] = field(default_factory=dict)
    by_api_type: dict[str, Counter[Status]] = field(default_factory=dict)
    worst: list[tuple[tuple[int, float, str], str, str, str]] = field(
        default_factory=list
    )  # (badness, call, metric, dump)
    dumps: set[str] = field(default_factory=set)  # the dumps the records came from
    resumed: int = 0
    resumed_status: Counter[Status] = field(default_factory=Counter)
    represented: int = 0
    most_repeated: list[tuple[int, str]] = field(default_factory=list)
    skips: Counter[str] = field(default_factory=Counter)  # skip_reason -> calls
    overflow_modes: Counter[str] = field(default_factory=Counter)  # overflow_mode_counts: mode -> calls
    known: Counter[str] = field(default_factory=Counter)  # known defect (judge/defects/table.py) -> failing calls
    bug_reports: list[str] = field(default_factory=list)  # --msprobe-bug-reports: a line per reduced call
    started: float = field(default_factory=time.monotonic)
    # the tests besides the dumped calls', counted apart so that the counts add up to
    # pytest's: `<call>.explore` tests (among the records) and the kernels' (no record)
    explored: Counter[Status] = field(default_factory=Counter)
    kernels: Counter[Status] = field(default_factory=Counter)

    def add_kernel(self, status: Status) -> None:
        """A kernel test's verdict (judge/gate/kernel_verdicts.py), reported after the calls."""
        self.kernels[status] += 1

    def add(self, record: ResultRecord, represents: int = 1, *, resumed: bool = False) -> None:
        self.by_status[record.status] += 1
        self.dumps.add(record.dump)
        if record.call.endswith(EXPLORED_SUFFIX):
            self.explored[record.status] += 1
        self.by_standard.setdefault(record.standard or "(none)", Counter())[record.status] += 1
        self.by_api_type.setdefault(record.call.split(".", 1)[0], Counter())[record.status] += 1
        self.represented += represents
        self.resumed += resumed
        if resumed:
            self.resumed_status[record.status] += 1
        if record.status == "skip":
            self.skips[skip_reason(record.message)] += 1
        self.overflow_modes.update(overflow_mode_counts(record))
        if record.known_defect:
            self.known[record.known_defect] += 1
        if record.reduction:
            reduction = record.reduction
            self.bug_reports.append(
                f"  {record.call}: {reduction.get('size')} ({reduction.get('elements')} input elements): "
                f"{reduction.get('folder')}"
            )
        if represents > 1:
            repeated = (represents, record.call)
            if len(self.most_repeated) < MOST_REPEATED_SHOWN:
                heapq.heappush(self.most_repeated, repeated)
            else:
                heapq.heappushpop(self.most_repeated, repeated)
        if record.status in ("error", "warning"):
            item = (badness(record), record.call, known_label(record) + failing_metric(record), record.dump)
            if len(self.worst) < WORST_SHOWN:
                heapq.heappush(self.worst, item)
            else:
                heapq.heappushpop(self.worst, item)

    def progress(self, selected: int | None) -> str:
        """One line for a person watching a long run: done, pace, time left."""
        ran = sum(self.by_status.values()) - self.resumed
        elapsed = time.monotonic() - self.started
        rate = ran / elapsed if elapsed > 0 else 0.0
        line = f"msprobe: {ran}{f'/{selected}' if selected else ''} calls in {elapsed:.0f} s ({rate:.1f} calls/s)"
        if selected and rate > 0 and ran < selected:
            line += f", about {(selected - ran) / rate:.0f} s left"
        if self.by_status["error"]:
            line += f", {self.by_status['error']} errors so far"
        return line

    def lines(self, *, selected: int | None, files: list[Path], strict: bool = False) -> list[str]:
        """The summary text. selected: tests this session was to run after every
        selection (None if unknown), giving the pace and, after an interruption, the
        time left; files: the result files (none: no call ran, nothing was written)."""
        total = sum(self.by_status.values())
        ran = total - self.resumed
        elapsed = time.monotonic() - self.started
        rate = ran / elapsed if elapsed > 0 else 0.0
        calls = self.by_status - self.explored
        kinds = (("call", calls), ("exploration", self.explored), ("kernel", self.kernels))
        head = "; ".join(_format_counts(kind, counter) for kind, counter in kinds if counter) or "0 calls"
        pace = f"{ran} run here in {elapsed:.1f} s ({rate:.1f} calls/s)"
        if self.resumed:
            pace += f", {self.resumed} from the resumed run"
        if selected is not None and ran < selected and rate > 0:
            pace += (
                f"; {selected - ran} not run, about {(selected - ran) / rate:.0f} s more (rerun with --msprobe-resume)"
            )
        lines = [head, pace]
        if self.known:
            lines.append(known_line(self.known))
        failing = self.resumed_status["error"] + (self.resumed_status["warning"] if strict else 0)
        if failing:
            lines.append(f"{failing} of the calls from the resumed run failed: they count in the exit status")
        if self.represented > total:
            lines.append(
                f"dedup: these {total} tests stand for {self.represented} dumped tests (a call's forward and "
                "backward count apart); the most repeated:"
            )
            lines += [f"  {call}: {count}" for count, call in sorted(self.most_repeated, reverse=True)]
        lines += _table("by standard", self.by_standard) + _table("by api type", self.by_api_type)
        if self.skips:
            lines.append("skipped, by reason (not judged: the call's files have the full messages):")
            lines += [f"  {count:>5}  {reason}" for reason, count in self.skips.most_common(SKIP_REASONS_SHOWN)]
            if len(self.skips) > SKIP_REASONS_SHOWN:
                rest = sum(self.skips.values()) - sum(count for _, count in self.skips.most_common(SKIP_REASONS_SHOWN))
                lines.append(f"  {rest:>5}  ({len(self.skips) - SKIP_REASONS_SHOWN} other reasons)")
        if self.overflow_modes:
            lines.append(overflow_modes_line(self.overflow_modes))
        if self.worst:
            lines.append("worst calls:")
            named = dump_names(self.dumps) if len(self.dumps) > 1 else {}  # several dumps: whose call
            lines += [
                f"  {call}{f' ({named[dump]})' if dump in named else ''}: {metric}"
                for _, call, metric, dump in sorted(self.worst, reverse=True)
            ]
        lines += _format_list(
            "bug reports, each call reduced to the smallest input that fails the same way:", self.bug_reports
        )
        lines += [f"results: {path}" for path in files] or ["results: none written (no call ran)"]
        return lines


def _format_counts(kind: str, counter: Counter[Status]) -> str:
    """`49 calls, 48 pass, 1 error`."""
    total = sum(counter.values())
    return f"{total} {kind}{'s' if total != 1 else ''}" + "".join(f", {counter[s]} {s}" for s in STATUSES if counter[s])


def _format_list(title: str, rows: list[str]) -> list[str]:
    return [title, *rows] if rows else []


def _table(title: str, counts: dict[str, Counter[Status]]) -> list[str]:
    rows = [
        f"  {name:<22} " + "  ".join(f"{s} {counter[s]}" for s in STATUSES if counter[s])
        for name, counter in sorted(counts.items())
    ]
    return [f"{title}:", *rows] if rows else []
