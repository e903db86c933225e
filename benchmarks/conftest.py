"""The timing benchmarks' shared setup: the sizes (the default run takes minutes, the
full one the sizes benchmarks/RESULTS.md reports), msprobe's Python for the comparisons,
the shipped dumps, and fresh plugin processes timed as a user starts them.

    pytest benchmarks --benchmark-only                 # the default sizes
    pytest benchmarks --benchmark-only --bench-full    # the sizes of RESULTS.md

Each benchmark's machine load (the load average before and after) goes into its
extra_info: other work on the machine slows everything measured here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.support import COUNTS, SHIPPED, SUMMARY, PluginRun, Sizes, load, plugin_command, timed_process


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("msprobe benchmarks")
    group.addoption(
        "--bench-full",
        action="store_true",
        default=os.environ.get("MSPROBE_BENCH_FULL", "") not in ("", "0"),
        help="the large sizes benchmarks/RESULTS.md reports (minutes to an hour); env MSPROBE_BENCH_FULL=1",
    )
    group.addoption(
        "--bench-dump",
        type=Path,
        default=os.environ.get("MSPROBE_BENCH_DUMP") or None,
        help="the dump.json the whole-run benchmarks replay (default: the shipped "
        "tests/dumps/models/transformer12_tensor_fp32); env MSPROBE_BENCH_DUMP",
    )


@pytest.fixture(scope="session")
def sizes(pytestconfig: pytest.Config) -> Sizes:
    return Sizes(bool(pytestconfig.getoption("--bench-full")))


@pytest.fixture(scope="session")
def bench_dump(pytestconfig: pytest.Config) -> Path:
    given: Path | None = pytestconfig.getoption("--bench-dump")
    if given is None:
        return SHIPPED
    if not given.is_file():
        raise pytest.UsageError(f"--bench-dump {given}: no such dump.json; give the path of a dump's dump.json")
    return given.resolve()


@pytest.fixture(scope="session")
def msprobe_python() -> Path:
    """msprobe's own Python (a venv with torch and mindstudio-probe), for the comparisons."""
    value = os.environ.get("MSPROBE_PYTHON", "")
    if not value:
        pytest.skip("MSPROBE_PYTHON is unset: set it to the python of a venv with mindstudio-probe to compare")
    if not Path(value).is_file():
        pytest.skip(f"MSPROBE_PYTHON={value} does not exist")
    return Path(value)


@pytest.fixture(scope="session")
def dumps_cache(pytestconfig: pytest.Config) -> Path:
    """Where dumps too large for git are made once and kept (beside pytest-benchmark's
    saved runs, out of the tree's tracked files)."""
    folder = pytestconfig.rootpath / ".benchmarks" / "dumps"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def _record_load(request: pytest.FixtureRequest) -> Iterator[None]:
    if "benchmark" not in request.fixturenames:
        yield
        return
    extra = request.getfixturevalue("benchmark").extra_info
    before = load()
    yield
    extra["load_before"], extra["load_after"] = before, load()


@pytest.fixture(scope="session")
def run_plugin(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., PluginRun]:
    """Run the plugin on a dump in a fresh process; every process gets a private
    temporary root (an xdist run otherwise first deletes the oldest of the user's
    earlier pytest temporary folders: seconds where they are large)."""
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(tmp_path_factory.mktemp("temproot"))}

    def run(dump: Path, out: Path, *extra: str) -> PluginRun:
        root = dump if dump.is_dir() else dump.parent
        wall, stdout = timed_process(plugin_command(dump, out, *extra), root, env)
        found = SUMMARY.search(stdout)
        if found is None:
            raise AssertionError(f"no summary line in the plugin's output:\n{stdout[-3000:]}")
        last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
        counts = {kind: int(number) for number, kind in COUNTS.findall(last)}
        return PluginRun(wall, float(found.group(2)), int(found.group(1)), counts, stdout)

    return run
