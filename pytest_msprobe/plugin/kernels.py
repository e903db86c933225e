"""Kernel verdicts as pytest results (pytest_msprobe/judge/gate/kernel_verdicts.py pools them).

A kernel's verdict needs every call of it, wherever it ran: it cannot be a collected
test item, which would run in one xdist worker (seeing only its own calls) and before
some of the calls it pools. So the single writer (the controller, or the lone process)
reports it when the test loop is over, before the session's exit status is decided:
each kernel becomes a test report (setup, call, teardown) sent through
pytest_runtest_logreport, the hook through which xdist hands the workers' reports to
the controller too. Every reporter then treats it as a test: the terminal's letters,
-rA and its summary counts, --junitxml's testcase, and the session's failure count,
which makes the exit status 1 where a kernel fails. It pools what the session's
results hold: the calls that ran now (-k, -m, a shard: only those, which the report
says) and those of the run --msprobe-resume continues.

A kernel test is named `<dump.json>::<api>.<dtype>.kernel.<direction>` everywhere (-v,
-rA, JUnit, the report), and that node id given back to pytest selects it: no item
bears the name, so `kernel_selection` takes such ids off the command line, before
collection, for their dumps; the run then runs the API's calls in that direction (the
kernel's evidence) and reports that kernel alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest

from pytest_msprobe.judge.gate.kernel_verdicts import KERNEL_MARK, is_kernel
from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.pytest_privates import bestrelpath
from pytest_msprobe.plugin.state import session_state

if TYPE_CHECKING:
    from pytest_msprobe.judge.gate.kernel_verdicts import KernelVerdict
    from pytest_msprobe.plugin.reports import ReportPlugin

KERNEL_KEYWORD = "msprobe_kernel"
REPLAYED_CALLS = 5  # the calls a failing kernel's replay command names
#: the kernel tests the command line named by node id: (dump.json, kernel name)
SELECTED_KEY = pytest.StashKey[frozenset[tuple[Path, str]]]()


def kernel_selection(config: pytest.Config) -> None:
    """Take the kernel tests' node ids off the command line (they name no item), each
    replaced by its dump, and keep them: collection keeps their calls, and the end of
    the run reports those kernels only."""
    base = Path(config.invocation_params.dir)
    selected, args = set(), []
    for arg in config.args:
        path, _, name = arg.partition("::")
        if name and is_kernel(name):
            selected.add(((base / path).resolve(), name))
            arg = path
        if arg not in args:
            args.append(arg)
    if selected:
        config.args[:] = args
        config.stash[SELECTED_KEY] = frozenset(selected)


def _parts(name: str) -> tuple[str, str]:
    """(api, direction) of a kernel name `{api}.{dtype}.kernel.{direction}`."""
    head, _, direction = name.rpartition(f".{KERNEL_MARK}.")
    return head.rpartition(".")[0], direction


class KernelPlugin:
    def __init__(self, config: pytest.Config, reports: ReportPlugin) -> None:
        self.config = config
        self.reports = reports  # its writer pools every record of the run
        self.selected = config.stash.get(SELECTED_KEY, frozenset())

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Where kernel tests were named by node id: the calls they pool, no other."""
        from pytest_msprobe.plugin.items import CallItem

        if not self.selected:
            return
        wanted = {(path, *_parts(name)) for path, name in self.selected}
        kept = [
            item
            for item in items
            if isinstance(item, CallItem)
            and (item.path.resolve(), f"{item.call.api_type}.{item.call.api_name}", item.call.direction) in wanted
        ]
        if len(kept) < len(items):
            kept_set = set(kept)
            config.hook.pytest_deselected(items=[item for item in items if item not in kept_set])
            items[:] = kept

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        result = yield
        if session.shouldfail or session.shouldstop:
            return result  # -x, --maxfail or an interruption: the calls that did not run are no evidence
        writer = self.reports.result_writer()
        verdicts = writer.kernels.verdicts() if writer is not None else []
        if self.selected:
            verdicts = [v for v in verdicts if (Path(v.key.dump).resolve(), v.key.name) in self.selected]
        session.testscollected += len(verdicts)  # the terminal's progress counts them among the tests
        for verdict in verdicts:
            self._report(verdict)
        return result

    def _report(self, verdict: KernelVerdict) -> None:
        dump = bestrelpath(self.config.rootpath, Path(verdict.key.dump))
        failed = verdict.status == "error"
        text = f"{verdict.message()}\n{self._scope()}"
        if failed:
            calls = " or ".join(item.call for item in verdict.evidence[:REPLAYED_CALLS])
            text += f"\n  replay the calls carrying most evidence: pytest --msprobe-dump={shlex.quote(verdict.key.dump)} -k {shlex.quote(calls)}"
        expected = self._failed_before(dump, verdict.key.name) if failed else None
        properties = (("msprobe_kernel_calls", len(verdict.calls)),)
        self.reports.summary.add_kernel(verdict.status)
        report_test(self.config, ReportedTest(dump, verdict.key.name, text, failed, properties, expected))

    def _failed_before(self, dump: str, name: str) -> str | None:
        """Under --msprobe-gate, why a failing kernel is expected to: the baseline's verdict
        of it (judge/gate/baseline.py Baseline.kernel) was an error too; None otherwise."""
        state = session_state(self.config)
        found = state.baseline.kernel(dump, name) if state.options.gate and state.baseline is not None else None
        if found is None or found[1].status != "error":
            return None
        return (
            f"{name}: failed the same way in the baseline (recorded in {found[0]}), not a regression (--msprobe-gate)"
        )

    def _scope(self) -> str:
        """What was pooled: the records of this session, and of the run it resumed; where
        a selection left calls out, that only the selected ones are evidence."""
        collected, resumed = self.reports.selected, self.reports.resumed_from
        since = f" and of the run in {resumed.journal.name} (--msprobe-resume)" if resumed is not None else ""
        shard = options.of(self.config).shard
        selections = {
            "-k": self.config.getoption("keyword"),
            "-m": self.config.getoption("markexpr"),
            "--msprobe-shard": f"{shard[0]}/{shard[1]}" if shard else None,
        }
        chosen = [f"{flag} {shlex.quote(str(value))}" for flag, value in selections.items() if value]
        if not chosen:
            return f"  pooled: the calls that ran in this session ({collected} collected){since}"
        return (
            f"  pooled: only the calls selected by {' '.join(chosen)} ({collected} collected){since}: "
            "the kernel's calls left out are no evidence; run without the selection to pool them all"
        )


@dataclass(frozen=True)
class ReportedTest:
    """A result that is no collected item (a kernel's, a kernel's regression), as the
    test `<dump>::<name>` that report_test reports."""

    dump: str
    name: str
    text: str  # the failure's message, or the passing call's section
    failed: bool
    properties: tuple[tuple[str, object], ...] = ()  # the call report's user properties (--junitxml's)
    expected: str | None = None  # why a failure is expected: reported as pytest reports an xfail


def report_test(config: pytest.Config, test: ReportedTest) -> None:
    """The test's setup, call and teardown reports, through the hooks that every
    reporter, --junitxml and the session's failure count read."""
    dump, name, text, failed, expected = test.dump, test.name, test.text, test.failed, test.expected
    from pytest_msprobe.plugin.items import headline

    nodeid = f"{dump}::{name}"
    location = (dump, None, headline(nodeid, name))  # never a suffix of the node id (headline)
    hook = config.hook
    hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    for when in ("setup", "call", "teardown"):
        outcome: Literal["passed", "failed", "skipped"] = "failed" if failed and when == "call" else "passed"
        longrepr: tuple[str, int, str] | str | None = text if outcome == "failed" else None
        if outcome == "failed" and expected is not None:
            outcome, longrepr = "skipped", (dump, 0, expected)
        report = pytest.TestReport(
            nodeid,
            location,
            {name: 1, KERNEL_KEYWORD: 1},
            outcome,
            longrepr,
            when,
            sections=[("msprobe kernel", text)] if when == "call" and not failed else [],
            user_properties=list(test.properties) if when == "call" else [],
        )
        if outcome == "skipped":
            report.wasxfail = str(expected)
        hook.pytest_runtest_logreport(report=report)
    hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
