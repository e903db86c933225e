"""The hooks of the results layer: thin, over report_writer, report_summary, filters
and failed_data.

Where results go: the process that runs a test attaches its ResultRecord to the
call-phase report (`report.msprobe_record`: a plain dict, or in an xdist worker that
dict as one JSON string, which execnet sends and reads several times faster than the
nested dict; `attach_record` and `take_record` are all that know the attribute).
pytest's default report serialization copies a report's attributes, so under xdist it
reaches the controller intact. The controller (or the lone process without xdist) is
the single writer: it takes the record off the report, writes it, and hands it on to
the rest of the plugin (pytest_msprobe_result, hookspecs.py), so that no other hook
reads the report before or after this one.

Calls left out by the lists, by dedup or because --msprobe-resume found their results
are deselected at collection (pytest counts them as "deselected"; the reasons are
printed after collection), not skipped: a resumed run's files then hold each call
exactly once, and its reports show only the work done now. The exit status of a
resumed run is that of the whole result set: errors of the run it resumed fail it too.

The writer holds --msprobe-out locked for the run (results.writer.OutFolderLock) and
starts a run's files with its first result: a run that checks nothing (--collect-only,
everything deselected) leaves no files, so it is never "the newest run" to resume.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_msprobe.dump import filters
from pytest_msprobe.dump.index import CallName
from pytest_msprobe.errors import DumpError
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.state import session_state
from pytest_msprobe.results.run_files import (
    Entry,
    OutFolderLock,
    ResultFilesError,
    ResultWriter,
    RunFiles,
    read_journal,
    read_sessions,
    record_key,
    write_sessions,
)
from pytest_msprobe.results.summary import Summary

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController

    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.plugin.items import CallItem
    from pytest_msprobe.standards.verdict import Status

# pytest_msprobe.plugin.items is imported where it is used, as plugin/__init__.py does: the node classes
# are then those of the session that collected the items.

REPORT_ATTRIBUTE = "msprobe_record"
PROGRESS_EVERY = 30.0  # seconds between progress lines in a long run
REPRESENTS_PROPERTY = "msprobe_represents"
# A test that ended without a ResultRecord (its check raised unexpectedly): the
# status its record gets, by the report's outcome.
STATUS_OF_OUTCOME: dict[str, Status] = {"failed": "error", "skipped": "skip", "passed": "error"}


@dataclass(frozen=True)
class ReportOptions:
    out: Path
    resume: bool
    strict: bool
    white_list: tuple[str, ...]
    black_list: tuple[str, ...]
    dedup: bool
    save_failed: Path | None

    @classmethod
    def from_config(cls, config: pytest.Config) -> ReportOptions:
        """The options, falling back to --msprobe-config's acc_check/run_ut section for
        the lists and the failed-data folder."""
        chosen = options.of(config)
        try:
            msprobe = filters.read_config(chosen.config) if chosen.config else filters.AccCheckConfig()
        except filters.FilterConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        save_failed = chosen.save_failed
        if save_failed is None and msprobe.error_data_path:
            save_failed = Path(config.invocation_params.dir) / msprobe.error_data_path
        return cls(
            out=chosen.out,
            resume=chosen.resume,
            strict=chosen.strict,
            white_list=chosen.white_list or msprobe.white_list,
            black_list=chosen.black_list or msprobe.black_list,
            dedup=chosen.dedup,
            save_failed=save_failed,
        )


class ReportPlugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.options = ReportOptions.from_config(config)
        # The single writer: the controller (or the lone process), unless nothing runs.
        self.writes = not hasattr(config, "workerinput") and not config.option.collectonly
        self.lock = OutFolderLock(self.options.out)
        try:
            if self.writes:
                self.lock.acquire()
                config.add_cleanup(self.lock.release)
            self.resumed_from = (
                RunFiles.latest(self.options.out) if self.options.resume and self.options.out.is_dir() else None
            )
            self.previous = read_journal(self.resumed_from.journal) if self.resumed_from else []
        except ResultFilesError as exc:
            raise pytest.UsageError(f"--msprobe-out: {exc}") from None
        self.done = {record_key(entry.record) for entry in self.previous}
        self.left_out: Counter[str] = Counter()
        self.selected: int | None = None
        self.summary = Summary()
        self.started_at = time.strftime("%Y-%m-%d %H:%M:%S%z")
        self.last_progress = time.monotonic()
        self.writer: ResultWriter | None = None
        if self.writes:
            for entry in self.previous:
                self.summary.add(entry.record, entry.represents, resumed=True)

    def _writer(self) -> ResultWriter:
        """The run's files, started with the first result (a resumed run's: rewritten
        from its journal)."""
        if self.writer is None:
            self.writer = ResultWriter(self.resumed_from or RunFiles.new(self.options.out), self.previous)
            self.previous = []
        return self.writer

    def result_writer(self) -> ResultWriter | None:
        """The run's writer where results exist (this session's, or the resumed run's)."""
        if not self.writes or (self.writer is None and self.resumed_from is None):
            return None
        return self._writer()

    # --- collection: lists, dedup, resume -------------------------------------------

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from pytest_msprobe.plugin.items import CallItem, ExploreItem

        if not (self.options.white_list or self.options.black_list or self.options.dedup or self.done):
            return  # nothing to leave out: no pass over (maybe 200,000) items
        if not hasattr(config, "workerinput"):  # xdist's workers: their controller checked (pytest_sessionstart)
            self._check_lists({api for index in session_state(config).indexes.values() for api in index.apis})
        calls = [item for item in items if isinstance(item, CallItem)]
        reasons = {
            item: filters.list_reason(item.call, self.options.white_list, self.options.black_list)
            for item in calls
            if not isinstance(item, ExploreItem)
        }
        if self.options.dedup:
            represents = filters.dedup(
                ((item.path, item.call) for item, reason in reasons.items() if reason is None), self._signature
            )
            for item, reason in reasons.items():
                count = represents.get((item.path, str(item.call)))
                if reason is None and count is None:
                    reasons[item] = "same signature as a kept call (--msprobe-dedup)"
                elif count is not None:
                    item.user_properties.append((REPRESENTS_PROPERTY, count))
        of_call = {(item.path, item.name): reason for item, reason in reasons.items()}
        reasons.update(
            {item: of_call.get((item.path, str(item.call))) for item in calls if isinstance(item, ExploreItem)}
        )
        journal = self.resumed_from.journal.name if self.resumed_from else ""
        for item, reason in reasons.items():
            if reason is None and (str(item.path), item.name) in self.done:
                reasons[item] = f"already in {journal} (--msprobe-resume)"
        dropped = [item for item, reason in reasons.items() if reason]
        self.left_out = Counter(reason for reason in reasons.values() if reason)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            dropped_set = set(dropped)
            items[:] = [item for item in items if item not in dropped_set]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """xdist's controller collects nothing: it checks the lists against the dumps
        before its workers start, so that a misspelt list stops the run once."""
        if not (self.options.white_list or self.options.black_list) or self.config.getvalue("dist") in (None, "no"):
            return
        if hasattr(self.config, "workerinput"):
            return
        from pytest_msprobe.plugin.items import open_dump

        apis: set[tuple[str, str]] = set()
        for dump in options.of(self.config).dump:
            try:
                apis.update(open_dump(self.config, dump).apis)
            except DumpError:
                continue  # its own test says why
        self._check_lists(apis)

    def _check_lists(self, apis: set[tuple[str, str]]) -> None:
        """A list option's entry that matches no API of the dumps is a usage error that
        names the closest APIs: a misspelt white list would deselect every call in
        silence. The lists of msprobe's config.json serve many models, so there only a
        white list that matches nothing at all is one."""
        if not apis:
            return  # no dump could be read: each says why in its own test
        given = options.of(self.config)
        problems = filters.find_unmatched(given.white_list, apis, "--msprobe-white-list")
        problems += filters.find_unmatched(given.black_list, apis, "--msprobe-black-list")
        white = self.options.white_list
        if not given.white_list and white and len(filters.find_unmatched(white, apis, "")) == len(white):
            problems.append(f"the white_list of --msprobe-config {given.config} matches no API of the dumps: {white}")
        if problems:
            raise pytest.UsageError("\n".join(problems) + "\nfix the list and run again")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """What this session is to run, after every selection (-k, -m, shards)."""
        self.selected = len(session.items)

    def pytest_report_collectionfinish(self) -> list[str]:
        return [f"msprobe: deselected {count} calls: {reason}" for reason, count in sorted(self.left_out.items())]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: WorkerController, ids: list[str]) -> None:
        self.selected = len(ids)

    def _signature(self, dump: Path, name: CallName) -> str:
        index = session_state(self.config).indexes[dump]
        return filters.signature(index.read_record(index.entry_of(str(name))))

    # --- results: made where the test runs, written by the single writer -----------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        from pytest_msprobe.plugin.items import RESULT_KEY, CallItem

        report = yield
        if call.when == "call" and isinstance(item, CallItem):
            record = item.stash.get(RESULT_KEY, None) or _record_crash(item, call, report.outcome)
            if self.options.save_failed and (
                record.status == "error" or (record.status == "warning" and self.options.strict)
            ):
                self._save_failed(item, record, report)
            attach_record(report, record.to_dict(), hasattr(self.config, "workerinput"))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.writes or report.when != "call":
            return
        data = take_record(report)  # the controller keeps no records in memory
        if data is None:
            return
        represents = dict(report.user_properties).get(REPRESENTS_PROPERTY, 1)  # an int, set in collection
        entry = Entry(ResultRecord.from_dict(data), represents if isinstance(represents, int) else 1)
        node = getattr(report, "node", None)  # the xdist worker that ran it: its device, should it die
        if node is not None:
            session_state(self.config).worker_devices.setdefault(node.gateway.id, entry.record.device)
        self._writer().add(entry)
        self.summary.add(entry.record, entry.represents)
        self.config.hook.pytest_msprobe_result(nodeid=report.nodeid, record=entry.record)
        self._show_progress()

    def _show_progress(self) -> None:
        """Every PROGRESS_EVERY seconds, one line of progress (never per call)."""
        now = time.monotonic()
        if now - self.last_progress < PROGRESS_EVERY:
            return
        self.last_progress = now
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and self.config.get_verbosity() >= 0:
            reporter.write_line(self.summary.progress(self.selected))

    def _save_failed(self, item: CallItem, record: ResultRecord, report: pytest.TestReport) -> None:
        """Failing to save is reported on the test, never a new failure of it."""
        from pytest_msprobe.results.failed_data import FailedCall, save_failed_call

        assert self.options.save_failed is not None
        try:
            source = item.replayable()
            if source is None:
                return
            failed = FailedCall(*source, record, label=item.record_name)
            folder = save_failed_call(self.options.save_failed, failed, session_state(item.config).settings())
        except Exception as exc:  # noqa: BLE001 - any failure here must not change the test's outcome
            report.sections.append(
                ("msprobe failed data", f"could not save {item.record_name}: {type(exc).__name__}: {exc}")
            )
        else:
            report.sections.append(("msprobe failed data", f"saved to {folder}"))

    # --- the end -------------------------------------------------------------------

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.writes:
            return
        if self.resumed_from is not None:
            self._writer()  # nothing ran: the resumed run's files are still completed (the result CSV)
        if self.writer is not None:
            self.writer.close()
            record_session(self.writer.files, self.config, self.started_at, time.monotonic() - self.summary.started)
        session.exitstatus = result_set_status(session.exitstatus, self.summary, self.options.strict)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.writes:
            return
        paths = []
        if self.writer is not None:
            files = self.writer.files
            paths = [files.result, files.details, files.kernels, files.metrics, files.journal]
        if self.options.save_failed and self.options.save_failed.is_dir():
            paths.append(self.options.save_failed)
        terminalreporter.section("msprobe summary")
        for line in self.summary.lines(selected=self.selected, files=paths, strict=self.options.strict):
            terminalreporter.write_line(line)
        baselines = self.config.pluginmanager.get_plugin("msprobe-baseline")  # plugin/baselines.py: what it wrote
        for line in baselines.saved if baselines is not None else ():
            terminalreporter.write_line(line)


def attach_record(report: pytest.TestReport, record: Record, serialized: bool) -> None:
    """Where the test ran: its record travels on its call report, to the single writer
    (`serialized` in an xdist worker: one JSON string; see the module's docstring)."""
    setattr(report, REPORT_ATTRIBUTE, json.dumps(record) if serialized else record)


def take_record(report: pytest.TestReport) -> Record | None:
    """The single writer takes the record off the report (None where it has none): a
    report kept after it (pytest's and xdist's) holds no copy of it."""
    attached: Record | str | None = getattr(report, REPORT_ATTRIBUTE, None)
    if attached is None:
        return None
    delattr(report, REPORT_ATTRIBUTE)
    return json.loads(attached) if isinstance(attached, str) else attached


def result_set_status(status: int, summary: Summary, strict: bool) -> int:
    """The exit status of the whole result set: with --msprobe-resume the calls of the
    resumed run count as if they had run now. Their errors fail a run whose own calls
    passed; a run with nothing left to do (pytest's "no tests collected") passes or
    fails by them. Anything else pytest decided (an interruption, a usage error) stands."""
    if not summary.resumed or status not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        return status
    failing = summary.by_status["error"] + (summary.by_status["warning"] if strict else 0)
    return pytest.ExitCode.TESTS_FAILED if failing else pytest.ExitCode.OK


def record_session(files: RunFiles, config: pytest.Config, started: str, duration: float) -> None:
    """Add this session to the run file: when, how long, the command, the environment
    (versions, CANN, device), which a report of these results shows."""
    from pytest_msprobe.judge.gate.baseline import environment

    state = session_state(config)
    session = {
        "started": started,
        "duration": round(duration, 3),
        "command": ["pytest", *config.invocation_params.args],
        "environment": environment((), state.device_label(), state.environment_versions()),
    }
    write_sessions(files, [*read_sessions(files), session])


def _record_crash(item: CallItem, call: pytest.CallInfo[None], outcome: str) -> ResultRecord:
    """The record of a test whose check raised instead of returning one."""
    excinfo = call.excinfo
    cause = f"{excinfo.type.__name__}: {excinfo.value}" if excinfo else "no result was recorded"
    return ResultRecord(
        dump=str(item.path),
        call=item.record_name,
        status=STATUS_OF_OUTCOME[outcome],
        standard="",
        reference="",
        device="",
        message=f"{item.record_name}: the check raised {cause}",
    )
