"""Where the modules of pytest-msprobe 0.1's flat layout went, so that a user's
conftest or an older generated script that imports one keeps working, with a
DeprecationWarning that names the new place.

Two kinds of old name: a module whose name is free now (`pytest_msprobe.outcome`) is
found by a finder that hands out the new module under the old name; a module whose
name is a subpackage now (`pytest_msprobe.dump`, `.results`, `.scripts`) answers its
old attributes through the subpackage's `__getattr__` (see `old_attributes`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

PACKAGE = __name__.rpartition(".")[0]  # "pytest_msprobe" (or a script's support package)

# old module (under the package) -> its new place
MOVED_MODULES = {
    "values": "dump.values", "tensors": "dump.tensors", "index_cache": "dump.cache", "filters": "dump.filters",
    "apis": "run.apis", "devices": "run.devices", "replay": "run.replay", "isolation": "run.isolation",
    "mindspore_replay": "run.mindspore.replay", "mindspore_tables": "run.mindspore.tables",
    "call": "judge.call", "offline": "judge.offline", "baseline": "judge.baseline", "outcome": "judge.outcome",
    "report_writer": "results.writer", "report_csv": "results.msprobe_csv", "report_summary": "results.summary",
    "merge": "results.merge", "failed_data": "results.failed_data",
    "script_template": "scripts.template", "script_runtime": "scripts.runtime",
    "options": "plugin.options", "state": "plugin.state", "hooks": "plugin.hookspecs", "nodes": "plugin.items",
    "report_plugin": "plugin.reports", "baseline_plugin": "plugin.baselines", "scale_plugin": "plugin.scale",
    "scripts_plugin": "plugin.scripts", "workers": "plugin.workers", "scheduling": "plugin.scheduling",
}
# old module that is a subpackage's name now -> the module that holds its old contents
OLD_CONTENTS = {"dump": "dump.index", "results": "judge.record", "scripts": "scripts.writer"}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in pytest-msprobe 0.2; import it from there", DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds `pytest_msprobe.<old module>` as its new module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.rpartition(".")
        if package != PACKAGE or old not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"{PACKAGE}.{MOVED_MODULES[old]}"))


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def old_attributes(subpackage: str) -> Callable[[str], Any]:
    """A module `__getattr__` for a subpackage that took an old module's name: the old
    module's attributes, from their new module."""
    old = subpackage.rpartition(".")[2]
    new = f"{PACKAGE}.{OLD_CONTENTS[old]}"

    def __getattr__(name: str) -> Any:
        if name.startswith("__") or importlib.util.find_spec(f"{subpackage}.{name}") is not None:
            raise AttributeError(name)  # a submodule: the import system loads it
        module = importlib.import_module(new)
        if not hasattr(module, name):
            raise AttributeError(f"module {subpackage!r} has no attribute {name!r}")
        _warn(f"{subpackage}.{name}", f"{new}.{name}")
        value = getattr(module, name)
        setattr(sys.modules[subpackage], name, value)  # warned once; later lookups find it
        return value

    return __getattr__
