"""The timing benchmarks (benchmarks/, pytest-benchmark) collect and run: every
benchmark module collects without an error, with this repository's configuration
(testpaths, addopts) in effect, and the quickest benchmarks run once with
--benchmark-disable, as `pytest benchmarks --benchmark-only` would run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytest_benchmark", reason="the benchmarks need pytest-benchmark (the bench or dev extra)")

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def pytest_in_root(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def collection_problems(output: str, modules: list[str]) -> list[str]:
    """What a `--collect-only -q` run of the suite got wrong: errors, and modules that
    collected no benchmark."""
    problems = [line for line in output.splitlines() if line.startswith("ERROR") or " error" in line]
    collected = {line.split("::", 1)[0] for line in output.splitlines() if "::" in line}
    return problems + [f"{module}: no benchmark collected" for module in modules if module not in collected]


def benchmark_modules() -> list[str]:
    return sorted(f"benchmarks/{path.name}" for path in BENCHMARKS.glob("test_*.py"))


def test_every_benchmark_collects() -> None:
    done = pytest_in_root("benchmarks", "--collect-only", "-q")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not collection_problems(done.stdout, benchmark_modules()), done.stdout[-3000:]


def test_collection_problems_are_found() -> None:
    modules = ["benchmarks/test_a.py", "benchmarks/test_b.py"]
    output = "benchmarks/test_a.py::test_x\nERROR benchmarks/test_b.py - SyntaxError\n1 test collected, 1 error in 0.1s"
    assert collection_problems(output, modules) == [
        "ERROR benchmarks/test_b.py - SyntaxError",
        "1 test collected, 1 error in 0.1s",
        "benchmarks/test_b.py: no benchmark collected",
    ]
    assert collection_problems("benchmarks/test_a.py::test_x\nbenchmarks/test_b.py::test_y\n", modules) == []


def test_the_quickest_benchmarks_run() -> None:
    done = pytest_in_root(
        "benchmarks/test_baseline.py", "benchmarks/test_standards.py::test_tiny", "--benchmark-disable", "-q"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\b8 passed\b", done.stdout), done.stdout[-3000:]


def test_the_suite_leaves_the_test_suite_alone() -> None:
    """`pytest benchmarks` collects benchmarks only, and `pytest` (testpaths) no benchmark."""
    done = pytest_in_root("--collect-only", "-q", "tests/repository/test_benchmark_suite.py")
    assert "benchmarks/" not in done.stdout, done.stdout[-2000:]
