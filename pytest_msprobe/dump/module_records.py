"""At levels mix and L0, the module that made a call, from construct.json beside
dump.json and the dump's Module.* records: where the module made that call alone (an
nn.Linear, a convolution, a norm), its backward record holds the call's input gradients
and its parameters' gradients (judge/offline/dumped_run.py reads them before the data flow,
dump/dataflow.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_msprobe.dump.index import MODULE_PREFIXES

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import DumpIndex, Record


@dataclass(frozen=True)
class ModuleRecords:
    """At levels mix and L0: the module that made a call, where it made that call alone
    (an nn.Linear, a convolution, a norm): its forward record, the input gradients of
    its backward record, and its parameters' gradients."""

    name: str  # `Module.<path>.<Class>.forward.<n>`
    forward: Record
    backward: Record | None
    parameters_grad: Record | None


@dataclass(frozen=True)
class _ModuleTree:
    """Which module made each call (construct.json), how many calls and modules each
    module made, and the Module.* records: read once per dump."""

    construct: dict[str, str | None]
    children: dict[str, int]
    data: dict[str, Record]


def _module_tree(index: DumpIndex) -> _ModuleTree:
    construct = _construct(index)
    children: dict[str, int] = {}
    for parent in construct.values():
        if parent is not None:
            children[parent] = children.get(parent, 0) + 1
    return _ModuleTree(construct, children, _module_data(index))


def _construct(index: DumpIndex) -> dict[str, str | None]:
    """construct.json beside dump.json: call or module -> the module that made it."""
    path = index.path.parent / "construct.json"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}  # absent or unreadable: no module evidence, the data flow still holds
    if not isinstance(loaded, dict):
        return {}
    return {
        key: value
        for key, value in loaded.items()
        if isinstance(key, str) and (value is None or isinstance(value, str))
    }


def _module_data(index: DumpIndex) -> dict[str, Record]:
    """The Module.* records of dump.json (the index keeps API calls only)."""
    try:
        data = json.loads(index.path.read_bytes()).get("data", {})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return {}
    return {key: value for key, value in data.items() if key.startswith(MODULE_PREFIXES) and isinstance(value, dict)}


def module_of(index: DumpIndex, forward_call: str) -> ModuleRecords | None:
    """The module records of a forward call the module made alone; None at level L1,
    without construct.json, or where the module made other calls too (its gradients
    are then not this call's)."""
    if index.modules == 0:
        return None
    tree = index.derive(_ModuleTree, _module_tree)
    construct, children, data = tree.construct, tree.children, tree.data
    parent = construct.get(forward_call)
    if parent is None or children.get(parent) != 1 or parent not in data or ".forward." not in parent:
        return None
    stem, number = parent.rsplit(".forward.", 1)
    return ModuleRecords(
        parent, data[parent], data.get(f"{stem}.backward.{number}"), data.get(f"{stem}.parameters_grad.{number}")
    )
