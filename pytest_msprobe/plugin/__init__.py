"""The pytest layer: the entry point's hooks here (options, markers, collection, the
terminal summary), thin; the work is in the stages they call. Beside them: `options`
(the flags and ini options, one table), `state` (the session's settings), `items`
(the dump file and call items), `hookspecs` (hooks users implement), and one module of
hooks per concern: `reports`, `baselines`, `html` (the HTML report), `scale` (isolation,
sharding, ordering), `scripts`, `workers` and `scheduling` (xdist).

May import every stage. The only subpackage that imports pytest. Without a dump option
every hook returns at once and nothing heavy is imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.pathlib import bestrelpath

from pytest_msprobe.plugin import hookspecs, options
from pytest_msprobe.plugin.state import STATE_KEY, SessionState

MARKERS = (
    "forward: a forward call of an msprobe dump",
    "backward: a backward call of an msprobe dump",
    "api_functional: torch.nn.functional (or mindspore.ops) calls of a dump",
    "api_torch: torch.* calls of a dump",
    "api_tensor: Tensor method calls of a dump",
    "api_npu: torch_npu fused operators of a dump",
    "api_aten: torch.ops.aten calls of a dump",
    "api_vf: torch._VF calls of a dump",
    "api_distributed: communication calls of a dump (always skipped)",
    "api_mint: mindspore.mint calls of a dump",
    "api_mintfunctional: mindspore.mint.nn.functional calls of a dump",
    "api_primitive: MindSpore Primitive entries of a dump (always skipped)",
    "api_jit: MindSpore Jit entries of a dump (always skipped)",
    "explore: the hypothesis search around a dumped call (--msprobe-explore), <call name>.explore",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    dumps = options.dump_files(config)
    if not dumps:
        return
    state = SessionState(config, dumps, bool(options.get(config, "msprobe_strict")))
    config.stash[STATE_KEY] = state
    state.settings()  # a device or option that cannot work stops the run here, once
    options.explore_examples(config)
    from pytest_msprobe.plugin import baselines, reports  # only when a dump is given

    report_plugin = reports.ReportPlugin(config)
    config.pluginmanager.register(report_plugin, "msprobe-report")
    if state.settings().sample_statuses:  # --msprobe-html
        from pytest_msprobe.plugin import html

        config.pluginmanager.register(html.HtmlPlugin(config, report_plugin), "msprobe-html")
    config.pluginmanager.register(baselines.BaselinePlugin(config), "msprobe-baseline")
    config.pluginmanager.import_plugin("pytest_msprobe.plugin.scripts")
    config.pluginmanager.import_plugin("pytest_msprobe.plugin.scale")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # The user named no paths: run the dump's tests only, not the repository's.
        config.args[:] = [str(path) for path in dumps]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(STATE_KEY, None)
    if state is None or file_path not in state.dumps:
        return None
    from pytest_msprobe.plugin.items import DumpFile

    # Named after its path from the rootdir, even outside it, so that `--lf`, `-k`
    # and `--deselect` see `<path to dump.json>::<call name>`.
    nodeid = bestrelpath(parent.config.rootpath, file_path)
    return DumpFile.from_parent(parent, path=file_path, nodeid=nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or hasattr(config, "workerinput"):
        return
    from pytest_msprobe.plugin.items import dump_lines

    for line in dump_lines(config, state.dumps):
        terminalreporter.write_line(line)
