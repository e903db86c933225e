"""The private APIs of pytest that the plugin uses, in one place, with what the plugin
does with each (`PRIVATE_APIS`, checked by tests/repository/test_compat.py against the installed
pytest).

Why here and not in pytest_msprobe/private_apis.py with torch's and hypothesis's: only the
pytest layer imports pytest (tests/repository/test_package_layout.py), so pytest's privates stay in it.
Why private at all: pytest has no public form of these. `bestrelpath` is how pytest
itself shows a path relative to the rootdir (a `..` where the path lies outside it),
and the plugin's lines sit beside pytest's; `os.path.relpath` differs on a path with
`..` in it, or on another drive. `TerminalRepr` and `TracebackStyle` are the types
pytest's own `Item.repr_failure` is declared with, for type checking only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from _pytest.pathlib import bestrelpath as bestrelpath

from pytest_msprobe.private_apis import PrivateApi

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr as TerminalRepr
    from _pytest._code.code import TracebackStyle as TracebackStyle

PRIVATE_APIS = (
    PrivateApi("_pytest.pathlib.bestrelpath", "pytest", "plugin/: a path in the plugin's lines, as pytest shows paths"),
    PrivateApi(
        "_pytest._code.code.TerminalRepr", "pytest", "plugin/items.py: repr_failure's declared type (type checks only)"
    ),
    PrivateApi(
        "_pytest._code.code.TracebackStyle",
        "pytest",
        "plugin/items.py: repr_failure's declared type (type checks only)",
    ),
)
