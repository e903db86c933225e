"""The pytest layer: the entry point's hooks here (options, markers, collection, the
terminal summary), thin; the work is in the stages they call. Beside them:
`option_table` (the flags and ini options, one table), `options` (their values, read
once into one typed value, every path resolved by one rule), `state` (the
session's settings), `items` (the dump file and call items), `hookspecs` (hooks users
implement, and the plugin's own between its parts), `pytest_privates` (the private
APIs of pytest it uses), and one module of
hooks per concern: `reports`, `baselines`, `html_report` (the HTML report), `scale` (isolation,
sharding, ordering), `scripts`, `bug_reports` (a reduced bug report per failing
call), `workers` and `scheduling` (xdist).

May import every stage. The only subpackage that imports pytest. Without a dump option
every hook returns at once and nothing heavy is imported.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from pytest_msprobe.plugin import hookspecs, option_table, options
from pytest_msprobe.plugin.pytest_privates import bestrelpath
from pytest_msprobe.plugin.state import STATE_KEY, SessionState

HYPOTHESIS_PLUGIN = "hypothesispytest"  # hypothesis's pytest11 entry point

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
    option_table.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    chosen = options.read(config)
    if chosen is None:
        return
    state = SessionState(config, chosen)
    config.stash[STATE_KEY] = state
    config.add_cleanup(_thaw)  # added before pytest's unraisable-exception plugin adds its own: runs after it
    state.check()  # an option (or, where calls run, a device) that cannot work stops the run here, once
    from pytest_msprobe.plugin.kernels import kernel_selection

    kernel_selection(config)  # before the plugins, which read it
    plugins = _dump_plugins(config, chosen)
    for name in REGISTERED:
        if name in plugins:
            config.pluginmanager.register(plugins[name], name)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # The user named no paths: run the dump's tests only, not the repository's.
        config.args[:] = [str(path) for path in chosen.dump]


# The plugins a dump brings, in the order they are registered. pluggy calls the hooks of
# the later-registered first, so no order between them is left to this one: where one
# hook must run before another's it says so (tryfirst/trylast, or a hook of ours that
# one plugin calls when the other may go on: hookspecs.py). tests/plugin/test_hook_order.py
# registers them in the reverse order and expects the same run.
REGISTERED = (
    "msprobe-report",
    "msprobe-html",
    "msprobe-kernels",
    "msprobe-baseline",
    "pytest_msprobe.plugin.scripts",
    "pytest_msprobe.plugin.bug_reports",
    "pytest_msprobe.plugin.scale",
)


def _dump_plugins(config: pytest.Config, chosen: options.Options) -> dict[str, object]:
    """Each plugin of REGISTERED this run uses, by name (imported only when a dump is given)."""
    from pytest_msprobe.plugin import baselines, bug_reports, kernels, reports, scale, scripts

    report_plugin = reports.ReportPlugin(config)
    plugins: dict[str, object] = {
        "msprobe-report": report_plugin,
        "msprobe-kernels": kernels.KernelPlugin(config, report_plugin),
        "msprobe-baseline": baselines.BaselinePlugin(config, report_plugin),
        scripts.__name__: scripts,
        bug_reports.__name__: bug_reports,
        scale.__name__: scale,
    }
    if chosen.html is not None:
        from pytest_msprobe.plugin import html_report

        plugins["msprobe-html"] = html_report.HtmlPlugin(config, report_plugin)
    return plugins


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(STATE_KEY, None)
    if state is None or file_path not in state.options.dump:
        return None
    from pytest_msprobe.plugin.items import DumpFile

    # Named after its path from the rootdir, even outside it, so that `--lf`, `-k`
    # and `--deselect` see `<path to dump.json>::<call name>`.
    nodeid = bestrelpath(parent.config.rootpath, file_path)
    return DumpFile.from_parent(parent, path=file_path, nodeid=nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is not None:
        from pytest_msprobe.plugin.items import CallItem, UncheckedDump

        state.only_dump_calls = all(isinstance(item, (CallItem, UncheckedDump)) for item in items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    config = node.config  # type: ignore[attr-defined]  # xdist's WorkerController
    state = config.stash.get(STATE_KEY, None)
    if state is not None:
        prefixes = tuple(f"{bestrelpath(config.rootpath, dump)}::" for dump in state.options.dump)
        state.only_dump_calls = state.only_dump_calls is not False and all(
            nodeid.startswith(prefixes) for nodeid in ids
        )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """What a session of dump calls alone leaves out at its end.

    Hypothesis's summary, where hypothesis was never imported: there are no hypothesis
    statistics, failing examples or observations to summarize, and hypothesis's pytest
    plugin would still import hypothesis to find that out (0.5-1 s, in every process of
    the run).

    pytest's final garbage collections (two full ones at unconfigure, to report
    exceptions raised in the finalizers of the session's garbage): with torch loaded a
    full collection traverses torch's objects (0.08 s each here). The objects that
    exist now are frozen (gc.freeze) until the session's last cleanup (_thaw), so that
    those collections see only what the session's end makes; the process's objects are
    collected as before afterwards."""
    state = session.config.stash.get(STATE_KEY, None)
    if state is None or not state.only_dump_calls:
        return
    if "hypothesis" not in sys.modules:
        manager = session.config.pluginmanager
        if manager.get_plugin(HYPOTHESIS_PLUGIN) is not None:
            manager.unregister(name=HYPOTHESIS_PLUGIN)
    if state.runs_calls and not hasattr(session.config, "workerinput"):  # a worker freezes for good (plugin.scale)
        gc.freeze()
        _FROZEN.append(True)


_FROZEN: list[bool] = []


def _thaw() -> None:
    """The session's end is over: what pytest_sessionfinish froze is collectable again."""
    if _FROZEN:
        _FROZEN.clear()
        gc.unfreeze()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or hasattr(config, "workerinput"):
        return
    from pytest_msprobe.plugin.items import dump_lines

    for line in dump_lines(config, state.options.dump):
        terminalreporter.write_line(line)
