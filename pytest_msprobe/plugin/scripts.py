"""--msprobe-scripts: while the run goes on, write the standalone script of every failed
call (of every selected call with --msprobe-scripts-all), where the test ran (an xdist
worker holds the dump index). plugin/__init__.py registers this module when a dump is given.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.state import session_state

# plugin.items and scripts.writer (torch) are imported where a script is written: the
# xdist controller writes none.


@dataclass(frozen=True)
class ScriptOptions:
    folder: Path
    every: bool
    standards_csv: str | None  # scripts judge with the run's --msprobe-standards file too
    offline: bool  # --msprobe-offline: scripts judge the dumped outputs too
    note: str  # what of the run a script cannot reproduce, said in its header


SCRIPTS_KEY = pytest.StashKey["ScriptOptions | None"]()


def pytest_configure(config: pytest.Config) -> None:
    chosen = options.of(config)
    if chosen.scripts is None:
        config.stash[SCRIPTS_KEY] = None
        return
    standards = chosen.standards
    note = (
        " (the run used --msprobe-baseline; the script judges by the standards, not against the baseline)"
        if session_state(config).baseline is not None
        else ""
    )
    config.stash[SCRIPTS_KEY] = ScriptOptions(
        chosen.scripts, chosen.scripts_all, standards.read_text("utf-8") if standards else None, chosen.offline, note
    )


# Outside the report plugin's wrapper (tryfirst): its failed-data section comes first.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    chosen = item.config.stash.get(SCRIPTS_KEY, None)
    if chosen is None or call.when != "call" or not (chosen.every or report.failed):
        return report
    from pytest_msprobe.plugin.items import RESULT_KEY, CallItem, ExploreItem
    from pytest_msprobe.scripts.standalone import WriteOptions, expected_verdict, write_script

    if not isinstance(item, CallItem):
        return report
    record = item.stash.get(RESULT_KEY, None)
    # an exploration's example is judged with its rounding excused, and replayed online
    explored = isinstance(item, ExploreItem)
    judged = (
        record.message.splitlines()[0] if record is not None else f"the check raised ({report.outcome})"
    ) + chosen.note
    try:
        source = item.replayable()
        if source is None:
            return report
        written = WriteOptions(
            max_elements=session_state(item.config).settings().max_elements,
            standards_csv=chosen.standards_csv,
            judged=judged,
            file_name=item.record_name,
            offline=chosen.offline and not explored,
            expected=expected_verdict(record) if record is not None and not (chosen.note or explored) else None,
        )
        path = write_script(*source, chosen.folder, written)
    except Exception as exc:  # noqa: BLE001 - a script that cannot be written must not change the test's outcome
        report.sections.append(
            ("msprobe script", f"could not write the script of {item.record_name}: {type(exc).__name__}: {exc}")
        )
    else:
        report.sections.append(("msprobe script", f"reproduce it alone: python {path}"))
    return report
