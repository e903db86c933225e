"""The repository's studies and tools as modules, for the tests that check their parts:
they are scripts run by path (`python studies/real_models.py`), not a package, and
loading one by its path leaves sys.path as it was.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The script at `path` imported once as module `name` (default: its file's stem);
    registered in sys.modules, where its dataclasses look their module up."""
    name = name or path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
