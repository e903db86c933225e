"""--msprobe-html=FILE: the hooks of the HTML report (pytest_msprobe/results/html_page.py).

Where the test runs, the check keeps a sample of elements of each failing or warning
output (of every output with --msprobe-html-all: Settings.sample_statuses, from
Options.sample_statuses), which travels in the ResultRecord to the single writer's journal like the
rest of the record. When the session ends, after the result files are closed, the
controller (or the lone process) writes the report from that journal, and the terminal
summary names it. Without the option no sample is taken and this plugin is not
registered: the run costs what it did.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_msprobe.plugin import options
from pytest_msprobe.plugin.pytest_privates import bestrelpath
from pytest_msprobe.plugin.state import session_state

if TYPE_CHECKING:
    from pytest_msprobe.plugin.reports import ReportPlugin

TITLE_DUMPS = 3


class HtmlPlugin:
    def __init__(self, config: pytest.Config, reports: ReportPlugin) -> None:
        self.config = config
        self.reports = reports  # its writer holds the run's files
        chosen = options.of(config)
        assert chosen.html is not None  # registered only with --msprobe-html
        self.target, self.scripts, self.baseline_folder = chosen.html, chosen.scripts, chosen.reference_label
        self.written: Path | None = None
        self.problem = ""

    @pytest.hookimpl(trylast=True)  # after the report plugin closed the result files and recorded the session
    def pytest_sessionfinish(self) -> None:
        from pytest_msprobe.results.html_page import ReportContext, write_report
        from pytest_msprobe.results.run_files import ResultFilesError, read_journal, read_sessions

        writer = self.reports.writer
        if writer is None:  # an xdist worker: the controller writes the report
            return
        recorded = session_state(self.config).baseline
        baselines = ((str(self.baseline_folder), recorded),) if recorded is not None else ()
        compared = self.config.pluginmanager.get_plugin("msprobe-baseline")
        comparison = compared.comparison() if recorded is not None and compared is not None else None
        context = ReportContext(self._title(), tuple(read_sessions(writer.files)), self.scripts, baselines, comparison)
        try:
            self.written = write_report(read_journal(writer.files.journal), self.target, context)
        except (OSError, ResultFilesError) as exc:  # the results are on disk; the report can be rebuilt from them
            self.problem = f"{type(exc).__name__}: {exc}"

    @pytest.hookimpl(trylast=True)  # after the msprobe summary
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.written is not None:
            terminalreporter.write_line(f"msprobe html report: {self.written}")
        elif self.problem:
            terminalreporter.write_line(
                f"msprobe html report: not written ({self.problem}); rebuild it with "
                # problem is set only where the writer wrote (pytest_sessionfinish)
                f"msprobe-report {self.reports.writer.files.folder} -o {self.target}",  # type: ignore[union-attr]
                red=True,
            )

    def _title(self) -> str:
        dumps = [bestrelpath(self.config.rootpath, path) for path in options.of(self.config).dump]
        more = f" and {len(dumps) - TITLE_DUMPS} more" if len(dumps) > TITLE_DUMPS else ""
        return "pytest-msprobe: " + ", ".join(dumps[:TITLE_DUMPS]) + more
