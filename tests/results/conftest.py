"""Fixtures of the results tests: the headless Chromium that the HTML report's pages open
in, for test_html.py and test_html_layout.py alike (where it or playwright is missing,
their browser tests skip and say which)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# headless, and nothing a sandboxed CI machine lacks (a GPU, a network, a user namespace)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def chromium() -> str | None:
    named = os.environ.get("MSPROBE_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'"
    )
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (apt-get install chromium, or MSPROBE_CHROMIUM=/path/to/chrome)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
