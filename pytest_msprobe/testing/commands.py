"""The plugin's command line as the studies and benchmarks run it: one spelling, so that
a harness's runs differ from each other only in what they pass on purpose.
"""

from __future__ import annotations

import sys
from pathlib import Path


def plugin_command(dump: Path, out: Path, *extra: str) -> list[str]:
    """The plugin's run of one dump on the CPU in a process of its own (this Python's),
    its results under `out`, with `extra` options after the common ones."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--msprobe-dump={dump}",
        "--msprobe-device=cpu",
        f"--msprobe-out={out}",
        *extra,
    ]
