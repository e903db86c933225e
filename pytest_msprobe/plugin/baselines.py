"""The hooks of baselines: thin, over pytest_msprobe.judge.gate.baseline.

Every call's check already receives its recorded metrics as the reference (see
state.py, which also matches the baseline's dumps with this run's); here the controller
(or the lone process) keeps each call's metrics as results arrive, writes the baseline
at the end, and reports what changed, loudly when the baseline matched no call at all.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_msprobe.dump.index import read_index
from pytest_msprobe.judge.gate.baseline import FILE_NAME, KERNEL_STANDARD, Baseline, CallMetrics, compare, environment
from pytest_msprobe.judge.gate.upgrade import RunComparison, call_signatures, compare_run, sign_calls
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.kernels import ReportedTest, report_test
from pytest_msprobe.plugin.pytest_privates import bestrelpath
from pytest_msprobe.plugin.state import session_state
from pytest_msprobe.results.run_files import write_regressions

if TYPE_CHECKING:
    from pytest_msprobe.plugin.reports import ReportPlugin

SHOWN_REGRESSIONS = 20
#: the exit status of a gate that compared nothing of a dump that ran: what CI users
#: expect of a wrong baseline path or a baseline of another model, an invocation to fix
#: (pytest's own for a bad option), told apart from regressions (TESTS_FAILED)
GATE_EXIT = pytest.ExitCode.USAGE_ERROR


class BaselinePlugin:
    def __init__(self, config: pytest.Config, reports: ReportPlugin) -> None:
        self.config = config
        self.reports = reports  # its writer pools the kernel verdicts
        chosen = options.of(config)
        self.save_to, self.judged_by, self.update = chosen.baseline_save, chosen.baseline, chosen.baseline_update
        self.current: dict[tuple[str | None, str], CallMetrics] = {}
        self._comparison: RunComparison | None = None
        self.saved: list[str] = []  # what the summary says of the baseline files written (saved_lines)

    def pytest_msprobe_result(self, nodeid: str, record: ResultRecord) -> None:
        """A call's result, as the report plugin wrote it (hookspecs.py)."""
        if self.save_to is None and session_state(self.config).baseline is None:
            return  # no baseline to write, and no recorded metrics to compare with
        self.current[(nodeid.rsplit("::", 1)[0], record.call)] = CallMetrics.of(record)

    def _kernels(self) -> dict[tuple[str | None, str], CallMetrics]:
        """The run's kernel verdicts (plugin/kernels.py), keyed as its calls are."""
        writer = self.reports.result_writer()
        verdicts = writer.kernels.verdicts() if writer is not None else []
        rootpath = self.config.rootpath
        return {(bestrelpath(rootpath, Path(v.key.dump)), v.key.name): CallMetrics.of_kernel(v) for v in verdicts}

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The baseline files and the regressions file. No order with the report plugin's
        sessionfinish: of its writer, open or closed, this reads only the kernels' pool and
        the files' names (the HTML report, which reads the closed files, goes last)."""
        if hasattr(self.config, "workerinput"):
            return
        if self.save_to is not None or self.update:
            self.current.update(self._kernels())
        state = session_state(self.config)
        device, versions = state.device_label(), state.environment_versions()
        if self.save_to is not None or self.update:
            self.current = sign_calls(
                self.current, {key: call_signatures(read_index(path)) for key, path in self._dumps()}
            )
        if self.save_to is not None:
            written = Baseline(environment(self._dumps(), device, versions), dict(self.current))
            self._said("saved", written, written.write(self.save_to))
        writer = self.reports.result_writer()
        if state.baseline is not None and writer is not None:
            write_regressions(writer.files.regressions, self.comparison().calls, self.comparison().kernels)
        if state.baseline is not None and not self.update:
            self._warn_nothing_compared(session, state.options.gate)
        if self.judged_by is not None and self.update:
            # The records keep the keys the baseline knows this run's dumps by.
            key = state.baseline.recorded_key if state.baseline is not None else str
            recorded = Baseline.read(self.judged_by) if (self.judged_by / FILE_NAME).exists() else Baseline()
            env = environment([(key(dump), path) for dump, path in self._dumps()], device, versions)
            recorded.environment = {**env, "dumps": {**recorded.environment.get("dumps", {}), **env["dumps"]}}
            recorded.calls.update({(key(dump), call): metrics for (dump, call), metrics in self.current.items()})
            self._said("updated", recorded, recorded.write(self.judged_by))

    def _said(self, how: str, baseline: Baseline, path: Path) -> None:
        """The summary's line of a baseline file written: where (as pytest prints paths)
        and what it holds."""
        kernels = sum(metrics.standard == KERNEL_STANDARD for metrics in baseline.calls.values())
        dumps = len(baseline.environment.get("dumps", {}))
        self.saved.append(
            f"baseline {how}: {bestrelpath(self.config.invocation_params.dir, path)} "
            f"({len(baseline.calls) - kernels} calls, {kernels} kernels of {dumps} dump{'s' if dumps != 1 else ''})"
        )

    def _warn_nothing_compared(self, session: pytest.Session, gate: bool) -> None:
        """A dump whose calls ran and none was compared: a warning in pytest's warnings
        summary and final count (the summary's section says it too); under --msprobe-gate
        the run fails with GATE_EXIT, unless it already ended otherwise (interrupted)."""
        reasons = self.comparison().uncompared
        for dump, reason in reasons.items():
            message = pytest.PytestWarning(describe_nothing_compared(reason, gate).split(": ", 1)[1])
            recorded = warnings.WarningMessage(message, type(message), dump, 0)
            self.config.hook.pytest_warning_recorded.call_historic(
                kwargs={"warning_message": recorded, "when": "runtest", "nodeid": dump, "location": None}
            )
        if gate and reasons and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            session.exitstatus = GATE_EXIT

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside KernelPlugin's wrapper: after the kernels' tests
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """Under --msprobe-gate a kernel that regressed is a failing test, reported after
        the calls and the kernels' own tests (plugin/kernels.py's way: every call's record
        is needed)."""
        result = yield
        state = session_state(self.config)
        if not state.options.gate or hasattr(self.config, "workerinput") or session.shouldfail or session.shouldstop:
            return result
        kernels = [change for change in self.comparison().kernels if change.kind == "regression"]
        session.testscollected += len(kernels)
        for change in kernels:
            text = f"kernel regression against the baseline (--msprobe-gate): {change.describe()}"
            report_test(self.config, ReportedTest(change.dump, f"{change.name}.regression", text, failed=True))
        return result

    def comparison(self) -> RunComparison:
        """This run's calls against the baseline (judge/gate/upgrade.py), once."""
        if self._comparison is None:
            counterparts = session_state(self.config).counterparts()
            assert counterparts is not None  # only asked where a baseline is given
            paths = dict(self._dumps())
            calls = {
                (dump or "", call): metrics
                for (dump, call), metrics in self.current.items()
                if metrics.standard != KERNEL_STANDARD
            }
            indexes = {key: functools.partial(read_index, path) for key, path in paths.items()}
            self._comparison = compare_run(counterparts, calls, indexes)
        return self._comparison

    @pytest.hookimpl(tryfirst=True)  # its section before the report plugin's msprobe summary
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        recorded = session_state(self.config).baseline
        if recorded is None or hasattr(self.config, "workerinput"):
            return
        terminalreporter.section("msprobe baseline")
        gate = session_state(self.config).options.gate
        lines = summary_lines(self.comparison(), self.update, gate) + kernel_lines(self._kernels(), recorded)
        for line in lines:
            loud = line.startswith(("WARNING", "ERROR"))
            terminalreporter.write_line(
                line, yellow=line.startswith("WARNING"), red=line.startswith("ERROR"), bold=loud
            )

    def _dumps(self) -> list[tuple[str, Path]]:
        rootpath = self.config.rootpath
        return [(bestrelpath(rootpath, path), path) for path in options.of(self.config).dump]


def summary_lines(comparison: RunComparison, updated: bool, gate: bool = False) -> list[str]:
    counts = comparison.counts()
    lines = list(comparison.notes)
    if not updated:
        lines += [describe_nothing_compared(reason, gate) for reason in comparison.uncompared.values()]
    lines.append(
        ", ".join(f"{counts[kind]} {kind}" for kind in ("regression", "improvement", "unchanged", "new", "vanished"))
        + (f", {counts['not compared']} not compared (skipped before or now)" if counts["not compared"] else "")
        + (" (baseline updated with this run)" if updated else "")
    )
    regressions = comparison.regressions()
    for change in regressions[:SHOWN_REGRESSIONS]:
        lines.append(f"  regression {change.describe()}")
    if len(regressions) > SHOWN_REGRESSIONS:
        lines.append(f"  ... and {len(regressions) - SHOWN_REGRESSIONS} more regressions")
    if comparison.kernels:
        worse = sum(change.kind == "regression" for change in comparison.kernels)
        lines.append(
            f"kernels of the paired dumps: {worse} regressed of {len(comparison.kernels)} compared (their paired calls pooled)"
        )
    lines += [f"  vanished {name}" for name in comparison.vanished[:SHOWN_REGRESSIONS]]
    return lines


def describe_nothing_compared(reason: str, gate: bool) -> str:
    """The one line of a dump of which nothing was compared: under --msprobe-gate an
    error that sets the exit status (GATE_EXIT), else a warning."""
    if gate:
        return (
            f"ERROR: --msprobe-gate: {reason}: exit status {int(GATE_EXIT)} ({GATE_EXIT.name.lower().replace('_', ' ')}); "
            "is --msprobe-baseline the baseline recorded with this model's dump?"
        )
    return f"WARNING: {reason}"


def kernel_lines(kernels: dict[tuple[str | None, str], CallMetrics], recorded: Baseline) -> list[str]:
    """Each kernel of the run against its recorded verdict: worse where its status is."""
    worse, compared = [], 0
    for (key, name), metrics in sorted(kernels.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        dump = key or ""
        found = recorded.kernel(dump, name)
        if found is None:
            continue
        compared += 1
        recorded_in, then = found
        if compare(metrics, then, name).kind == "regression":
            where = "" if recorded_in == recorded.recorded_key(dump) else f" (recorded in {recorded_in})"
            worse.append(f"  kernel worse {dump}::{name}: {then.status} -> {metrics.status}{where}")
    if not kernels:
        return []
    return [
        f"kernels: {len(worse)} worse of {compared} compared with the baseline ({len(kernels) - compared} not in it)",
        *worse,
    ]
