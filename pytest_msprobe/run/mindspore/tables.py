"""The MindSpore->torch table (`api_tables/mindspore.toml`) and the install check.

Kept apart from `replay` because collection uses it: it imports neither
torch nor MindSpore, so a PyTorch user pays nothing and a MindSpore dump without
MindSpore installed is one clear failure for the dump, not one per call.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.resources
import importlib.util
import tomllib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_msprobe.errors import DumpError

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Json

INSTALL_HINT = "pip install 'pytest-msprobe[mindspore]'"
TABLE_FILE = "api_tables/mindspore.toml"
_ENTRY_KEYS = frozenset({"torch", "rename", "params", "defaults"})


@dataclass(frozen=True)
class TwinSpec:
    """How one MindSpore API is benched: its torch twin and the argument translation."""

    torch: str | None
    rename: dict[str, str] = field(default_factory=dict)
    params: tuple[str, ...] = ()
    defaults: dict[str, Json] = field(default_factory=dict)


@dataclass(frozen=True)
class MindsporeTable:
    owners: dict[str, str]  # api type -> where its names live ("mindspore.mint")
    apis: dict[str, dict[str, TwinSpec]]  # api type -> MindSpore name -> twin
    unreplayable: dict[str, str]  # api type -> why it is skipped
    random: frozenset[str]


@functools.cache
def mindspore_table() -> MindsporeTable:
    text = importlib.resources.files("pytest_msprobe.run").joinpath(TABLE_FILE).read_text("utf-8")
    return parse_table(tomllib.loads(text))


def parse_table(data: dict[str, Json]) -> MindsporeTable:
    """Check the table's shape, so a bad edit fails the table tests, not a user's run."""
    special = {"unreplayable", "random"}
    owners: dict[str, str] = {}
    apis: dict[str, dict[str, TwinSpec]] = {}
    for api_type, section in data.items():
        if api_type in special:
            continue
        owners[api_type] = section["owner"]
        apis[api_type] = {name: _twin(f"{api_type}.{name}", entry) for name, entry in section["apis"].items()}
    return MindsporeTable(owners, apis, dict(data["unreplayable"]), frozenset(data["random"]["names"]))


def _twin(where: str, entry: dict[str, Json]) -> TwinSpec:
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise ValueError(f"{TABLE_FILE} {where}: unknown keys {sorted(unknown)} (allowed: {sorted(_ENTRY_KEYS)})")
    torch_path = entry.get("torch")
    if torch_path is not None and not torch_path.startswith("torch."):
        raise ValueError(f"{TABLE_FILE} {where}: torch = {torch_path!r} is not a path under torch")
    spec = TwinSpec(
        torch_path, dict(entry.get("rename", {})), tuple(entry.get("params", ())), dict(entry.get("defaults", {}))
    )
    if spec.defaults and not spec.params:
        raise ValueError(
            f"{TABLE_FILE} {where}: defaults need params, to tell whether the argument was passed by position"
        )
    if (spec.rename or spec.params or spec.defaults) and torch_path is None:
        raise ValueError(f"{TABLE_FILE} {where}: argument translation without a torch twin")
    return spec


def require_mindspore() -> None:
    """Raise DumpError, telling what to install, when a MindSpore dump cannot be replayed
    here. Looks at installed metadata only: nothing is imported. A folder named
    `mindspore` on the path (a dump folder beside `python -m pytest`) is a namespace
    package to Python, not MindSpore."""
    spec = importlib.util.find_spec("mindspore")
    if spec is None or spec.origin is None:
        raise DumpError(f"this is a MindSpore dump and MindSpore is not installed: {INSTALL_HINT}")
    numpy_version = importlib.metadata.version("numpy")
    if int(numpy_version.split(".")[0]) >= 2:
        raise DumpError(
            f"MindSpore's core is built against numpy 1.x and some of its Tensor operations fail "
            f"under numpy {numpy_version}: {INSTALL_HINT} (it pins 'numpy<2')"
        )
