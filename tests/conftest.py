"""The tests' process imports every module of the plugin, and the matplotlib modules its
report draws with, once, before any test runs.

pytester puts sys.modules back after each test as it was when the test began, dropping
the modules first imported during it. A dropped module imported again by a later test
defines new classes, while the modules that stayed still hold the old ones (the plot
layouts `functools.cache` keeps, the standards' names imported on first use), and
isinstance across the two copies fails: matplotlib 3.11's normalize_kwargs ("type object
'Text' has no attribute 'items'") and PassResult.of ("this pass was not asked for
ThresholdCounts"), in whichever test first ran after another had imported them. Imported
here, each module has one copy for the whole session, whatever the tests' order.

Only where pytester is (the repository's own runs, pyproject's `-p pytester`): pytest
also loads this file when a user names a dump under tests/ (bench_percall.py's default),
and their run must not pay for importing every module.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

PACKAGES = ("pytest_msprobe", "pytest_msprobe.standards", "pytest_msprobe.bench_functions")
# what results/plots.py imports inside its functions, and the SVG backend Figure.savefig loads
MATPLOTLIB = ("matplotlib.figure", "matplotlib.ticker", "matplotlib.colorbar", "matplotlib.backends.backend_svg")


def _import_all() -> None:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(module.name)
    for name in MATPLOTLIB:
        importlib.import_module(name)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.has_plugin("pytester"):
        _import_all()
