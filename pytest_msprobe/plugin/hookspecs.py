"""Hooks users implement in a conftest.py to extend the plugin without editing it."""

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
