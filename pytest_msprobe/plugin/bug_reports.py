"""--msprobe-bug-reports: while the run goes on, reduce every failing call and write its
bug report folder (scripts/bug_report.py), where the test ran (an xdist worker holds the
dump index). The call's result record names the reduced size and the folder, so the
terminal summary, the result files and the HTML report show them. Nothing runs for a
passing call or without the option.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.state import session_state


@dataclass(frozen=True)
class BugReportOptions:
    folder: Path
    tries: int


BUG_REPORTS_KEY = pytest.StashKey["BugReportOptions | None"]()


def pytest_configure(config: pytest.Config) -> None:
    chosen = options.of(config)
    config.stash[BUG_REPORTS_KEY] = (
        BugReportOptions(chosen.bug_reports, chosen.bug_report_tries) if chosen.bug_reports is not None else None
    )


# Inside the report plugin's wrapper (trylast): the record it attaches names the folder.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    chosen = item.config.stash.get(BUG_REPORTS_KEY, None)
    if chosen is None or call.when != "call" or not report.failed:
        return report
    from pytest_msprobe.errors import CallSkip
    from pytest_msprobe.judge.reduce.reduction import Plan
    from pytest_msprobe.plugin.items import RESULT_KEY, CallItem, ExploreItem
    from pytest_msprobe.scripts.bug_report import report_folder, write_bug_report

    record = item.stash.get(RESULT_KEY, None)
    # an exploration's example is judged with its rounding excused: it is minimal already
    if not isinstance(item, CallItem) or isinstance(item, ExploreItem) or record is None or record.status != "error":
        return report
    index, name = item.index, item.call
    folder = report_folder(chosen.folder, index, name)
    try:
        written = write_bug_report(index, name, session_state(item.config).settings(), folder, Plan(tries=chosen.tries))
    except CallSkip as exc:
        report.sections.append(("msprobe bug report", f"no bug report of {item.record_name}: {exc}"))
    except Exception as exc:  # noqa: BLE001 - a report that cannot be written must not change the test's outcome
        report.sections.append(
            ("msprobe bug report", f"could not write the bug report of {item.record_name}: {type(exc).__name__}: {exc}")
        )
    else:
        record.reduction = written.fields
        steps = written.reduction.steps if item.config.get_verbosity() > 0 else []
        report.sections.append(("msprobe bug report", "\n".join([written.line, *(f"  {step}" for step in steps)])))
    return report
