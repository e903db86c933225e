"""Hooks users implement in a conftest.py to extend the plugin without editing it, and
the plugin's own hooks between its parts, where one part must act once another is done
(an order pluggy's registration order would otherwise decide: plugin/__init__.py)."""

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_msprobe_register_standards(registry):
    """Route APIs to standards or register a standard of your own before any call is
    judged: ``registry.set_api_standard("my_op", "ulp")``,
    ``registry.register_standard("mine", function)``."""


@hookspec
def pytest_msprobe_register_bench_functions(registry):
    """Register CPU references for custom operators (``NPU.<name>`` calls):
    ``registry.register("my_fused_op", reference_function)``."""


@hookspec
def pytest_msprobe_result(nodeid, record):
    """A call's result (its ResultRecord) as the single writer (the xdist controller, or
    the lone process) took it off the call's report into the result files: the baseline
    plugin keeps its metrics. ``nodeid`` is the call's test (``<dump path>::<call>``)."""
