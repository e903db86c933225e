"""MindSpore's C core cannot be loaded twice in one process, while pytester's inline
runs (the run_dump fixture) unload every module a run imported: keep MindSpore's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _pytest import pytester


class _KeepMindspore(pytester.SysModulesSnapshot):
    def __init__(self, preserve: Callable[[str], bool] | None = None) -> None:
        super().__init__(
            preserve=lambda name: name.startswith("mindspore") or (preserve is not None and preserve(name))
        )


@pytest.fixture(autouse=True)
def keep_mindspore_loaded(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(pytester, "SysModulesSnapshot", _KeepMindspore)
