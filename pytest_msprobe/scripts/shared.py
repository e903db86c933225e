"""The judging library a standalone script runs: the installed pytest-msprobe, or its
copy `_msprobe_judge.py` written once beside the scripts.

A script must judge its call with the very code its test used, yet stay small enough to
paste into a kernel bug report: so that code is never copied into a script. A machine
with pytest-msprobe installed runs it from there; a bare machine with torch alone finds
it in `_msprobe_judge.py`, one file per scripts folder that carries this package's
stages (renamed to the private package `_msprobe_support`) and unpacks them into a
temporary folder when a script imports it. Both are named by one identity, the
package's version and a digest of the files copied: a script detects a library that
is not the one it was written with (another release, or an edited checkout) and says
that its verdict may then differ.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import re
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_msprobe.scripts.template import SHARED_MODULE

if TYPE_CHECKING:
    from types import ModuleType

SHARED_FILE = "_msprobe_judge.py"
SUPPORT_PACKAGE = "_msprobe_support"

# What the library holds: (package, path inside the support package, file patterns).
# Its root __init__.py is SUPPORT_INIT (the real one describes every stage).
LIBRARY = (
    ("pytest_msprobe", "", ("errors.py", "private_apis.py")),
    ("pytest_msprobe.dump", "dump", ("*.py",)),
    ("pytest_msprobe.run", "run", ("*.py", "api_tables/*.toml")),
    ("pytest_msprobe.run.mindspore", "run/mindspore", ("*.py",)),
    ("pytest_msprobe.judge", "judge", ("*.py", "*/*.py")),
    ("pytest_msprobe.scripts", "scripts", ("__init__.py", "runtime.py")),
    ("pytest_msprobe.standards", "standards", ("*.py", "tables/*.csv")),
    ("pytest_msprobe.bench_functions", "bench_functions", ("*.py",)),
)
SUPPORT_INIT = '"""pytest-msprobe\'s stages that standalone scripts run, unpacked from _msprobe_judge.py."""\n'


@cache
def library_files() -> dict[str, str]:
    """Path inside the support package -> text, read from wherever pytest-msprobe is
    installed (cached: one scripts folder is written from one installation)."""
    files = {"__init__.py": SUPPORT_INIT}
    for package, prefix, patterns in LIBRARY:
        module_file = importlib.import_module(package).__file__
        assert module_file is not None, package  # a package on disk, never a namespace package
        root = Path(module_file).parent
        for pattern in patterns:
            for path in sorted(root.glob(pattern)):
                relative = "/".join(filter(None, (prefix, path.relative_to(root).as_posix())))
                files[relative] = path.read_text("utf-8")
    return files


@cache
def identity() -> str:
    """`pytest-msprobe <version> (library <digest>)`: what a script was written with."""
    digest = hashlib.sha256()
    for relative, text in sorted(library_files().items()):
        digest.update(f"{relative}\0{text}\0".encode())
    return f"pytest-msprobe {version()} (library {digest.hexdigest()[:12]})"


def version() -> str:
    try:
        return importlib.metadata.version("pytest-msprobe")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write_shared(folder: Path) -> Path:
    """Write `folder/_msprobe_judge.py` unless the same library is there already (its
    first line names the identity). Written to a temporary name and renamed, so that
    xdist workers writing scripts into one folder never leave a half-written file."""
    path = folder / SHARED_FILE
    text = shared_text()
    if path.is_file() and _first_line(path) == text.split("\n", 1)[0]:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".msprobe-judge-", suffix=".py", dir=folder)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, 0o644)  # mkstemp's file is its owner's alone; the scripts are not
    os.replace(temporary, path)
    return path


@cache
def shared_text() -> str:
    renamed = {
        relative: re.sub(r"\bpytest_msprobe\b", SUPPORT_PACKAGE, text) for relative, text in library_files().items()
    }
    files = "\n".join(f"    {relative!r}: {text_literal(text)}," for relative, text in renamed.items())
    return SHARED_MODULE.substitute(identity=repr(identity()), package=repr(SUPPORT_PACKAGE), files=files)


def _first_line(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as handle:
        return handle.readline().rstrip("\n")


def text_literal(text: str) -> str:
    """A raw triple-quoted literal where the text allows one (readable), else repr:
    text from a dump must never be able to end the literal."""
    if "'''" not in text and not text.endswith(("\\", "'")) and all(c.isprintable() or c in "\n\t" for c in text):
        return f"r'''{text}'''"
    return repr(text)


def runtime_for(expected: str) -> ModuleType:
    """The installed package's script runtime, for a script written with `expected`:
    a note on stderr where this installation is another library."""
    mine = identity()
    if mine != expected:
        print(
            f"note: judged by {mine}, installed here; this script was written with {expected}: "
            "its verdict may differ from the test's",
            file=sys.stderr,
        )
    from pytest_msprobe.scripts import runtime

    return runtime
