"""Hooks users implement in a conftest.py to extend the plugin without editing it, and
the plugin's own hooks between its parts, where one part must act once another is done
(an order pluggy's registration order would otherwise decide: plugin/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # named in full: the API reference links each to its one class
    import pytest_msprobe.bench_functions
    import pytest_msprobe.judge.verdict.record
    import pytest_msprobe.standards

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_msprobe_register_standards(registry: pytest_msprobe.standards.Registry) -> None:
    """Route APIs to standards or register a standard of your own before any call is
    judged: ``registry.set_api_standard("my_op", "ulp")``,
    ``registry.register_standard("mine", function)``.

    Parameters
    ----------
    registry
        The session's standards registry: the shipped tables with the file of
        ``--msprobe-standards`` loaded over them. What it holds when the hooks return
        judges every call; a route to a standard it lacks stops the run with a usage
        error that names it.
    """


@hookspec
def pytest_msprobe_register_bench_functions(registry: pytest_msprobe.bench_functions.Registry) -> None:
    """Register CPU references for custom operators (``NPU.<name>`` calls):
    ``registry.register("my_fused_op", reference_function)``.

    Parameters
    ----------
    registry
        The process's registry of CPU references (``bench_functions.default_registry``):
        an ``NPU.<name>`` call is replayed on the bench with what it holds for
        ``<name>`` once the hooks return.
    """


@hookspec
def pytest_msprobe_result(nodeid: str, record: pytest_msprobe.judge.verdict.record.ResultRecord) -> None:
    """A call's result as the single writer (the xdist controller, or the lone process)
    took it off the call's report into the result files: the baseline plugin keeps its
    metrics.

    Parameters
    ----------
    nodeid
        The call's test: ``<dump path>::<call>``.
    record
        The call's ResultRecord: its status, verdict per output, metrics and message,
        as the result files hold it.
    """
