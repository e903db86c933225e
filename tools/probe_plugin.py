"""A pytest plugin for the scale benchmarks: each process (controller, every xdist
worker) appends one JSON line to $MSPROBE_BENCH_PROBE with its collection time, its
RSS once collected, the time its tests took and how many it ran.

    PYTHONPATH=tools MSPROBE_BENCH_PROBE=probe.jsonl pytest -p probe_plugin ...
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

_marks: dict[str, Any] = {}


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    _marks["collect_start"] = time.perf_counter()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems() -> None:
    """The items exist; selection (-k, our shards and ordering) comes next."""
    _marks["items_built"] = time.perf_counter()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _marks["collected"] = time.perf_counter()
    _marks["rss_collected_mb"] = _rss_mb()
    _marks["items"] = len(session.items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _marks["ran"] = _marks.get("ran", 0) + 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("MSPROBE_BENCH_PROBE")
    if not path:
        return
    now = time.perf_counter()
    start, collected, built = _marks.get("collect_start"), _marks.get("collected"), _marks.get("items_built")
    line = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "collect_s": collected - start if start and collected else None,
        "items_built_s": built - start if start and built else None,
        "rss_collected_mb": _marks.get("rss_collected_mb"),
        "items": _marks.get("items"),
        "run_s": now - collected if collected else None,
        "ran": _marks.get("ran", 0),
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
